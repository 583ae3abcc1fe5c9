// Deterministic parameter initialisation: element i of tensor t of unit u gets a value that depends
// only on (seed, unit name, tensor name, i). Each rank computes just its shard, and the values are
// the same whatever the rank count, the tier placement or the thread count.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "runtime/engine/unit_spec.hpp"

namespace strata::runtime {

// Fills out[k] with the initial value of element first_element + k of the tensor.
void init_tensor_range(std::uint64_t seed, std::string_view unit_name, const TensorSpec& tensor,
                       std::uint64_t first_element, std::span<float> out);

}  // namespace strata::runtime
