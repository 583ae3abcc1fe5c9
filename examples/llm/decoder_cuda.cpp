// DecoderModel's CUDA backend: device activations, bf16 tensor-core products on cuBLAS and the
// kernels of decoder_cuda_kernels.cu on one stream. Mirrors decoder_layer.cpp and
// decoder_model.cpp step for step (same buffers, same order, same family switches).
//
// Row-major products on column-major cuBLAS: a row-major matrix is its transpose in column-major,
// so C = op(A)·op(B) (row-major) is computed as Cᵀ = op(B)ᵀ·op(A)ᵀ, i.e. GemmEx with the operands
// swapped and m, n exchanged. Operands are rounded to bf16 (round to nearest even) into scratch
// first; the product accumulates in fp32 (CUBLAS_COMPUTE_32F) into an fp32 output. Atomics are not
// allowed, so on one stream the results are bitwise reproducible on the same GPU.
#include "examples/llm/decoder_cuda.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "base/assert.hpp"
#include "examples/gpt/cuda_backend.hpp"
#include "examples/llm/decoder_cuda_kernels.hpp"
#include "examples/llm/decoder_impl.hpp"
#include "examples/llm/flash_attention.hpp"
#include "examples/llm/linear.hpp"
#include "tiers/device/cuda_device.hpp"
#include "tiers/device/device.hpp"

namespace strata::llm::detail {
namespace {

enum class Op { kNo, kYes };

cublasOperation_t to_cublas(Op op) { return op == Op::kYes ? CUBLAS_OP_T : CUBLAS_OP_N; }

int to_int(std::size_t value) {
  STRATA_ASSERT(value <= 0x7fffffffu, "matrix dimension beyond cuBLAS's int");
  return static_cast<int>(value);
}

cuda::ActivationCode activation_code(Activation act) {
  switch (act) {
    case Activation::kSilu:
      return cuda::ActivationCode::kSilu;
    case Activation::kGeluTanh:
      return cuda::ActivationCode::kGeluTanh;
    case Activation::kGelu:
      return cuda::ActivationCode::kGelu;
  }
  return cuda::ActivationCode::kSilu;
}

// A row-major view with a row stride, on the device.
struct View {
  const float* data;
  std::size_t ld;
};
struct MutView {
  float* data;
  std::size_t ld;
};

class CudaDecoderImpl final : public CudaDecoder, private examples::CudaBackend {
 public:
  CudaDecoderImpl(const HfConfig& config, const DecoderOptions& options, tiers::Device& device)
      : CudaBackend(device, "decoder"),
        config_(config),
        options_(options),
        units_(decoder_units(config)),
        dims_(config),
        layout_(layer_layout(units_[1])),
        head_(head_layout(units_.back())) {
    STRATA_ASSERT(device.kind() == tiers::DeviceKind::kCuda);
    if (dims_.head_dim > cuda::kMaxAttentionHeadDim) {
      throw std::invalid_argument(
          config.source.string() + ": head_dim " + std::to_string(dims_.head_dim) +
          " exceeds the CUDA attention kernels' " + std::to_string(cuda::kMaxAttentionHeadDim));
    }
    flash_attention_ = use_flash_attention();
    allocate_buffers();
  }

  ~CudaDecoderImpl() override = default;
  CudaDecoderImpl(const CudaDecoderImpl&) = delete;
  CudaDecoderImpl& operator=(const CudaDecoderImpl&) = delete;

  std::size_t activation_bytes() const override { return allocated_bytes(); }

  std::string_view attention_implementation() const override {
    return flash_attention_ ? "flash-attention, bf16 tensor cores" : "tiled fp32, CUDA cores";
  }

