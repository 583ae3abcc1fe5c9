// What the CUDA decoder's two paths share (decoder_cuda_base.cpp): the batch on the device
// (tokens, targets, loss weights, positions, first keys and the embedding's row index), the fp32
// residual stream entering each layer and the head, its fp32 gradient, the embedding forward and
// backward, the RoPE tables and the attention's choice of kernels. The paths derive from it:
//   - decoder_cuda.cpp: the fp32 reference (DecoderOptions::cuda_fp32_products): fp32
//     activations, cuBLAS fp32 products, the host model to fp32 rounding.
//   - decoder_cuda_bf16.cpp: the default: bf16 activations, cuBLASLt bf16 products, fused
//     kernels, the chunked LM-head loss.
// decoder_cuda_plan.cpp counts the buffers allocated here (cuda_decoder_base_bytes) and those of
// each path. Only CUDA-side sources include this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "models/gpt/cuda_backend.hpp"
#include "models/decoder/decoder_cuda.hpp"
#include "models/decoder/decoder_cuda_kernels.hpp"
#include "models/decoder/decoder_impl.hpp"

namespace strata::llm::detail {

inline cuda::ActivationCode activation_code(Activation act) {
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

class CudaDecoderBase : public CudaDecoder, protected examples::CudaBackend {
 public:
  void set_batch(std::span<const std::int32_t> inputs, std::span<const std::int32_t> targets,
                 std::span<const float> weights, std::span<const std::uint32_t> row_positions,
                 std::span<const std::uint32_t> row_first_keys, std::size_t sequences,
                 std::size_t positions) final;
  void forward_embedding(UnitParams params, UnitParamsBf16 bf16) final;
  void backward_embedding(UnitGrads grads) final;
  std::size_t activation_bytes() const final { return allocated_bytes(); }
  tiers::ComputeFence* enable_asynchronous_calls() final { return make_calls_asynchronous(); }

 protected:
  // Throws std::invalid_argument for a head_dim beyond the attention kernels' (decoder_cuda.hpp).
  CudaDecoderBase(const HfConfig& config, const DecoderOptions& options, tiers::Device& device);

  // Rows grouped by an id, each group in row order (a stable counting sort), on the host.
  struct HostRowIndex {
    std::vector<std::int32_t> offsets, rows, next;
    template <typename Id>
    void build(std::span<const Id> ids, std::size_t id_count);
  };

  // Whether this path runs the tensor-core attention, given whether it wants it under kAuto
  // (decoder_cuda.hpp); throws std::invalid_argument when kTensorCores asks for it and the
  // head_dim or the GPU does not take it.
  bool use_flash_attention(bool wanted_by_default) const;
  cuda::AttentionDims attention_dims() const {
    return {sequences_,     positions_,   dims_.heads,    dims_.kv_heads,
            dims_.head_dim, dims_.window, row_first_keys_};
  }
  const float* head_matrix(UnitParams p, UnitParams shared) const {
    return config_.tie_word_embeddings ? shared[kTokenEmbedding].data() : p[head_.lm_head].data();
  }
  // Σ weights in row order, as the host sums them, and its inverse (0 for an empty batch).
  float inverse_loss_weight(double* total_weight) const;

  HfConfig config_;
  DecoderOptions options_;
  std::vector<UnitSpec> units_;
  Dims dims_;
  LayerLayout layout_;
  HeadLayout head_;
  std::size_t sequences_ = 0, positions_ = 0, rows_ = 0;
  std::size_t max_rows_ = 0;  // micro_batch · seq_len: what the buffers hold

  // The batch (set_batch).
  std::int32_t *inputs_ = nullptr, *targets_ = nullptr, *token_offsets_ = nullptr,
               *token_rows_ = nullptr, *position_offsets_ = nullptr, *position_rows_ = nullptr;
  std::uint32_t *row_positions_ = nullptr, *row_first_keys_ = nullptr;
  std::size_t position_table_rows_ = 0;
  float* weights_ = nullptr;
  double* row_loss_ = nullptr;
  std::vector<float> host_weights_;
  std::vector<double> host_loss_;
  HostRowIndex token_index_, position_index_;

  // The fp32 residual stream entering each layer and the head, its gradient, the tied head's
  // share of the embedding gradient, the RoPE tables (positions [0, seq_len)).
  std::vector<float*> resid_;
  float* d_resid_ = nullptr;
  float* tied_grad_ = nullptr;
  float *rope_cos_ = nullptr, *rope_sin_ = nullptr;
  std::size_t rope_half_ = 0;
};

// The default, bf16 path (decoder_cuda_bf16.cpp); make_cuda_decoder picks it unless
// cuda_fp32_products asks for the reference.
std::unique_ptr<CudaDecoder> make_cuda_bf16_decoder(const HfConfig& config,
                                                    const DecoderOptions& options,
                                                    tiers::Device& device);

}  // namespace strata::llm::detail
