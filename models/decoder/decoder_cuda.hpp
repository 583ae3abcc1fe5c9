// The CUDA backend of DecoderModel (built with CUDA only): the host decoder's forward and
// backward over device pointers, for every family (Llama, Mistral, Qwen2, GPT-2). Two paths over
// one base (decoder_cuda_base.hpp: the batch, the fp32 residual stream, the embedding):
//   - bf16, the default (decoder_cuda_bf16.cpp): activations stored in bf16 (norm outputs,
//     q | k | v, attention output, MLP pre-activations and activations), the residual stream and
//     its gradient in fp32; products on cuBLASLt (cublaslt_gemm.hpp) with bf16 operands, fp32
//     accumulation, bias and residual adds in their epilogues, weights read from the Engine's
//     gathered bf16 copy (or rounded from the fp32 views once per unit call); fused bf16 kernels (fused_kernels.hpp); attention on the tensor cores through
//     flash_attention.hpp's bf16 interface (fp32 tiled kernels over widened copies for a head_dim
//     they do not take, or when asked); the LM head and its loss in row chunks, so the
//     [rows × vocab] logits never exist whole. See [Note: bf16 decoder] in decoder_cuda_bf16.cpp.
//   - fp32 reference (decoder_cuda.cpp, DecoderOptions::cuda_fp32_products): fp32 activations
//     and cuBLAS fp32 products; the host model to fp32 rounding.
// Activations and scratch live in device memory allocated through the tiers::Device (within its
// budget). Each unit call returns once its work is done, so the caller may release the parameter
// views and read the gradients; after enable_asynchronous_calls() it returns once its work is
// queued on the backend's stream, and the caller waits through the fence ([Note: asynchronous
// unit calls] in docs/design.md). This header is CUDA-free; DecoderModel checks order and sizes
// before calling in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "models/gpt/device_bytes.hpp"
#include "models/decoder/decoder_model.hpp"
#include "models/decoder/loss.hpp"

namespace strata::tiers {
class ComputeFence;
class Device;
}

namespace strata::llm::detail {

class CudaDecoder {
 public:
  virtual ~CudaDecoder() = default;

  virtual std::size_t activation_bytes() const = 0;
  virtual std::string_view attention_implementation() const = 0;
  // From now on the unit calls (forward_*, backward_*) return with their work queued; the fence
  // tells when it is done. loss(), copy_logits() and set_batch() still return done.
  virtual tiers::ComputeFence* enable_asynchronous_calls() = 0;
  // rows = sequences × positions inputs, targets, loss weights, positions and first keys (the
  // host model's row_position and row_first_key), already checked.
  virtual void set_batch(std::span<const std::int32_t> inputs,
                         std::span<const std::int32_t> targets, std::span<const float> weights,
                         std::span<const std::uint32_t> row_positions,
                         std::span<const std::uint32_t> row_first_keys, std::size_t sequences,
                         std::size_t positions) = 0;
  // The token (and GPT-2's position) embedding rows, from the fp32 views or, where those are
  // empty, the bf16 views (the same values widened: the same bits).
  virtual void forward_embedding(UnitParams params, UnitParamsBf16 bf16) = 0;
  // `bf16`: the same parameters as bf16 bits (DecoderModel's UnitBf16), or empty; the fp32
  // reference path ignores them.
  virtual void forward_layer(std::size_t layer, UnitParams params, UnitParamsBf16 bf16) = 0;
  virtual void forward_head(UnitParams params, UnitParams shared, UnitBf16 bf16) = 0;
  virtual LossTotals loss() = 0;
  virtual void backward_head(UnitParams params, UnitGrads grads, UnitParams shared,
                             UnitBf16 bf16) = 0;
  // Under activation checkpointing the caller runs forward_layer(layer) first, as on the host.
  virtual void backward_layer(std::size_t layer, UnitParams params, UnitGrads grads,
                              UnitParamsBf16 bf16) = 0;
  virtual void backward_embedding(UnitGrads grads) = 0;
  // Logits of the last forward, copied to the host.
  virtual void copy_logits(std::vector<float>& out) const = 0;
};

// The device memory make_cuda_decoder's backend allocates for `options` (micro-batch × seq_len
// rows, the path, activation checkpointing or not, the tensor-core attention or not).
// CUDA-free (decoder_cuda_plan.cpp): the memory plan counts it without a GPU, taking the
// attention plans_tensor_core_attention says (what an sm_80+ GPU runs).
examples::DeviceBytes cuda_decoder_activation_bytes(const HfConfig& config,
                                                    const DecoderOptions& options,
                                                    bool tensor_core_attention);
bool plans_tensor_core_attention(const HfConfig& config, const DecoderOptions& options);
// The part both paths allocate (decoder_cuda_base.hpp).
examples::DeviceBytes cuda_decoder_base_bytes(const HfConfig& config,
                                              const DecoderOptions& options);
// Rows per chunk of the bf16 path's LM-head loss: options.cuda_loss_chunk_rows, or about 2^26
// logits per chunk (a multiple of 64 rows when that many fit), at most micro_batch · seq_len.
std::size_t cuda_loss_chunk_rows(const HfConfig& config, const DecoderOptions& options);
// Bytes of the bf16 path's cuBLASLt workspace, allocated within the device budget: what Hopper's
// cuBLAS recommends (32 MiB, cublaslt_gemm.hpp's LtGemm::kWorkspaceBytes), or less for a small
// model: one fp32 copy of its widest layer product's output (rows × max(pre, qkv, hidden)), the
// most split-K partial sums need where splitting pays (few output tiles), so the plan of a tiny
// model grows with its rows, not with a constant.
std::size_t cuda_gemm_workspace_bytes(const HfConfig& config, const DecoderOptions& options);
// bf16 elements of the bf16 path's weight cache: the largest unit's matrices (a layer's, or the
// head's vocab × hidden) and the biases its bf16 outputs take.
std::size_t cuda_weight_cache_elements(const HfConfig& config);

// Throws tiers::CudaError when a CUDA or cuBLAS call fails, tiers::DeviceBudgetError when the
// activations do not fit the device's budget, std::invalid_argument for a head_dim the attention
// kernels do not take (> decoder_cuda_kernels' kMaxAttentionHeadDim, 128) or that
// CudaAttention::kTensorCores asks of the tensor-core kernel and it does not take.
std::unique_ptr<CudaDecoder> make_cuda_decoder(const HfConfig& config,
                                               const DecoderOptions& options,
                                               tiers::Device& device);

}  // namespace strata::llm::detail
