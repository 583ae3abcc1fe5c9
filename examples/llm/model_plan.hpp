// A Hugging Face model's shapes as the memory plan takes them ([model] of runtime::Config), for
// `strata plan --model DIR` and `strata-finetune --model`: the parameter count from config.json,
// and the largest unit gathered at once. The plan sizes its gather buffers as params / layers, so
// `layers` is set to params / largest unit: the embedding (vocab × hidden) is often larger than a
// decoder layer, and the buffers must hold it. Header-only: the `strata` program links only
// strata_llm_model.
#pragma once

#include <algorithm>
#include <cstdint>

#include "examples/llm/decoder_model.hpp"
#include "examples/llm/hf_config.hpp"
#include "runtime/config.hpp"

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

}  // namespace strata::llm
