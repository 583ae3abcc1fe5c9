// The CUDA decoder's fp32 reference path (DecoderOptions::cuda_fp32_products): fp32 activations,
// cuBLAS fp32 products (no TF32), the fp32 kernels of decoder_cuda_kernels.cu on one stream, and
// either attention (the fp32 tiled one by default, the tensor-core one through its fp32 interface
// when asked). Mirrors decoder_layer.cpp and decoder_model.cpp step for step (same buffers, same
// order, same family switches), so it gives the host model to fp32 rounding; the bf16 path
// (decoder_cuda_bf16.cpp) is tested against it and the host. make_cuda_decoder picks the path.
//
// Row-major products on column-major cuBLAS: a row-major matrix is its transpose in column-major,
// so C = op(A)·op(B) (row-major) is computed as Cᵀ = op(B)ᵀ·op(A)ᵀ, i.e. Sgemm with the operands
// swapped and m, n exchanged. Atomics are not allowed, so on one stream the results are bitwise
// reproducible on the same GPU.
#include "models/decoder/decoder_cuda.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "base/assert.hpp"
#include "models/decoder/decoder_cuda_base.hpp"
#include "models/decoder/flash_attention.hpp"
#include "models/decoder/linear.hpp"
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

// A row-major view with a row stride, on the device.
struct View {
  const float* data;
  std::size_t ld;
};
struct MutView {
  float* data;
  std::size_t ld;
};

class CudaDecoderFp32 final : public CudaDecoderBase {
 public:
  CudaDecoderFp32(const HfConfig& config, const DecoderOptions& options, tiers::Device& device)
      : CudaDecoderBase(config, options, device) {
    // kAuto keeps the fp32 attention: this path stays fp32 end to end.
    flash_attention_ = use_flash_attention(false);
    allocate_buffers();
  }

  std::string_view attention_implementation() const override {
    return flash_attention_ ? "flash-attention, bf16 tensor cores" : "tiled fp32, CUDA cores";
  }

  void forward_layer(std::size_t layer, UnitParams p, UnitParamsBf16 /*bf16*/) override {
    set_device();
    Layer& a = layer_buffers(layer);
    const float* x = resid_[layer];
    attention_inputs(p, x, a);
    attention_forward(a);
    attention_output_and_mlp(p, x, a, resid_[layer + 1]);
    end_call();
  }

  void forward_head(UnitParams p, UnitParams shared, UnitBf16 /*bf16*/) override {
    set_device();
    const std::size_t d = dims_.hidden;
    norm_forward(p[head_.norm_weight].data(), tensor(p, head_.norm_bias), resid_.back(),
                 head_norm_, head_mean_, head_rstd_);
    gemm(Op::kNo, Op::kYes, rows_, dims_.vocab, d, 1.0f, head_norm_, d, head_matrix(p, shared), d,
         0.0f, logits_, dims_.vocab);
    end_call();
  }

