// Text generation with a DecoderModel's KV cache: the prompt fed once, then one token per step.
// Greedy (argmax, lowest id on ties) at temperature 0; otherwise sampling from
// softmax(logits / temperature), restricted to the smallest set of most likely tokens whose
// probability reaches top_p, with a generator seeded by `seed` (same seed, same output).
// Generation stops after max_new_tokens or at a stop id (which is kept in the output).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "models/decoder/decoder_model.hpp"
#include "models/checkpoint/host_weights.hpp"

namespace strata::llm {

struct GenerationOptions {
  std::uint32_t max_new_tokens = 64;
  double temperature = 0.0;
  double top_p = 1.0;
  std::uint64_t seed = 0;
  std::vector<std::int32_t> stop_ids;  // e.g. the model's eos ids
};

// The generated ids (the prompt not included). Throws std::invalid_argument for an empty prompt
// or one that with max_new_tokens exceeds max_position_embeddings.
std::vector<std::int32_t> generate(const HfConfig& config, const HostWeights& weights,
                                   std::span<const std::int32_t> prompt,
                                   const GenerationOptions& options);

// The next token from `logits` under `options` (exposed for tests); `state` is the generator's.
std::int32_t pick_token(std::span<const float> logits, const GenerationOptions& options,
                        std::uint64_t& state);

}  // namespace strata::llm
