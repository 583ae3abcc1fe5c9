// ParameterStore: every unit's fp32 tensors in plain host vectors, laid out as the unit specs say
// (one flat buffer per unit). It lets the GPT train and be tested without the ZeRO-3 Engine, and
// gives the fine-tuning program a reference to compare the Engine against. The same type holds
// gradients (zero-initialised) for forward_backward().
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "models/gpt/gpt_model.hpp"
#include "models/gpt/gpt_spec.hpp"

namespace strata::gpt {

class ParameterStore {
 public:
  // All zeros.
  explicit ParameterStore(std::vector<UnitSpec> units);
  // Each tensor filled by initialize_tensor(unit, spec, seed, ...): the Engine's initialisation with
  // the same seed gives the same bits.
  static ParameterStore initialized(std::vector<UnitSpec> units, std::uint64_t seed);

  const std::vector<UnitSpec>& units() const { return units_; }
  std::size_t parameter_count() const;

  std::span<float> unit(std::size_t index) { return values_[index]; }
  std::span<const float> unit(std::size_t index) const { return values_[index]; }
  // One span per tensor of the unit, in spec order: what GptModel's unit calls take.
  std::vector<std::span<const float>> views(std::size_t index) const;
  std::vector<std::span<float>> mutable_views(std::size_t index);

  // The tensor called `name` (e.g. "h.0.attn.c_attn.weight"); empty span when there is none.
  std::span<float> find(std::string_view name);
  std::span<const float> find(std::string_view name) const;
  const TensorSpec* find_spec(std::string_view name) const;

  void fill(float value);

 private:
  std::vector<UnitSpec> units_;
  std::vector<std::vector<float>> values_;
};

// The Engine's training loop, run over a ParameterStore: every unit forward, the loss, every unit
// backward into `grads` (same units; overwritten). Returns the mean cross-entropy.
double forward_backward(GptModel& model, const ParameterStore& params, ParameterStore& grads,
                        std::span<const std::int32_t> tokens);
// Forward only: the mean cross-entropy of `tokens`.
double forward_loss(GptModel& model, const ParameterStore& params,
                    std::span<const std::int32_t> tokens);

}  // namespace strata::gpt
