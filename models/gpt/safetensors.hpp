// safetensors checkpoints of the GPT's parameters: the runtime's reader and writer
// (runtime/checkpoint/safetensors.hpp: strict header parsing, fuzzed, atomic writes) applied to the GPT's
// units, whose tensor names (Hugging Face GPT-2's, docs/gpt.md) are unique across the model.
#pragma once

#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "models/gpt/gpt_spec.hpp"
#include "models/gpt/parameter_store.hpp"
#include "runtime/config/config.hpp"
#include "runtime/checkpoint/safetensors.hpp"

namespace strata::gpt {

using runtime::SafetensorsEntry;
using runtime::SafetensorsError;
using runtime::SafetensorsFile;

// Reads unit `index`'s flat fp32 buffer (UnitSpec::numel elements) for the writer: lets a holder
// that is not a ParameterStore (the Engine, gathering unit by unit) export a checkpoint.
using UnitReader = std::function<std::span<const float>(std::size_t index)>;
// Receives unit `index`'s flat fp32 buffer from the loader, once the whole file has checked out.
using UnitWriter = runtime::UnitWriter;

// Writes every tensor of `units` as `dtype`, in unit order, atomically (temporary + rename).
void save_safetensors(const std::filesystem::path& path, const std::vector<UnitSpec>& units,
                      const UnitReader& read_unit, DType dtype,
                      const std::map<std::string, std::string>& metadata = {});
void save_safetensors(const std::filesystem::path& path, const ParameterStore& params, DType dtype,
                      const std::map<std::string, std::string>& metadata = {});
// Fills every tensor of `params` from the file. A tensor of the model missing from the file, a
// shape that differs from the model's, or a tensor in the file the model does not have (e.g.
// lm_head.weight for a tied model) is a SafetensorsError. `params` is untouched on error.
void load_safetensors(const std::filesystem::path& path, ParameterStore& params);
// The same checks against `units`; then write_unit(u, values) for every unit in order.
void load_safetensors(const std::filesystem::path& path, const std::vector<UnitSpec>& units,
                      const UnitWriter& write_unit);

}  // namespace strata::gpt