  void set_batch(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets,
                 std::span<const float> weights, std::span<const std::uint32_t> row_positions,
                 std::span<const std::uint32_t> row_first_keys, std::size_t sequences,
                 std::size_t positions) override {
    set_device();
    sequences_ = sequences;
    positions_ = positions;
    rows_ = inputs.size();
    // The embedding backward sums every token's (and GPT-2 position's) rows in row order, as
    // the host does.
    token_index_.build(inputs, dims_.vocab);
    if (dims_.gpt2) position_index_.build(row_positions, position_table_rows_);
    host_weights_.assign(weights.begin(), weights.end());
    copy_in(inputs_, inputs.data(), rows_);
    copy_in(targets_, targets.data(), rows_);
    copy_in(weights_, weights.data(), rows_);
    copy_in(row_positions_, row_positions.data(), rows_);
    copy_in(row_first_keys_, row_first_keys.data(), rows_);
    copy_in(token_offsets_, token_index_.offsets.data(), token_index_.offsets.size());
    copy_in(token_rows_, token_index_.rows.data(), rows_);
    if (dims_.gpt2) {
      copy_in(position_offsets_, position_index_.offsets.data(), position_index_.offsets.size());
      copy_in(position_rows_, position_index_.rows.data(), rows_);
    }
    finish();  // the host vectors may change with the next batch
  }

  void forward_embedding(UnitParams p) override {
    set_device();
    const float* wpe = dims_.gpt2 ? p[kPositionEmbedding].data() : nullptr;
    check(cuda::embedding_forward(inputs_, p[kTokenEmbedding].data(), wpe, row_positions_,
                                  resid_[0], rows_, dims_.hidden, stream_),
          "embedding_forward");
    finish();
  }

  void forward_layer(std::size_t layer, UnitParams p) override {
    set_device();
    Layer& a = layer_buffers(layer);
    const float* x = resid_[layer];
    attention_inputs(p, x, a);
    attention_forward(a);
    attention_output_and_mlp(p, x, a, resid_[layer + 1]);
    finish();
  }

  void forward_head(UnitParams p, UnitParams shared) override {
    set_device();
    const std::size_t d = dims_.hidden;
    norm_forward(p[head_.norm_weight].data(), tensor(p, head_.norm_bias), resid_.back(),
                 head_norm_, head_mean_, head_rstd_);
    gemm(Op::kNo, Op::kYes, rows_, dims_.vocab, d, 1.0f, head_norm_, d, head_matrix(p, shared), d,
         0.0f, logits_, dims_.vocab);
    finish();
  }

