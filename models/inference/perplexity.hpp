// Perplexity as llama.cpp's tool reports it, with the window rule strata-eval documents: the text
// tokenized whole; non-overlapping windows of `window_tokens` tokens from token 0 (a last window
// of at least 2 tokens counts); each window scored on every token but its first (next-token
// negative log-likelihood), positions restarting at 0 in each window; perplexity =
// exp(mean NLL over every scored token).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "models/decoder/decoder_model.hpp"
#include "models/checkpoint/host_weights.hpp"

namespace strata::llm {

struct PerplexityResult {
  std::uint64_t tokens = 0;   // the whole text's token count
  std::uint64_t scored = 0;   // next-token predictions scored
  std::uint64_t windows = 0;
  double mean_nll = 0;        // nats
  double perplexity = 0;
  // With keep_first_logits: the logits of the first window's scored positions,
  // [min(window, tokens) - 1 × vocab], for comparing against another implementation.
  std::vector<float> first_logits;
};

// Full windows go through the model `batch` at a time. Throws std::invalid_argument when the text
// has fewer than 2 tokens, or HfConfigError when a window exceeds the model's positions.
PerplexityResult evaluate_perplexity(const HfConfig& config, const HostWeights& weights,
                                     std::span<const std::int32_t> tokens,
                                     std::uint32_t window_tokens, std::uint32_t batch = 4,
                                     bool keep_first_logits = false);

}  // namespace strata::llm
