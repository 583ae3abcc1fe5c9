#include "models/inference/perplexity.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace strata::llm {

PerplexityResult evaluate_perplexity(const HfConfig& config, const HostWeights& weights,
                                     std::span<const std::int32_t> tokens,
                                     std::uint32_t window_tokens, std::uint32_t batch,
                                     bool keep_first_logits) {
  if (window_tokens < 2) throw std::invalid_argument("--seq-len must be at least 2");
  if (tokens.size() < 2) {
    throw std::invalid_argument("the text has " + std::to_string(tokens.size()) +
                                " token(s); perplexity needs at least 2");
  }
  batch = std::max<std::uint32_t>(1, batch);
  DecoderOptions options;
  options.seq_len = window_tokens - 1;
  options.micro_batch = batch;
  DecoderModel model(config, options);

  double nll_sum = 0;
  PerplexityResult result;
  result.tokens = tokens.size();
  const std::size_t full_windows = tokens.size() / window_tokens;
  const auto score = [&](std::span<const std::int32_t> window_tokens_span,
                         std::size_t sequence_tokens) {
    model.set_batch(window_tokens_span, sequence_tokens);
    forward_all(model, weights);
    model.loss();
    if (keep_first_logits && result.first_logits.empty()) {
      const std::size_t floats = (sequence_tokens - 1) * config.vocab_size;
      const std::span<const float> logits = model.logits();
      result.first_logits.assign(logits.begin(), logits.begin() + floats);
    }
    nll_sum += model.loss_sum();
    result.scored += static_cast<std::uint64_t>(model.loss_weight());
  };
  for (std::size_t first = 0; first < full_windows; first += batch) {
    const std::size_t count = std::min<std::size_t>(batch, full_windows - first);
    score(tokens.subspan(first * window_tokens, count * window_tokens), window_tokens);
    result.windows += count;
  }
  const std::size_t rest = tokens.size() - full_windows * window_tokens;
  if (rest >= 2) {
    score(tokens.subspan(full_windows * window_tokens), rest);
    ++result.windows;
  }
  result.mean_nll = nll_sum / static_cast<double>(result.scored);
  result.perplexity = std::exp(result.mean_nll);
  return result;
}

}  // namespace strata::llm
