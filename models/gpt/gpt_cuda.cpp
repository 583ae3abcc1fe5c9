// GptModel's CUDA backend: device activations, cuBLAS products and the kernels of cuda_kernels.cu
// on one stream. Mirrors gpt_model.cpp's host path step for step (same buffers, same order).
//
// Row-major products on column-major cuBLAS: a row-major matrix is its transpose in column-major,
// so C = op(A)·op(B) (row-major) is computed as Cᵀ = op(B)ᵀ·op(A)ᵀ, i.e. cublasSgemm with the
// operands swapped and m, n exchanged. cuBLAS runs in its default math mode (fp32, no TF32) with
// atomics not allowed: on one stream its results are bitwise reproducible on the same GPU.
#include "models/gpt/gpt_cuda.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "base/assert.hpp"
#include "models/gpt/cuda_backend.hpp"
#include "models/gpt/cuda_kernels.hpp"
#include "models/gpt/gpt_spec.hpp"
#include "tiers/device/cuda_device.hpp"
#include "tiers/device/device.hpp"

namespace strata::gpt::detail {
namespace {

enum class Op { kNo, kYes };

cublasOperation_t to_cublas(Op op) {
  return op == Op::kYes ? CUBLAS_OP_T : CUBLAS_OP_N;
}

int to_int(std::size_t value) {
  STRATA_ASSERT(value <= 0x7fffffffu, "matrix dimension beyond cuBLAS's int");
  return static_cast<int>(value);
}

class CudaGptImpl final : public CudaGpt, private examples::CudaBackend {
 public:
  CudaGptImpl(const runtime::ModelConfig& config, tiers::Device& device)
      : CudaBackend(device, "GPT model"), config_(config) {
    STRATA_ASSERT(device.kind() == tiers::DeviceKind::kCuda);
    const std::size_t rows = std::size_t{config.micro_batch} * config.seq_len;
    const std::size_t d = config.d_model;
    const std::size_t prob =
        std::size_t{config.micro_batch} * config.heads * config.seq_len * config.seq_len;
    inputs_ = allocate<std::int32_t>(rows);
    targets_ = allocate<std::int32_t>(rows);
    token_offsets_ = allocate<std::int32_t>(std::size_t{config.vocab} + 1);
    token_rows_ = allocate<std::int32_t>(rows);
    row_loss_ = allocate<double>(rows);
    for (std::size_t l = 0; l <= config.layers; ++l) resid_.push_back(allocate<float>(rows * d));
    blocks_.resize(config.layers);
    for (Block& block : blocks_) {
      block.ln1_out = allocate<float>(rows * d);
      block.ln1_mean = allocate<float>(rows);
      block.ln1_rstd = allocate<float>(rows);
      block.qkv = allocate<float>(rows * 3 * d);
      block.prob = allocate<float>(prob);
      block.att_out = allocate<float>(rows * d);
      block.resid_mid = allocate<float>(rows * d);
      block.ln2_out = allocate<float>(rows * d);
      block.ln2_mean = allocate<float>(rows);
      block.ln2_rstd = allocate<float>(rows);
      block.fc_pre = allocate<float>(rows * 4 * d);
      block.fc_tanh = allocate<float>(rows * 4 * d);
      block.fc_act = allocate<float>(rows * 4 * d);
    }
    lnf_out_ = allocate<float>(rows * d);
    lnf_mean_ = allocate<float>(rows);
    lnf_rstd_ = allocate<float>(rows);
    logits_ = allocate<float>(rows * config.vocab);
    dlogits_ = allocate<float>(rows * config.vocab);
    d_resid_ = allocate<float>(rows * d);
    d_norm_ = allocate<float>(rows * d);
    d_att_ = allocate<float>(rows * d);
    d_qkv_ = allocate<float>(rows * 3 * d);
    d_fc_ = allocate<float>(rows * 4 * d);
    attention_scratch_ = allocate<float>(prob);
    if (config.tied_head) tied_wte_grad_ = allocate<float>(std::size_t{config.vocab} * d);
    STRATA_ASSERT(allocated_bytes() == cuda_gpt_activation_bytes(config).allocated,
                  "cuda_activation_plan.cpp counts other buffers than these");
  }