  LossTotals loss() override {
    set_device();
    LossTotals totals;
    const float inv_weight = inverse_loss_weight(&totals.weight);
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

  void backward_head(UnitParams p, UnitGrads g, UnitParams shared, UnitBf16 /*bf16*/) override {
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
    end_call();
  }

  // On entry d_resid holds dL/d(layer output); on exit dL/d(layer input).
  void backward_layer(std::size_t layer, UnitParams p, UnitGrads g,
                      UnitParamsBf16 /*bf16*/) override {
    set_device();
    Layer& a = layer_buffers(layer);
    backward_mlp(p, g, a);
    backward_attention(p, g, a);
    backward_attention_inputs(p, g, a, resid_[layer]);
    end_call();
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
  struct Layer {
    float *norm1, *norm1_mean, *norm1_rstd, *qkv, *lse, *att, *mid, *norm2, *norm2_mean,
        *norm2_rstd, *pre, *act;
  };

  void allocate_buffers() {
    const std::size_t rows = std::size_t{options_.micro_batch} * options_.seq_len;
    const std::size_t d = dims_.hidden;
    const std::size_t vocab = dims_.vocab;
    const std::size_t lse = std::size_t{options_.micro_batch} * dims_.heads * options_.seq_len;
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
    d_norm_ = allocate<float>(rows * d);
    d_att_ = allocate<float>(rows * dims_.q_width);
    d_qkv_ = allocate<float>(rows * dims_.qkv_width);
    d_pre_ = allocate<float>(rows * dims_.pre_width);
    d_act_ = allocate<float>(rows * dims_.inner);
    delta_ = allocate<float>(lse);
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

  // backward_layer's steps, as in decoder_layer.cpp. MLP: d_resid gains norm2's input gradient
  // (d_norm on the way).
  void backward_mlp(UnitParams p, UnitGrads g, Layer& a) {
    const LayerLayout& l = layout_;
    const std::size_t d = dims_.hidden;
    const std::size_t inner = dims_.inner;
    const std::size_t n = rows_;
    const View dout{d_resid_, d};
    const View norm2{a.norm2, d};
    const cuda::ActivationCode act = activation_code(dims_.activation);

    // MLP: d_norm = dL/d(norm2 output).
    if (dims_.gpt2) {
      linear_backward(Layout::kInOut, dout, {a.act, inner}, tensor(p, l.proj_weight),
                      {d_act_, inner}, tensor(g, l.proj_weight), tensor(g, l.proj_bias), n, inner,
                      d, Accumulate::kNo);
      check(cuda::plain_backward(act, d_act_, a.pre, d_pre_, n * inner, stream_), "plain_backward");
      linear_backward(Layout::kInOut, {d_pre_, inner}, norm2, tensor(p, l.fc_weight), {d_norm_, d},
                      tensor(g, l.fc_weight), tensor(g, l.fc_bias), n, d, inner, Accumulate::kNo);
    } else {
      const std::size_t ld = dims_.pre_width;
      linear_backward(Layout::kOutIn, dout, {a.act, inner}, tensor(p, l.down_weight),
                      {d_act_, inner}, tensor(g, l.down_weight), nullptr, n, inner, d,
                      Accumulate::kNo);
      check(cuda::gated_backward(act, d_act_, a.pre, d_pre_, n, inner, stream_), "gated_backward");
      linear_backward(Layout::kOutIn, {d_pre_, ld}, norm2, tensor(p, l.gate_weight), {d_norm_, d},
                      tensor(g, l.gate_weight), nullptr, n, d, inner, Accumulate::kNo);
      linear_backward(Layout::kOutIn, {d_pre_ + inner, ld}, norm2, tensor(p, l.up_weight),
                      {d_norm_, d}, tensor(g, l.up_weight), nullptr, n, d, inner, Accumulate::kYes);
    }
    norm_backward(tensor(p, l.norm2_weight), d_norm_, a.mid, a.norm2_mean, a.norm2_rstd, d_resid_,
                  tensor(g, l.norm2_weight), tensor(g, l.norm2_bias));
  }

  // o_proj and attention: d_att, then d_qkv.
  void backward_attention(UnitParams p, UnitGrads g, Layer& a) {
    const LayerLayout& l = layout_;
    const std::size_t d = dims_.hidden;
    const std::size_t n = rows_;
    const View dout{d_resid_, d};

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
  }

  // From d_qkv: the q | k | v projections and norm1 (of x, the layer input) into d_resid.
  void backward_attention_inputs(UnitParams p, UnitGrads g, Layer& a, const float* x) {
    const LayerLayout& l = layout_;
    const std::size_t d = dims_.hidden;
    const std::size_t n = rows_;
    const std::size_t ld = dims_.qkv_width;
    const std::size_t k_offset = dims_.q_width;
    const std::size_t v_offset = dims_.q_width + dims_.kv_width;

    // Projections into q | k | v: d_norm = dL/d(norm1 output).
    const View norm1{a.norm1, d};
    if (dims_.gpt2) {
      linear_backward(Layout::kInOut, {d_qkv_, ld}, norm1, tensor(p, l.qkv_weight), {d_norm_, d},
                      tensor(g, l.qkv_weight), tensor(g, l.qkv_bias), n, d, 3 * d, Accumulate::kNo);
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
    norm_backward(tensor(p, l.norm1_weight), d_norm_, x, a.norm1_mean, a.norm1_rstd, d_resid_,
                  tensor(g, l.norm1_weight), tensor(g, l.norm1_bias));
  }

  Layer& layer_buffers(std::size_t layer) {
    return options_.activation_checkpointing ? layers_.front() : layers_[layer];
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

  // Row-major C[m×n] = alpha·op(A)·op(B) + beta·C in fp32 (see the top of the file).
  void gemm(Op op_a, Op op_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
            const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
            std::size_t ldc) {
    check_blas(cublasSgemm(blas_, to_cublas(op_b), to_cublas(op_a), to_int(n), to_int(m),
                           to_int(k), &alpha, b, to_int(ldb), a, to_int(lda), &beta, c,
                           to_int(ldc)),
               "cublasSgemm");
  }

  std::vector<Layer> layers_;
  float *head_norm_ = nullptr, *head_mean_ = nullptr, *head_rstd_ = nullptr;
  float *logits_ = nullptr, *dlogits_ = nullptr;
  float *d_norm_ = nullptr, *d_att_ = nullptr, *d_qkv_ = nullptr;
  float *d_pre_ = nullptr, *d_act_ = nullptr, *delta_ = nullptr;
  bool flash_attention_ = false;  // the tensor-core attention (use_flash_attention)
  __nv_bfloat16* attention_scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<CudaDecoder> make_cuda_decoder(const HfConfig& config,
                                               const DecoderOptions& options,
                                               tiers::Device& device) {
  if (options.cuda_fp32_products) return std::make_unique<CudaDecoderFp32>(config, options, device);
  return make_cuda_bf16_decoder(config, options, device);
}

}  // namespace strata::llm::detail
