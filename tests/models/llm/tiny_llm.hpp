// Tiny random decoders of every family for the model tests: config.json texts, parameters held
// in plain vectors (one flat buffer per unit), random tokens and loss masks, and the training
// and decoding loops over them.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "models/decoder/decoder_model.hpp"
#include "models/decoder/hf_config.hpp"

namespace strata::llm::testing {

// Llama with GQA (4 heads, 2 kv heads), llama3 rope scaling whose three bands (kept, blended,
// slowed) all hold one of head_dim 8's four frequencies, untied head.
inline const char* kTinyLlama = R"({
  "architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 48,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": 64,
  "max_position_embeddings": 128, "tie_word_embeddings": false, "hidden_act": "silu",
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
  "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": [2, 3]})";

// Qwen2: q/k/v biases, tied embeddings, 3 heads over 1 kv head, head_dim given explicitly
// (10 ≠ hidden / heads), a sliding_window that use_sliding_window false switches off.
inline const char* kTinyQwen2 = R"({
  "architectures": ["Qwen2ForCausalLM"], "hidden_size": 24, "intermediate_size": 40,
  "num_hidden_layers": 2, "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 10,
  "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "vocab_size": 50,
  "max_position_embeddings": 64, "tie_word_embeddings": true, "hidden_act": "silu",
  "use_sliding_window": false, "sliding_window": 32, "torch_dtype": "bfloat16",
  "bos_token_id": 0, "eos_token_id": 1})";

// Mistral: a sliding window of 5, shorter than the training sequences.
inline const char* kTinyMistral = R"({
  "architectures": ["MistralForCausalLM"], "hidden_size": 32, "intermediate_size": 64,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
  "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": 40,
  "max_position_embeddings": 256, "sliding_window": 5, "tie_word_embeddings": false,
  "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2})";

inline const char* kTinyGpt2 = R"({
  "architectures": ["GPT2LMHeadModel"], "n_embd": 32, "n_layer": 2, "n_head": 4,
  "n_positions": 32, "n_inner": null, "layer_norm_epsilon": 1e-5, "vocab_size": 48,
  "activation_function": "gelu_new", "bos_token_id": 47, "eos_token_id": 47})";

// One flat buffer per unit, as the Engine would hand them over.
class UnitBuffers {
 public:
  explicit UnitBuffers(const std::vector<UnitSpec>& units) : units_(units) {
    for (const UnitSpec& unit : units) values_.emplace_back(unit.numel, 0.0f);
  }
  std::vector<std::span<const float>> views(std::size_t u) const {
    return split_unit(units_[u], std::span<const float>(values_[u]));
  }
  std::vector<std::span<float>> mutable_views(std::size_t u) {
    return split_unit(units_[u], std::span<float>(values_[u]));
  }
  std::vector<float>& unit(std::size_t u) { return values_[u]; }
  const std::vector<float>& unit(std::size_t u) const { return values_[u]; }
  std::size_t unit_count() const { return values_.size(); }

 private:
  std::vector<UnitSpec> units_;
  std::vector<std::vector<float>> values_;
};

// Values of order one in the activations: gains around 1, matrices ~ 1/√fan_in.
inline UnitBuffers random_parameters(const std::vector<UnitSpec>& units, std::uint64_t seed) {
  UnitBuffers params(units);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::vector<std::span<float>> tensors = params.mutable_views(u);
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      const TensorSpec& spec = units[u].tensors[t];
      float base = 0.0f;
      float spread = 0.2f;
      if (spec.init.kind == runtime::InitKind::kOnes) base = 1.0f;
      if (spec.shape.size() == 2) {
        const bool embedding = units[u].kind == UnitKind::kEmbedding;
        spread = embedding ? 1.0f : 1.7f / std::sqrt(static_cast<float>(spec.shape[1]));
      }
      for (float& value : tensors[t]) value = base + spread * uniform(rng);
    }
  }
  return params;
}

inline std::vector<std::int32_t> random_tokens(std::size_t count, std::uint32_t vocab,
                                               std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> tokens(count);
  for (std::int32_t& token : tokens) token = static_cast<std::int32_t>(rng() % vocab);
  return tokens;
}

// About a third of the targets left out of the loss.
inline std::vector<float> random_mask(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> mask(count);
  for (float& weight : mask) weight = rng() % 3 == 0 ? 0.0f : 1.0f;
  return mask;
}

inline std::vector<std::span<const float>> shared_views(const DecoderModel& model,
                                                        const UnitBuffers& params,
                                                        std::size_t u) {
  if (!model.units()[u].reads_embedding) return {};
  return params.views(0);
}

inline double forward_backward(DecoderModel& model, const UnitBuffers& params, UnitBuffers& grads,
                               std::span<const std::int32_t> tokens, std::size_t sequence_tokens,
                               std::span<const float> weights) {
  model.set_batch(tokens, sequence_tokens, weights);
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    model.forward_unit(u, params.views(u), shared_views(model, params, u));
  }
  const double loss = model.loss();
  for (std::size_t u = model.unit_count(); u-- > 0;) {
    model.backward_unit(u, params.views(u), grads.mutable_views(u), shared_views(model, params, u));
  }
  return loss;
}

inline void forward(DecoderModel& model, const UnitBuffers& params,
                    std::span<const std::int32_t> tokens, std::size_t sequence_tokens) {
  model.set_batch(tokens, sequence_tokens);
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    model.forward_unit(u, params.views(u), shared_views(model, params, u));
  }
}

inline void decode(DecoderModel& model, const UnitBuffers& params,
                   std::span<const std::int32_t> tokens) {
  model.feed(tokens);
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    model.decode_unit(u, params.views(u), shared_views(model, params, u));
  }
}

}  // namespace strata::llm::testing