  ~CudaGptImpl() override = default;
  CudaGptImpl(const CudaGptImpl&) = delete;
  CudaGptImpl& operator=(const CudaGptImpl&) = delete;

  std::size_t activation_bytes() const override { return allocated_bytes(); }
  tiers::ComputeFence* enable_asynchronous_calls() override { return make_calls_asynchronous(); }

  void set_batch(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets,
                 std::size_t sequences) override {
    set_device();
    sequences_ = sequences;
    rows_ = inputs.size();
    // Rows grouped by token, each group in row order (a stable counting sort): the embedding
    // backward sums every token's rows in this fixed order.
    const std::size_t vocab = config_.vocab;
    host_offsets_.assign(vocab + 1, 0);
    for (const std::int32_t token : inputs) ++host_offsets_[static_cast<std::size_t>(token) + 1];
    for (std::size_t v = 0; v < vocab; ++v) host_offsets_[v + 1] += host_offsets_[v];
    host_rows_.resize(rows_);
    host_next_.assign(host_offsets_.begin(), host_offsets_.end() - 1);
    for (std::size_t row = 0; row < rows_; ++row) {
      host_rows_[static_cast<std::size_t>(host_next_[static_cast<std::size_t>(inputs[row])]++)] =
          static_cast<std::int32_t>(row);
    }
    copy_in(inputs_, inputs.data(), rows_);
    copy_in(targets_, targets.data(), rows_);
    copy_in(token_offsets_, host_offsets_.data(), vocab + 1);
    copy_in(token_rows_, host_rows_.data(), rows_);
    finish();  // the host vectors may change with the next batch
  }

  void forward_embedding(UnitParams params) override {
    set_device();
    check(cuda::embedding_forward(inputs_, params[kTokenEmbedding].data(),
                                  params[kPositionEmbedding].data(), resid_[0], rows_,
                                  config_.seq_len, config_.d_model, stream_),
          "embedding_forward");
    end_call();
  }

  void forward_block(std::size_t layer, UnitParams params) override {
    set_device();
    const std::size_t d = config_.d_model;
    const std::size_t rows = rows_;
    Block& a = blocks_[layer];
    const float* x = resid_[layer];
    float* out = resid_[layer + 1];
    check(cuda::layernorm_forward(x, params[kLn1Weight].data(), params[kLn1Bias].data(), a.ln1_out,
                                  a.ln1_mean, a.ln1_rstd, rows, d, stream_),
          "layernorm_forward");
    linear_forward(a.ln1_out, params[kAttnWeight].data(), params[kAttnBias].data(), a.qkv, rows, d,
                   3 * d);
    attention_forward(a.qkv, a.prob, a.att_out);
    linear_forward(a.att_out, params[kAttnProjWeight].data(), params[kAttnProjBias].data(),
                   a.resid_mid, rows, d, d);
    check(cuda::add_in_place(a.resid_mid, x, rows * d, stream_), "add_in_place");
    check(cuda::layernorm_forward(a.resid_mid, params[kLn2Weight].data(), params[kLn2Bias].data(),
                                  a.ln2_out, a.ln2_mean, a.ln2_rstd, rows, d, stream_),
          "layernorm_forward");
    linear_forward(a.ln2_out, params[kFcWeight].data(), params[kFcBias].data(), a.fc_pre, rows, d,
                   4 * d);
    check(cuda::gelu_forward(a.fc_pre, a.fc_act, a.fc_tanh, rows * 4 * d, stream_), "gelu_forward");
    linear_forward(a.fc_act, params[kMlpProjWeight].data(), params[kMlpProjBias].data(), out, rows,
                   4 * d, d);
    check(cuda::add_in_place(out, a.resid_mid, rows * d, stream_), "add_in_place");
    end_call();
  }

