#include "models/inference/generation.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace strata::llm {
namespace {

// A uniform double in [0, 1) from splitmix64.
double next_uniform(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1p-53;
}

std::int32_t argmax(std::span<const float> logits) {
  return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) -
                                   logits.begin());
}

}  // namespace

std::int32_t pick_token(std::span<const float> logits, const GenerationOptions& options,
                        std::uint64_t& state) {
  if (options.temperature <= 0.0) return argmax(logits);
  const float top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probabilities(logits.size());
  double total = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    probabilities[i] = std::exp((logits[i] - top) / options.temperature);
    total += probabilities[i];
  }
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  // Most likely first; ids break ties so the order never depends on the sort's internals.
  std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return probabilities[a] != probabilities[b] ? probabilities[a] > probabilities[b] : a < b;
  });
  std::size_t kept = 0;
  double kept_mass = 0;
  while (kept < order.size() && (kept == 0 || kept_mass < options.top_p * total)) {
    kept_mass += probabilities[order[kept++]];
  }
  double target = next_uniform(state) * kept_mass;
  for (std::size_t i = 0; i < kept; ++i) {
    target -= probabilities[order[i]];
    if (target < 0) return order[i];
  }
  return order[kept - 1];
}

std::vector<std::int32_t> generate(const HfConfig& config, const HostWeights& weights,
                                   std::span<const std::int32_t> prompt,
                                   const GenerationOptions& options) {
  if (prompt.empty()) throw std::invalid_argument("the prompt encodes to no tokens");
  const std::size_t positions = prompt.size() + options.max_new_tokens;
  if (positions > config.max_position_embeddings) {
    throw std::invalid_argument(
        "prompt (" + std::to_string(prompt.size()) + " tokens) + --max-new-tokens " +
        std::to_string(options.max_new_tokens) + " exceed the model's " +
        std::to_string(config.max_position_embeddings) + " positions (max_position_embeddings)");
  }
  DecoderOptions decoder_options;
  decoder_options.seq_len = std::min<std::uint32_t>(config.max_position_embeddings, 128);
  decoder_options.micro_batch = 1;
  DecoderModel model(config, decoder_options);
  model.start_decoding(positions);
  std::uint64_t state = options.seed;
  std::vector<std::int32_t> generated;
  model.feed(prompt);
  for (std::uint32_t i = 0; i < options.max_new_tokens; ++i) {
    decode_all(model, weights);
    const std::int32_t token = pick_token(model.next_logits(), options, state);
    generated.push_back(token);
    if (std::find(options.stop_ids.begin(), options.stop_ids.end(), token) !=
        options.stop_ids.end()) {
      break;
    }
    if (i + 1 < options.max_new_tokens) model.feed(std::span<const std::int32_t>(&token, 1));
  }
  return generated;
}

}  // namespace strata::llm
