// A Hugging Face model's shapes as the memory plan takes them ([model] of runtime::Config), for
// `strata plan --model DIR` and `strata-finetune --model`: the parameter count from config.json,
// and the largest unit gathered at once. The plan sizes its gather buffers as params / layers, so
// `layers` is set to params / largest unit: the embedding (vocab × hidden) is often larger than a
// decoder layer, and the buffers must hold it. plan_inputs() gives the plan the model's units
// (exact) and, when it computes on a GPU, the device memory its compute takes. Header-only: the
// `strata` program links only strata_llm_model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/units.hpp"
#include "models/decoder/decoder_cuda.hpp"
#include "models/decoder/decoder_model.hpp"
#include "models/decoder/hf_config.hpp"
#include "runtime/config/config.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/plan/partition.hpp"
#include "tiers/device/device.hpp"

namespace strata::llm {

inline std::uint64_t largest_unit_numel(const HfConfig& hf_config) {
  std::uint64_t largest = 1;
  for (const UnitSpec& unit : decoder_units(hf_config)) {
    largest = std::max<std::uint64_t>(largest, unit.numel);
  }
  return largest;
}

inline void describe_model_for_plan(const HfConfig& hf_config, runtime::Config& config) {
  config.model.params = hf_config.parameter_count();
  config.model.layers = static_cast<std::uint32_t>(
      std::max<std::uint64_t>(1, config.model.params / largest_unit_numel(hf_config)));
  config.model.d_model = hf_config.hidden_size;
  config.model.heads = hf_config.num_heads;
  config.model.vocab = hf_config.vocab_size;
  config.model.tied_head = hf_config.tie_word_embeddings;
}

// Device bytes of the model's compute on a GPU at these options: the decoder's activations and
// workspaces, and the trainer's two fp32 gradient slots of the largest unit (llm_trainer.cpp: the
// asynchronous unit calls reduce one unit's gradient while the next is computed).
inline std::uint64_t cuda_compute_bytes(const HfConfig& hf_config, const DecoderOptions& options) {
  return detail::cuda_decoder_activation_bytes(
             hf_config, options, detail::plans_tensor_core_attention(hf_config, options))
             .budgeted +
         2 * round_up(largest_unit_numel(hf_config) * sizeof(float),
                      tiers::kDeviceAllocationGranularity);
}

// The memory plan's inputs for this model: its units, and with `on_cuda` its compute, with the
// settings that would shrink that compute (activation checkpointing, smaller micro-batches).
inline runtime::PlanInputs plan_inputs(const HfConfig& hf_config, std::uint32_t ranks,
                                       const DecoderOptions& options, bool on_cuda) {
  runtime::PlanInputs inputs;
  inputs.params = hf_config.parameter_count();
  inputs.ranks = ranks;
  for (const UnitSpec& unit : decoder_units(hf_config)) inputs.unit_numels.push_back(unit.numel);
  if (!on_cuda) return inputs;
  // The bf16 path's units keep fp32 views of their norms and biases alone (the trainer registers
  // the rest with runtime::TensorSpec::fp32_view = false), packed as the Engine packs them.
  for (const UnitSpec& unit : decoder_units(hf_config)) {
    std::vector<std::uint64_t> numels;
    for (const TensorSpec& tensor : unit.tensors) numels.push_back(tensor.numel());
    const std::vector<bool> widened = options.cuda_fp32_products
                                          ? std::vector<bool>(unit.tensors.size(), true)
                                          : cuda_bf16_fp32_views_read(unit);
    inputs.unit_fp32_view_numels.push_back(
        runtime::pack_fp32_views(runtime::make_unit_layout(numels, ranks), widened).numel);
  }
  inputs.compute_device_bytes = cuda_compute_bytes(hf_config, options);
  inputs.compute_description = fmt::format(
      "the model's compute on the GPU: activations of {} x {} tokens{}, bf16 operands, two "
      "gradient slots",
      options.micro_batch, options.seq_len,
      options.activation_checkpointing ? " (activation checkpointing)" : "");
  if (!options.activation_checkpointing) {
    DecoderOptions checkpointed = options;
    checkpointed.activation_checkpointing = true;
    inputs.compute_alternatives.push_back(
        {"--activation-checkpointing", cuda_compute_bytes(hf_config, checkpointed)});
  }
  for (std::uint32_t micro = options.micro_batch / 2; micro >= 1; micro /= 2) {
    DecoderOptions smaller = options;
    smaller.micro_batch = micro;
    inputs.compute_alternatives.push_back(
        {fmt::format("--micro-batch {} (with --grad-accumulation to keep the batch)", micro),
         cuda_compute_bytes(hf_config, smaller)});
  }
  return inputs;
}

}  // namespace strata::llm