  void forward_head(UnitParams params, UnitParams shared) override {
    set_device();
    const std::size_t d = config_.d_model;
    check(cuda::layernorm_forward(resid_[config_.layers], params[kLnfWeight].data(),
                                  params[kLnfBias].data(), lnf_out_, lnf_mean_, lnf_rstd_, rows_, d,
                                  stream_),
          "layernorm_forward");
    const float* head =
        config_.tied_head ? shared[kTokenEmbedding].data() : params[kLmHeadWeight].data();
    gemm(Op::kNo, Op::kYes, rows_, config_.vocab, d, 1.0f, lnf_out_, d, head, d, 0.0f, logits_,
         config_.vocab);
    end_call();
  }

  double loss() override {
    set_device();
    check(
        cuda::cross_entropy(logits_, targets_, dlogits_, row_loss_, rows_, config_.vocab, stream_),
        "cross_entropy");
    host_loss_.resize(rows_);
    check(cudaMemcpyAsync(host_loss_.data(), row_loss_, rows_ * sizeof(double),
                          cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync");
    finish();
    double total = 0.0;  // rows in order, as on the host
    for (const double row : host_loss_) total += row;
    return total / static_cast<double>(rows_);
  }

  void backward_head(UnitParams params, UnitGrads grads, UnitParams shared) override {
    set_device();
    const std::size_t d = config_.d_model;
    const std::size_t vocab = config_.vocab;
    const float* head =
        config_.tied_head ? shared[kTokenEmbedding].data() : params[kLmHeadWeight].data();
    float* dhead = config_.tied_head ? tied_wte_grad_ : grads[kLmHeadWeight].data();
    gemm(Op::kNo, Op::kNo, rows_, d, vocab, 1.0f, dlogits_, vocab, head, d, 0.0f, d_norm_, d);
    gemm(Op::kYes, Op::kNo, vocab, d, rows_, 1.0f, dlogits_, vocab, lnf_out_, d, 0.0f, dhead, d);
    check(cudaMemsetAsync(d_resid_, 0, rows_ * d * sizeof(float), stream_), "cudaMemsetAsync");
    check(cuda::layernorm_backward(d_norm_, resid_[config_.layers], lnf_mean_, lnf_rstd_,
                                   params[kLnfWeight].data(), d_resid_, grads[kLnfWeight].data(),
                                   grads[kLnfBias].data(), rows_, d, stream_),
          "layernorm_backward");
    end_call();
  }

  void backward_block(std::size_t layer, UnitParams params, UnitGrads grads) override {
    set_device();
    const std::size_t d = config_.d_model;
    const std::size_t rows = rows_;
    Block& a = blocks_[layer];
    linear_backward(d_resid_, a.fc_act, params[kMlpProjWeight].data(), d_fc_,
                    grads[kMlpProjWeight].data(), grads[kMlpProjBias].data(), rows, 4 * d, d);
    check(cuda::gelu_backward(d_fc_, a.fc_pre, a.fc_tanh, d_fc_, rows * 4 * d, stream_),
          "gelu_backward");
    linear_backward(d_fc_, a.ln2_out, params[kFcWeight].data(), d_norm_, grads[kFcWeight].data(),
                    grads[kFcBias].data(), rows, d, 4 * d);
    check(cuda::layernorm_backward(d_norm_, a.resid_mid, a.ln2_mean, a.ln2_rstd,
                                   params[kLn2Weight].data(), d_resid_, grads[kLn2Weight].data(),
                                   grads[kLn2Bias].data(), rows, d, stream_),
          "layernorm_backward");
    linear_backward(d_resid_, a.att_out, params[kAttnProjWeight].data(), d_att_,
                    grads[kAttnProjWeight].data(), grads[kAttnProjBias].data(), rows, d, d);
    attention_backward(d_att_, a.qkv, a.prob, d_qkv_);
    linear_backward(d_qkv_, a.ln1_out, params[kAttnWeight].data(), d_norm_,
                    grads[kAttnWeight].data(), grads[kAttnBias].data(), rows, d, 3 * d);
    check(cuda::layernorm_backward(d_norm_, resid_[layer], a.ln1_mean, a.ln1_rstd,
                                   params[kLn1Weight].data(), d_resid_, grads[kLn1Weight].data(),
                                   grads[kLn1Bias].data(), rows, d, stream_),
          "layernorm_backward");
    end_call();
  }

  void backward_embedding(UnitGrads grads) override {
    set_device();
    check(cuda::embedding_backward(
              d_resid_, token_offsets_, token_rows_, config_.tied_head ? tied_wte_grad_ : nullptr,
              grads[kTokenEmbedding].data(), grads[kPositionEmbedding].data(), sequences_,
              config_.seq_len, config_.vocab, config_.d_model, stream_),
          "embedding_backward");
    end_call();
  }

  void copy_logits(std::vector<float>& out) const override {
    set_device();
    out.resize(rows_ * config_.vocab);
    check(cudaMemcpyAsync(out.data(), logits_, out.size() * sizeof(float), cudaMemcpyDeviceToHost,
                          stream_),
          "cudaMemcpyAsync");
    finish();
  }

 private:
  struct Block {
    float *ln1_out, *ln1_mean, *ln1_rstd, *qkv, *prob, *att_out;
    float *resid_mid, *ln2_out, *ln2_mean, *ln2_rstd, *fc_pre, *fc_tanh, *fc_act;
  };

  // Row-major C[m×n] = alpha·op(A)·op(B) + beta·C (see the top of the file).
  void gemm(Op op_a, Op op_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
            const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
            std::size_t ldc) {
    check_blas(cublasSgemm(blas_, to_cublas(op_b), to_cublas(op_a), to_int(n), to_int(m), to_int(k),
                           &alpha, b, to_int(ldb), a, to_int(lda), &beta, c, to_int(ldc)),
               "cublasSgemm");
  }

  // `count` products at once; operand i starts `stride_*` floats after operand i - 1.
  void gemm_strided(Op op_a, Op op_b, std::size_t m, std::size_t n, std::size_t k, float alpha,
                    const float* a, std::size_t lda, std::size_t stride_a, const float* b,
                    std::size_t ldb, std::size_t stride_b, float beta, float* c, std::size_t ldc,
                    std::size_t stride_c, std::size_t count) {
    check_blas(cublasSgemmStridedBatched(blas_, to_cublas(op_b), to_cublas(op_a), to_int(n),
                                         to_int(m), to_int(k), &alpha, b, to_int(ldb),
                                         static_cast<long long>(stride_b), a, to_int(lda),
                                         static_cast<long long>(stride_a), &beta, c, to_int(ldc),
                                         static_cast<long long>(stride_c), to_int(count)),
               "cublasSgemmStridedBatched");
  }

  void linear_forward(const float* x, const float* w, const float* bias, float* out,
                      std::size_t rows, std::size_t in_dim, std::size_t out_dim) {
    check(cuda::broadcast_rows(bias, out, rows, out_dim, stream_), "broadcast_rows");
    gemm(Op::kNo, Op::kNo, rows, out_dim, in_dim, 1.0f, x, in_dim, w, out_dim, 1.0f, out, out_dim);
  }

  // dx = dout·wᵀ, dw = xᵀ·dout, dbias = Σ_rows dout.
  void linear_backward(const float* dout, const float* x, const float* w, float* dx, float* dw,
                       float* dbias, std::size_t rows, std::size_t in_dim, std::size_t out_dim) {
    gemm(Op::kNo, Op::kYes, rows, in_dim, out_dim, 1.0f, dout, out_dim, w, out_dim, 0.0f, dx,
         in_dim);
    gemm(Op::kYes, Op::kNo, in_dim, out_dim, rows, 1.0f, x, in_dim, dout, out_dim, 0.0f, dw,
         out_dim);
    check(cuda::column_sums(dout, rows, out_dim, dbias, stream_), "column_sums");
  }

  // Per sequence, the heads as one strided batch: head h's Q, K, V start h·head_dim floats into
  // the row of qkv (row stride 3·d), its probabilities h·seq² floats into prob.
  void attention_forward(const float* qkv, float* prob, float* out) {
    const std::size_t seq = config_.seq_len;
    const std::size_t d = config_.d_model;
    const std::size_t heads = config_.heads;
    const std::size_t head_dim = d / heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    for (std::size_t b = 0; b < sequences_; ++b) {
      const float* q = qkv + b * seq * 3 * d;
      gemm_strided(Op::kNo, Op::kYes, seq, seq, head_dim, scale, q, 3 * d, head_dim, q + d, 3 * d,
                   head_dim, 0.0f, prob + b * heads * seq * seq, seq, seq * seq, heads);
    }
    check(cuda::causal_softmax_forward(prob, sequences_ * heads, seq, stream_),
          "causal_softmax_forward");
    for (std::size_t b = 0; b < sequences_; ++b) {
      const float* v = qkv + b * seq * 3 * d + 2 * d;
      gemm_strided(Op::kNo, Op::kNo, seq, head_dim, seq, 1.0f, prob + b * heads * seq * seq, seq,
                   seq * seq, v, 3 * d, head_dim, 0.0f, out + b * seq * d, d, head_dim, heads);
    }
  }

  void attention_backward(const float* dout, const float* qkv, const float* prob, float* dqkv) {
    const std::size_t seq = config_.seq_len;
    const std::size_t d = config_.d_model;
    const std::size_t heads = config_.heads;
    const std::size_t head_dim = d / heads;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    float* ds = attention_scratch_;
    for (std::size_t b = 0; b < sequences_; ++b) {
      const float* v = qkv + b * seq * 3 * d + 2 * d;
      const float* dout_b = dout + b * seq * d;
      const float* p = prob + b * heads * seq * seq;
      float* ds_b = ds + b * heads * seq * seq;
      float* dv = dqkv + b * seq * 3 * d + 2 * d;
      // dP = dO·Vᵀ; dV = Pᵀ·dO.
      gemm_strided(Op::kNo, Op::kYes, seq, seq, head_dim, 1.0f, dout_b, d, head_dim, v, 3 * d,
                   head_dim, 0.0f, ds_b, seq, seq * seq, heads);
      gemm_strided(Op::kYes, Op::kNo, seq, head_dim, seq, 1.0f, p, seq, seq * seq, dout_b, d,
                   head_dim, 0.0f, dv, 3 * d, head_dim, heads);
    }
    check(cuda::causal_softmax_backward(prob, ds, sequences_ * heads, seq, stream_),
          "causal_softmax_backward");
    for (std::size_t b = 0; b < sequences_; ++b) {
      const float* q = qkv + b * seq * 3 * d;
      const float* k = q + d;
      const float* ds_b = ds + b * heads * seq * seq;
      float* dq = dqkv + b * seq * 3 * d;
      float* dk = dq + d;
      // S = scale·Q·Kᵀ: dQ = scale·dS·K, dK = scale·dSᵀ·Q.
      gemm_strided(Op::kNo, Op::kNo, seq, head_dim, seq, scale, ds_b, seq, seq * seq, k, 3 * d,
                   head_dim, 0.0f, dq, 3 * d, head_dim, heads);
      gemm_strided(Op::kYes, Op::kNo, seq, head_dim, seq, scale, ds_b, seq, seq * seq, q, 3 * d,
                   head_dim, 0.0f, dk, 3 * d, head_dim, heads);
    }
  }

  runtime::ModelConfig config_;
  std::size_t sequences_ = 0;
  std::size_t rows_ = 0;

  std::int32_t *inputs_, *targets_, *token_offsets_, *token_rows_;
  double* row_loss_;
  std::vector<float*> resid_;
  std::vector<Block> blocks_;
  float *lnf_out_, *lnf_mean_, *lnf_rstd_, *logits_, *dlogits_;
  float *d_resid_, *d_norm_, *d_att_, *d_qkv_, *d_fc_, *attention_scratch_;
  float* tied_wte_grad_ = nullptr;
  std::vector<std::int32_t> host_offsets_, host_rows_, host_next_;  // the rows-by-token index
  std::vector<double> host_loss_;
};

}  // namespace

std::unique_ptr<CudaGpt> make_cuda_gpt(const runtime::ModelConfig& config, tiers::Device& device) {
  return std::make_unique<CudaGptImpl>(config, device);
}

}  // namespace strata::gpt::detail
