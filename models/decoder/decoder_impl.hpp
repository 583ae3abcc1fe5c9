// DecoderModel's private state, shared by decoder_model.cpp (batches, units, loss),
// decoder_layer.cpp (one layer's arithmetic) and decoder_decode.cpp (the KV cache).
// Every buffer is sized at construction (training) or in start_decoding (decoding); the unit
// calls only index into them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "models/decoder/decoder_cuda.hpp"
#include "models/decoder/decoder_layout.hpp"
#include "models/decoder/decoder_model.hpp"
#include "models/decoder/loss.hpp"
#include "models/decoder/rope.hpp"

namespace strata::llm {

namespace detail {

// Widths of one layer's activations, from the config.
struct Dims {
  std::size_t hidden = 0;
  std::size_t heads = 0, kv_heads = 0, head_dim = 0;
  std::size_t q_width = 0, kv_width = 0, qkv_width = 0;  // qkv rows: q | k | v
  std::size_t inner = 0, pre_width = 0;                  // pre rows: gate | up, or fc
  std::size_t vocab = 0;
  std::size_t window = 0;  // 0: full causal attention
  bool gpt2 = false;       // LayerNorm, Conv1D, learned positions, plain MLP
  float eps = 0.0f;
  Activation activation = Activation::kSilu;

  explicit Dims(const HfConfig& config);
  Dims() = default;
};

// The tensor at `index` of a unit's views, or nullptr when the family lacks it (kAbsent).
inline const float* tensor(UnitParams p, std::size_t index) {
  return index == kAbsent ? nullptr : p[index].data();
}
inline float* tensor(UnitGrads g, std::size_t index) {
  return index == kAbsent ? nullptr : g[index].data();
}

// One layer's activations for `rows` rows.
struct LayerBuffers {
  std::vector<float> norm1, norm1_mean, norm1_rstd;
  std::vector<float> qkv;   // after biases and RoPE: what attention reads
  std::vector<float> prob;  // attention probabilities
  std::vector<float> att;   // attention output, before o_proj
  std::vector<float> mid;   // residual stream after attention
  std::vector<float> norm2, norm2_mean, norm2_rstd;
  std::vector<float> pre;  // MLP pre-activations
  std::vector<float> act;  // MLP hidden activations

  void allocate(const Dims& dims, std::size_t rows, std::size_t prob_floats);
  std::size_t floats() const;
};

}  // namespace detail

struct DecoderModel::Impl {
  enum class Phase : std::uint8_t { kIdle, kForward, kBackward };

  struct Decoding {
    std::size_t max_positions = 0;
    std::size_t positions = 0;  // tokens in the cache
    std::size_t fed = 0;        // tokens of the current feed
    std::size_t next_unit = 0;
    bool active = false;
    std::vector<std::int32_t> tokens;
    std::vector<std::vector<float>> k_cache, v_cache;  // per layer [max_positions × kv_width]
    detail::LayerBuffers layer;
    std::vector<float> x;  // residual stream of the fed tokens
    std::vector<float> head_norm, head_mean, head_rstd, logits;
    detail::RopeTable rope;
  };

  Impl(const HfConfig& config, const DecoderOptions& options, tiers::Device* device);

  HfConfig config;
  DecoderOptions options;
  std::vector<UnitSpec> units;
  detail::Dims dims;
  detail::LayerLayout layer_layout;
  detail::HeadLayout head_layout;
  detail::RopeTable rope;  // training positions [0, seq_len)
  // Per unit, per tensor: whether this path reads its fp32 view (fp32_views_read).
  std::vector<std::vector<bool>> fp32_read;

  // The batch.
  std::vector<std::int32_t> inputs, targets;
  std::vector<float> weights;
  // Per row: its position (RoPE, GPT-2's wpe) and the first key of its sequence it may attend to;
  // within its sequence (row % positions and 0), or within its document (document_separator).
  std::vector<std::uint32_t> row_position, row_first_key;
  std::size_t sequences = 0, positions = 0, rows = 0;  // positions: per sequence
  Phase phase = Phase::kIdle;
  std::size_t next_unit = 0;
  detail::LossTotals totals;

  // Activations: the residual stream entering each layer and the head; each layer's
  // activations (one shared set under activation checkpointing, refilled in backward).
  std::vector<std::vector<float>> resid;
  std::vector<detail::LayerBuffers> layers;
  std::vector<float> head_norm, head_mean, head_rstd, logits, dlogits;
  std::vector<double> row_loss;
  // Backward scratch, reused by every layer.
  std::vector<float> d_resid, d_norm, d_att, d_qkv, d_pre, d_act, attention_scratch;
  std::vector<float> tied_embedding_grad;  // the head's share of the embedding's gradient

  Decoding decoding;

  // Set on a CUDA device: the training buffers above then stay empty (decoder_cuda.hpp).
  std::unique_ptr<detail::CudaDecoder> cuda;
  std::vector<float> cuda_logits;

  void allocate_host_buffers();
  // row_position and row_first_key of the batch's rows (document_separator).
  void mark_documents(std::size_t batch_sequences, std::size_t positions_each);

  detail::LayerBuffers& layer_buffers(std::size_t layer) {
    return options.activation_checkpointing ? layers.front() : layers[layer];
  }
  const float* head_matrix(UnitParams params, UnitParams shared) const;
  void check_views(std::size_t unit, UnitParams params, UnitParams shared,
                   const UnitBf16& bf16 = {}) const;
  void check_bf16_views(const UnitSpec& spec, UnitParamsBf16 bf16) const;

  // decoder_model.cpp
  void forward_embedding(UnitParams p);
  void forward_head(UnitParams p, UnitParams shared);
  void backward_head(UnitParams p, UnitGrads g, UnitParams shared);
  void backward_embedding(UnitGrads g);

  // decoder_layer.cpp
  void norm_forward(const float* weight, const float* bias, const float* x, float* y, float* mean,
                    float* rstd, std::size_t rows) const;
  void norm_backward(const float* weight, const float* dy, const float* x, const float* mean,
                     const float* rstd, float* dx, float* dweight, float* dbias,
                     std::size_t rows) const;
  // norm1 and the projected q | k | v rows (RoPE at first_position + r % rows_per_sequence).
  void attention_inputs(UnitParams p, const float* x, detail::LayerBuffers& a, std::size_t rows,
                        const detail::RopeTable& table, std::size_t rows_per_sequence,
                        std::size_t first_position,
                        const std::uint32_t* row_positions = nullptr) const;
  // From a.att on: o_proj, residual, norm2, MLP, residual into out (out may alias x).
  void attention_output_and_mlp(UnitParams p, const float* x, detail::LayerBuffers& a, float* out,
                                std::size_t rows) const;
  void forward_layer(std::size_t layer, UnitParams p);
  void backward_layer(std::size_t layer, UnitParams p, UnitGrads g);
  // backward_layer's steps. MLP: d_resid gains norm2's input gradient (d_norm on the way).
  void backward_mlp(UnitParams p, UnitGrads g, const detail::LayerBuffers& a);
  // o_proj and attention: d_att, then d_qkv.
  void backward_attention(UnitParams p, UnitGrads g, const detail::LayerBuffers& a);
  // From d_qkv: the q | k | v projections and norm1 (of x, the layer input) into d_resid.
  void backward_attention_inputs(UnitParams p, UnitGrads g, const detail::LayerBuffers& a,
                                 const float* x);

  // decoder_decode.cpp
  void decode_embedding(UnitParams p);
  void decode_layer(std::size_t layer, UnitParams p);
  void decode_head(UnitParams p, UnitParams shared);
};

}  // namespace strata::llm