  LossTotals loss() override {
    set_device();
    LossTotals totals;
    for (const float w : host_weights_) totals.weight += w;  // rows in order, as on the host
    const float inv_weight = totals.weight > 0.0 ? static_cast<float>(1.0 / totals.weight) : 0.0f;
    check(cuda::weighted_cross_entropy(logits_, targets_, weights_, inv_weight, dlogits_,
                                       row_loss_, rows_, dims_.vocab, stream_),
          "weighted_cross_entropy");
    host_loss_.resize(rows_);
    check(cudaMemcpyAsync(host_loss_.data(), row_loss_, rows_ * sizeof(double),
                          cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync");
    finish();
    for (std::size_t r = 0; r < rows_; ++r) totals.loss_sum += host_weights_[r] * host_loss_[r];
    return totals;
  }

  void backward_head(UnitParams p, UnitGrads g, UnitParams shared) override {
    set_device();
    const std::size_t d = dims_.hidden;
    const std::size_t vocab = dims_.vocab;
    float* dhead = config_.tie_word_embeddings ? tied_grad_ : g[head_.lm_head].data();
    gemm(Op::kNo, Op::kNo, rows_, d, vocab, 1.0f, dlogits_, vocab, head_matrix(p, shared), d, 0.0f,
         d_norm_, d);
    gemm(Op::kYes, Op::kNo, vocab, d, rows_, 1.0f, dlogits_, vocab, head_norm_, d, 0.0f, dhead, d);
    check(cudaMemsetAsync(d_resid_, 0, rows_ * d * sizeof(float), stream_), "cudaMemsetAsync");
    norm_backward(p[head_.norm_weight].data(), d_norm_, resid_.back(), head_mean_, head_rstd_,
                  d_resid_, g[head_.norm_weight].data(), tensor(g, head_.norm_bias));
    finish();
  }

  // On entry d_resid holds dL/d(layer output); on exit dL/d(layer input).
  void backward_layer(std::size_t layer, UnitParams p, UnitGrads g) override {
    set_device();
    const LayerLayout& l = layout_;
    const std::size_t d = dims_.hidden;
    const std::size_t inner = dims_.inner;
    const std::size_t n = rows_;
    Layer& a = layer_buffers(layer);
    const View dout{d_resid_, d};
    const View norm2{a.norm2, d};
    const cuda::ActivationCode act = activation_code(dims_.activation);

    // MLP: d_norm = dL/d(norm2 output).
    if (dims_.gpt2) {
      linear_backward(Layout::kInOut, dout, {a.act, inner}, tensor(p, l.proj_weight),
                      {d_act_, inner}, tensor(g, l.proj_weight), tensor(g, l.proj_bias), n, inner,
                      d, Accumulate::kNo);
      check(cuda::plain_backward(act, d_act_, a.pre, d_pre_, n * inner, stream_),
            "plain_backward");
      linear_backward(Layout::kInOut, {d_pre_, inner}, norm2, tensor(p, l.fc_weight), {d_norm_, d},
                      tensor(g, l.fc_weight), tensor(g, l.fc_bias), n, d, inner, Accumulate::kNo);
    } else {
      const std::size_t ld = dims_.pre_width;
      linear_backward(Layout::kOutIn, dout, {a.act, inner}, tensor(p, l.down_weight),
                      {d_act_, inner}, tensor(g, l.down_weight), nullptr, n, inner, d,
                      Accumulate::kNo);
      check(cuda::gated_backward(act, d_act_, a.pre, d_pre_, n, inner, stream_),
            "gated_backward");
      linear_backward(Layout::kOutIn, {d_pre_, ld}, norm2, tensor(p, l.gate_weight), {d_norm_, d},
                      tensor(g, l.gate_weight), nullptr, n, d, inner, Accumulate::kNo);
      linear_backward(Layout::kOutIn, {d_pre_ + inner, ld}, norm2, tensor(p, l.up_weight),
                      {d_norm_, d}, tensor(g, l.up_weight), nullptr, n, d, inner,
                      Accumulate::kYes);
    }
    norm_backward(tensor(p, l.norm2_weight), d_norm_, a.mid, a.norm2_mean, a.norm2_rstd, d_resid_,
                  tensor(g, l.norm2_weight), tensor(g, l.norm2_bias));

    // Attention output projection: d_att = dL/d(attention output).
    const View att{a.att, dims_.q_width};
    if (dims_.gpt2) {
      linear_backward(Layout::kInOut, dout, att, tensor(p, l.out_weight), {d_att_, d},
                      tensor(g, l.out_weight), tensor(g, l.out_bias), n, d, d, Accumulate::kNo);
    } else {
      linear_backward(Layout::kOutIn, dout, att, tensor(p, l.o_weight), {d_att_, dims_.q_width},
                      tensor(g, l.o_weight), nullptr, n, dims_.q_width, d, Accumulate::kNo);
    }
    attention_backward(a);
    const std::size_t ld = dims_.qkv_width;
    const std::size_t k_offset = dims_.q_width;
    const std::size_t v_offset = dims_.q_width + dims_.kv_width;

    // Projections into q | k | v: d_norm = dL/d(norm1 output).
    const View norm1{a.norm1, d};
    if (dims_.gpt2) {
      linear_backward(Layout::kInOut, {d_qkv_, ld}, norm1, tensor(p, l.qkv_weight), {d_norm_, d},
                      tensor(g, l.qkv_weight), tensor(g, l.qkv_bias), n, d, 3 * d,
                      Accumulate::kNo);
    } else {
      rotate(d_qkv_, dims_.heads, -1.0f);
      rotate(d_qkv_ + k_offset, dims_.kv_heads, -1.0f);
      linear_backward(Layout::kOutIn, {d_qkv_, ld}, norm1, tensor(p, l.q_weight), {d_norm_, d},
                      tensor(g, l.q_weight), tensor(g, l.q_bias), n, d, dims_.q_width,
                      Accumulate::kNo);
      linear_backward(Layout::kOutIn, {d_qkv_ + k_offset, ld}, norm1, tensor(p, l.k_weight),
                      {d_norm_, d}, tensor(g, l.k_weight), tensor(g, l.k_bias), n, d,
                      dims_.kv_width, Accumulate::kYes);
      linear_backward(Layout::kOutIn, {d_qkv_ + v_offset, ld}, norm1, tensor(p, l.v_weight),
                      {d_norm_, d}, tensor(g, l.v_weight), tensor(g, l.v_bias), n, d,
                      dims_.kv_width, Accumulate::kYes);
    }
    norm_backward(tensor(p, l.norm1_weight), d_norm_, resid_[layer], a.norm1_mean, a.norm1_rstd,
                  d_resid_, tensor(g, l.norm1_weight), tensor(g, l.norm1_bias));
    finish();
  }

  void backward_embedding(UnitGrads g) override {
    set_device();
    const std::size_t d = dims_.hidden;
    check(cuda::embedding_backward(d_resid_, {token_offsets_, token_rows_, dims_.vocab},
                                   config_.tie_word_embeddings ? tied_grad_ : nullptr,
                                   g[kTokenEmbedding].data(), d, stream_),
          "embedding_backward");
    if (dims_.gpt2) {
      check(cuda::embedding_backward(d_resid_,
                                     {position_offsets_, position_rows_, position_table_rows_},
                                     nullptr, g[kPositionEmbedding].data(), d, stream_),
            "embedding_backward");
    }
    finish();
  }

  void copy_logits(std::vector<float>& out) const override {
    set_device();
    out.resize(rows_ * dims_.vocab);
    check(cudaMemcpyAsync(out.data(), logits_, out.size() * sizeof(float), cudaMemcpyDeviceToHost,
                          stream_),
          "cudaMemcpyAsync");
    finish();
  }

 private:
  // Rows grouped by an id, each group in row order (a stable counting sort), on the host.
  struct HostRowIndex {
    std::vector<std::int32_t> offsets, rows, next;
    template <typename Id>
    void build(std::span<const Id> ids, std::size_t id_count) {
      offsets.assign(id_count + 1, 0);
      for (const Id id : ids) ++offsets[static_cast<std::size_t>(id) + 1];
      for (std::size_t v = 0; v < id_count; ++v) offsets[v + 1] += offsets[v];
      rows.resize(ids.size());
      next.assign(offsets.begin(), offsets.end() - 1);
      for (std::size_t row = 0; row < ids.size(); ++row) {
        rows[static_cast<std::size_t>(next[static_cast<std::size_t>(ids[row])]++)] =
            static_cast<std::int32_t>(row);
      }
    }
  };

  struct Layer {
    float *norm1, *norm1_mean, *norm1_rstd, *qkv, *lse, *att, *mid, *norm2, *norm2_mean,
        *norm2_rstd, *pre, *act;
  };

  void allocate_buffers() {
    const std::size_t rows = std::size_t{options_.micro_batch} * options_.seq_len;
    const std::size_t d = dims_.hidden;
    const std::size_t vocab = dims_.vocab;
    const std::size_t lse = std::size_t{options_.micro_batch} * dims_.heads * options_.seq_len;
    inputs_ = allocate<std::int32_t>(rows);
    targets_ = allocate<std::int32_t>(rows);
    weights_ = allocate<float>(rows);
    row_positions_ = allocate<std::uint32_t>(rows);
    row_first_keys_ = allocate<std::uint32_t>(rows);
    token_offsets_ = allocate<std::int32_t>(vocab + 1);
    token_rows_ = allocate<std::int32_t>(rows);
    if (dims_.gpt2) {
      position_table_rows_ = config_.max_position_embeddings;  // GPT-2's n_positions: wpe's rows
      position_offsets_ = allocate<std::int32_t>(position_table_rows_ + 1);
      position_rows_ = allocate<std::int32_t>(rows);
    }
    row_loss_ = allocate<double>(rows);
    for (std::size_t l = 0; l <= config_.num_layers; ++l) resid_.push_back(allocate<float>(rows * d));
    layers_.resize(options_.activation_checkpointing ? 1 : config_.num_layers);
    for (Layer& layer : layers_) {
      layer.norm1 = allocate<float>(rows * d);
      layer.norm1_mean = allocate<float>(rows);
      layer.norm1_rstd = allocate<float>(rows);
      layer.qkv = allocate<float>(rows * dims_.qkv_width);
      layer.lse = allocate<float>(lse);
      layer.att = allocate<float>(rows * dims_.q_width);
      layer.mid = allocate<float>(rows * d);
      layer.norm2 = allocate<float>(rows * d);
      layer.norm2_mean = allocate<float>(rows);
      layer.norm2_rstd = allocate<float>(rows);
      layer.pre = allocate<float>(rows * dims_.pre_width);
      layer.act = allocate<float>(rows * dims_.inner);
    }
    head_norm_ = allocate<float>(rows * d);
    head_mean_ = allocate<float>(rows);
    head_rstd_ = allocate<float>(rows);
    logits_ = allocate<float>(rows * vocab);
    dlogits_ = allocate<float>(rows * vocab);
    d_resid_ = allocate<float>(rows * d);
    d_norm_ = allocate<float>(rows * d);
    d_att_ = allocate<float>(rows * dims_.q_width);
    d_qkv_ = allocate<float>(rows * dims_.qkv_width);
    d_pre_ = allocate<float>(rows * dims_.pre_width);
    d_act_ = allocate<float>(rows * dims_.inner);
    delta_ = allocate<float>(lse);
    if (config_.tie_word_embeddings) tied_grad_ = allocate<float>(vocab * d);
    if (!dims_.gpt2) {
      const RopeTable table(config_, options_.seq_len);
      rope_half_ = config_.head_dim / 2;
      rope_cos_ = allocate<float>(table.cos().size());
      rope_sin_ = allocate<float>(table.sin().size());
      copy_in(rope_cos_, table.cos().data(), table.cos().size());
      copy_in(rope_sin_, table.sin().data(), table.sin().size());
      finish();
    }
    // bf16 operands of the largest product: an activation [rows × widest], a weight, or the head
    // [vocab × d]; each side of a product has its own buffer.
    const std::size_t widest =
        std::max({vocab, dims_.pre_width, dims_.qkv_width, dims_.inner, dims_.q_width, d});
    const std::size_t operand = std::max(rows * widest, widest * std::max(d, dims_.q_width));
    operand_a_ = allocate<__nv_bfloat16>(operand);
    operand_b_ = allocate<__nv_bfloat16>(operand);
    operand_floats_ = operand;
    if (flash_attention_) {
      // q, k, v and dout of a full batch rounded to bf16 (flash_attention.hpp's fp32 interface).
      const cuda::AttentionDims batch{options_.micro_batch, options_.seq_len, dims_.heads,
                                      dims_.kv_heads,       dims_.head_dim,   dims_.window,
                                      nullptr};
      attention_scratch_ =
          allocate<__nv_bfloat16>(cuda::flash_attention_scratch_elements(batch));
    }
    STRATA_ASSERT(allocated_bytes() ==
                      cuda_decoder_activation_bytes(config_, options_, flash_attention_).allocated,
                  "decoder_cuda_plan.cpp counts other buffers than these");
  }

  // The tensor-core attention where the options and the head_dim allow it (decoder_cuda.hpp).
  bool use_flash_attention() const {
    const bool supported = cuda::flash_attention_supported(dims_.head_dim, device_index_);
    switch (options_.cuda_attention) {
      case CudaAttention::kAuto:
        return supported && !options_.cuda_fp32_products;
      case CudaAttention::kTensorCores:
        if (!supported) {
          throw std::invalid_argument(
              config_.source.string() + ": head_dim " + std::to_string(dims_.head_dim) +
              ": the tensor-core attention takes a multiple of 8 up to " +
              std::to_string(cuda::kMaxAttentionHeadDim) + " on an sm_80 or newer GPU");
        }
        return true;
      case CudaAttention::kFp32:
        return false;
    }
    return false;
  }

  // att = softmax(q·kᵀ)·v of the layer's q | k | v rows, and the log-sum-exp per query.
  void attention_forward(Layer& a) {
    const float* k = a.qkv + dims_.q_width;
    const float* v = k + dims_.kv_width;
    if (flash_attention_) {
      check(cuda::flash_attention_forward(attention_dims(), a.qkv, k, v, dims_.qkv_width, a.att,
                                          dims_.q_width, a.lse, attention_scratch_, stream_),
            "flash_attention_forward");
    } else {
      check(cuda::attention_forward(attention_dims(), a.qkv, k, v, dims_.qkv_width, a.att,
                                    dims_.q_width, a.lse, stream_),
            "attention_forward");
    }
  }

  // d_qkv = dL/d(q | k | v) from d_att = dL/d(attention output).
  void attention_backward(Layer& a) {
    const std::size_t ld = dims_.qkv_width;
    const float* k = a.qkv + dims_.q_width;
    const float* v = k + dims_.kv_width;
    float* dk = d_qkv_ + dims_.q_width;
    float* dv = dk + dims_.kv_width;
    if (flash_attention_) {
      check(cuda::flash_attention_backward(attention_dims(), d_att_, dims_.q_width, a.att, a.qkv,
                                           k, v, ld, a.lse, delta_, d_qkv_, dk, dv,
                                           attention_scratch_, stream_),
            "flash_attention_backward");
    } else {
      check(cuda::attention_backward(attention_dims(), d_att_, dims_.q_width, a.att, a.qkv, k, v,
                                     ld, a.lse, delta_, d_qkv_, dk, dv, stream_),
            "attention_backward");
    }
  }

  Layer& layer_buffers(std::size_t layer) {
    return options_.activation_checkpointing ? layers_.front() : layers_[layer];
  }

  cuda::AttentionDims attention_dims() const {
    return {sequences_,     positions_,     dims_.heads, dims_.kv_heads,
            dims_.head_dim, dims_.window,   row_first_keys_};
  }

  const float* head_matrix(UnitParams p, UnitParams shared) const {
    return config_.tie_word_embeddings ? shared[kTokenEmbedding].data()
                                       : p[head_.lm_head].data();
  }

  void norm_forward(const float* weight, const float* bias, const float* x, float* y, float* mean,
                    float* rstd) {
    if (dims_.gpt2) {
      check(cuda::layer_norm_forward(x, weight, bias, y, mean, rstd, rows_, dims_.hidden,
                                     dims_.eps, stream_),
            "layer_norm_forward");
    } else {
      check(cuda::rms_norm_forward(x, weight, y, rstd, rows_, dims_.hidden, dims_.eps, stream_),
            "rms_norm_forward");
    }
  }

  void norm_backward(const float* weight, const float* dy, const float* x, const float* mean,
                     const float* rstd, float* dx, float* dweight, float* dbias) {
    if (dims_.gpt2) {
      check(cuda::layer_norm_backward(dy, x, mean, rstd, weight, dx, dweight, dbias, rows_,
                                      dims_.hidden, stream_),
            "layer_norm_backward");
    } else {
      check(cuda::rms_norm_backward(dy, x, rstd, weight, dx, dweight, rows_, dims_.hidden,
                                    stream_),
            "rms_norm_backward");
    }
  }

  // RoPE on `heads` heads of the q | k | v rows starting at x (row stride qkv_width).
  void rotate(float* x, std::size_t heads, float sign) {
    check(cuda::rope_rotate(x, dims_.qkv_width, rows_, heads, rope_half_, row_positions_,
                            rope_cos_, rope_sin_, sign, stream_),
          "rope_rotate");
  }

  void attention_inputs(UnitParams p, const float* x, Layer& a) {
    const LayerLayout& l = layout_;
    const std::size_t d = dims_.hidden;
    norm_forward(tensor(p, l.norm1_weight), tensor(p, l.norm1_bias), x, a.norm1, a.norm1_mean,
                 a.norm1_rstd);
    const View in{a.norm1, d};
    const std::size_t ld = dims_.qkv_width;
    if (dims_.gpt2) {
      linear_forward(Layout::kInOut, in, tensor(p, l.qkv_weight), tensor(p, l.qkv_bias),
                     {a.qkv, ld}, d, 3 * d);
      return;
    }
    linear_forward(Layout::kOutIn, in, tensor(p, l.q_weight), tensor(p, l.q_bias), {a.qkv, ld}, d,
                   dims_.q_width);
    linear_forward(Layout::kOutIn, in, tensor(p, l.k_weight), tensor(p, l.k_bias),
                   {a.qkv + dims_.q_width, ld}, d, dims_.kv_width);
    linear_forward(Layout::kOutIn, in, tensor(p, l.v_weight), tensor(p, l.v_bias),
                   {a.qkv + dims_.q_width + dims_.kv_width, ld}, d, dims_.kv_width);
    rotate(a.qkv, dims_.heads, 1.0f);
    rotate(a.qkv + dims_.q_width, dims_.kv_heads, 1.0f);
  }

  void attention_output_and_mlp(UnitParams p, const float* x, Layer& a, float* out) {
    const LayerLayout& l = layout_;
    const std::size_t d = dims_.hidden;
    const std::size_t inner = dims_.inner;
    const std::size_t n = rows_;
    const View att{a.att, dims_.q_width};
    const cuda::ActivationCode act = activation_code(dims_.activation);
    if (dims_.gpt2) {
      linear_forward(Layout::kInOut, att, tensor(p, l.out_weight), tensor(p, l.out_bias),
                     {a.mid, d}, d, d);
    } else {
      linear_forward(Layout::kOutIn, att, tensor(p, l.o_weight), nullptr, {a.mid, d},
                     dims_.q_width, d);
    }
    check(cuda::add_in_place(a.mid, x, n * d, stream_), "add_in_place");
    norm_forward(tensor(p, l.norm2_weight), tensor(p, l.norm2_bias), a.mid, a.norm2, a.norm2_mean,
                 a.norm2_rstd);
    const View in{a.norm2, d};
    const View hidden{a.act, inner};
    if (dims_.gpt2) {
      linear_forward(Layout::kInOut, in, tensor(p, l.fc_weight), tensor(p, l.fc_bias),
                     {a.pre, inner}, d, inner);
      check(cuda::plain_forward(act, a.pre, a.act, n * inner, stream_), "plain_forward");
      linear_forward(Layout::kInOut, hidden, tensor(p, l.proj_weight), tensor(p, l.proj_bias),
                     {out, d}, inner, d);
    } else {
      const std::size_t ld = dims_.pre_width;
      linear_forward(Layout::kOutIn, in, tensor(p, l.gate_weight), nullptr, {a.pre, ld}, d, inner);
      linear_forward(Layout::kOutIn, in, tensor(p, l.up_weight), nullptr, {a.pre + inner, ld}, d,
                     inner);
      check(cuda::gated_forward(act, a.pre, a.act, n, inner, stream_), "gated_forward");
      linear_forward(Layout::kOutIn, hidden, tensor(p, l.down_weight), nullptr, {out, d}, inner,
                     d);
    }
    check(cuda::add_in_place(out, a.mid, n * d, stream_), "add_in_place");
  }

  // linear.hpp's contract over device views: y = x·op(W) (+ bias).
  void linear_forward(Layout layout, View x, const float* weight, const float* bias, MutView y,
                      std::size_t in, std::size_t out) {
    float beta = 0.0f;
    if (bias != nullptr) {
      check(cuda::broadcast_rows(bias, y.data, y.ld, rows_, out, stream_), "broadcast_rows");
      beta = 1.0f;
    }
    if (layout == Layout::kOutIn) {
      gemm(Op::kNo, Op::kYes, rows_, out, in, 1.0f, x.data, x.ld, weight, in, beta, y.data, y.ld);
    } else {
      gemm(Op::kNo, Op::kNo, rows_, out, in, 1.0f, x.data, x.ld, weight, out, beta, y.data, y.ld);
    }
  }

  // dx = dy·op(W)ᵀ (added when accumulate), dweight overwritten, dbias = Σ_rows dy (when not null).
  void linear_backward(Layout layout, View dy, View x, const float* weight, MutView dx,
                       float* dweight, float* dbias, std::size_t rows, std::size_t in,
                       std::size_t out, Accumulate accumulate) {
    const float dx_beta = accumulate == Accumulate::kYes ? 1.0f : 0.0f;
    if (layout == Layout::kOutIn) {
      gemm(Op::kNo, Op::kNo, rows, in, out, 1.0f, dy.data, dy.ld, weight, in, dx_beta, dx.data,
           dx.ld);
      gemm(Op::kYes, Op::kNo, out, in, rows, 1.0f, dy.data, dy.ld, x.data, x.ld, 0.0f, dweight,
           in);
    } else {
      gemm(Op::kNo, Op::kYes, rows, in, out, 1.0f, dy.data, dy.ld, weight, out, dx_beta, dx.data,
           dx.ld);
      gemm(Op::kYes, Op::kNo, in, out, rows, 1.0f, x.data, x.ld, dy.data, dy.ld, 0.0f, dweight,
           out);
    }
    if (dbias != nullptr) {
      check(cuda::column_sums(dy.data, dy.ld, rows, out, dbias, stream_), "column_sums");
    }
  }

  // Row-major C[m×n] = alpha·op(A)·op(B) + beta·C with A and B rounded to bf16 and the products
  // summed in fp32 on the tensor cores (see the top of the file); plain fp32 when the options ask.
  void gemm(Op op_a, Op op_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
            const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
            std::size_t ldc) {
    if (options_.cuda_fp32_products) {
      check_blas(cublasSgemm(blas_, to_cublas(op_b), to_cublas(op_a), to_int(n), to_int(m),
                             to_int(k), &alpha, b, to_int(ldb), a, to_int(lda), &beta, c,
                             to_int(ldc)),
                 "cublasSgemm");
      return;
    }
    const std::size_t a_rows = op_a == Op::kNo ? m : k;
    const std::size_t a_cols = op_a == Op::kNo ? k : m;
    const std::size_t b_rows = op_b == Op::kNo ? k : n;
    const std::size_t b_cols = op_b == Op::kNo ? n : k;
    STRATA_ASSERT(a_rows * a_cols <= operand_floats_ && b_rows * b_cols <= operand_floats_,
                  "a product's operand beyond the bf16 scratch");
    check(cuda::cast_to_bf16(a, lda, operand_a_, a_cols, a_rows, a_cols, stream_), "cast_to_bf16");
    check(cuda::cast_to_bf16(b, ldb, operand_b_, b_cols, b_rows, b_cols, stream_), "cast_to_bf16");
    check_blas(cublasGemmEx(blas_, to_cublas(op_b), to_cublas(op_a), to_int(n), to_int(m),
                            to_int(k), &alpha, operand_b_, CUDA_R_16BF, to_int(b_cols), operand_a_,
                            CUDA_R_16BF, to_int(a_cols), &beta, c, CUDA_R_32F, to_int(ldc),
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
  }

  HfConfig config_;
  DecoderOptions options_;
  std::vector<UnitSpec> units_;
  Dims dims_;
  LayerLayout layout_;
  HeadLayout head_;
  std::size_t sequences_ = 0, positions_ = 0, rows_ = 0;

  std::int32_t *inputs_ = nullptr, *targets_ = nullptr, *token_offsets_ = nullptr,
               *token_rows_ = nullptr, *position_offsets_ = nullptr, *position_rows_ = nullptr;
  std::uint32_t *row_positions_ = nullptr, *row_first_keys_ = nullptr;
  std::size_t position_table_rows_ = 0;
  float* weights_ = nullptr;
  double* row_loss_ = nullptr;
  std::vector<float*> resid_;
  std::vector<Layer> layers_;
  float *head_norm_ = nullptr, *head_mean_ = nullptr, *head_rstd_ = nullptr;
  float *logits_ = nullptr, *dlogits_ = nullptr;
  float *d_resid_ = nullptr, *d_norm_ = nullptr, *d_att_ = nullptr, *d_qkv_ = nullptr;
  float *d_pre_ = nullptr, *d_act_ = nullptr, *delta_ = nullptr, *tied_grad_ = nullptr;
  float *rope_cos_ = nullptr, *rope_sin_ = nullptr;
  std::size_t rope_half_ = 0;
  __nv_bfloat16 *operand_a_ = nullptr, *operand_b_ = nullptr;
  std::size_t operand_floats_ = 0;
  bool flash_attention_ = false;  // the tensor-core attention (use_flash_attention)
  __nv_bfloat16* attention_scratch_ = nullptr;
  HostRowIndex token_index_, position_index_;
  std::vector<float> host_weights_;
  std::vector<double> host_loss_;
};

}  // namespace

std::unique_ptr<CudaDecoder> make_cuda_decoder(const HfConfig& config,
                                               const DecoderOptions& options,
                                               tiers::Device& device) {
  return std::make_unique<CudaDecoderImpl>(config, options, device);
}

}  // namespace strata::llm::detail
