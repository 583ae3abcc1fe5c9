// The CUDA backend of DecoderModel (decoder_cuda.cpp, built with CUDA only): the host decoder's
// forward and backward over device pointers, for every family (Llama, Mistral, Qwen2, GPT-2).
//   - Matrix products: cuBLAS GemmEx with bf16 operands and fp32 accumulation (tensor cores);
//     operands are rounded to bf16 on the fly into two scratch buffers, outputs stay fp32.
//   - Attention: tiled, no [positions × positions] buffer exists, only one log-sum-exp per
//     (sequence, head, query) is kept for the backward. DecoderOptions::cuda_attention picks the
//     kernels: flash_attention's on the tensor cores (q, k, v and dout rounded to bf16 into a
//     scratch buffer, fp32 softmax and accumulation) or decoder_cuda_kernels' fp32 ones, the
//     reference. kAuto takes the tensor cores unless cuda_fp32_products asks for fp32 throughout
//     or the head_dim is one they do not take.
//   - Everything else (norms, RoPE, MLP activations, embeddings, loss) in fp32 kernels.
// Activations and scratch live in device memory allocated through the tiers::Device (within its
// budget). Each unit call returns once its work is done, so the caller may release the parameter
// views and read the gradients. This header is CUDA-free; DecoderModel checks order and sizes
// before calling in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "examples/gpt/device_bytes.hpp"
#include "examples/llm/decoder_model.hpp"
#include "examples/llm/loss.hpp"

namespace strata::tiers {
class Device;
}

namespace strata::llm::detail {

class CudaDecoder {
 public:
  virtual ~CudaDecoder() = default;

  virtual std::size_t activation_bytes() const = 0;
  virtual std::string_view attention_implementation() const = 0;
  // rows = sequences × positions inputs, targets, loss weights, positions and first keys (the
  // host model's row_position and row_first_key), already checked.
  virtual void set_batch(std::span<const std::int32_t> inputs,
                         std::span<const std::int32_t> targets, std::span<const float> weights,
                         std::span<const std::uint32_t> row_positions,
                         std::span<const std::uint32_t> row_first_keys, std::size_t sequences,
                         std::size_t positions) = 0;
  virtual void forward_embedding(UnitParams params) = 0;
  virtual void forward_layer(std::size_t layer, UnitParams params) = 0;
  virtual void forward_head(UnitParams params, UnitParams shared) = 0;
  virtual LossTotals loss() = 0;
  virtual void backward_head(UnitParams params, UnitGrads grads, UnitParams shared) = 0;
  // Under activation checkpointing the caller runs forward_layer(layer) first, as on the host.
  virtual void backward_layer(std::size_t layer, UnitParams params, UnitGrads grads) = 0;
  virtual void backward_embedding(UnitGrads grads) = 0;
  // Logits of the last forward, copied to the host.
  virtual void copy_logits(std::vector<float>& out) const = 0;
};

// The device memory make_cuda_decoder's backend allocates for `options` (micro-batch × seq_len
// rows, activation checkpointing or not, the tensor-core attention's bf16 scratch or not).
// CUDA-free (decoder_cuda_plan.cpp): the memory plan counts it without a GPU, taking the
// attention plans_tensor_core_attention says (what an sm_80+ GPU runs).
examples::DeviceBytes cuda_decoder_activation_bytes(const HfConfig& config,
                                                    const DecoderOptions& options,
                                                    bool tensor_core_attention);
bool plans_tensor_core_attention(const HfConfig& config, const DecoderOptions& options);

// Throws tiers::CudaError when a CUDA or cuBLAS call fails, tiers::DeviceBudgetError when the
// activations do not fit the device's budget, std::invalid_argument for a head_dim the attention
// kernels do not take (> decoder_cuda_kernels' kMaxAttentionHeadDim, 128) or that
// CudaAttention::kTensorCores asks of the tensor-core kernel and it does not take.
std::unique_ptr<CudaDecoder> make_cuda_decoder(const HfConfig& config,
                                               const DecoderOptions& options,
                                               tiers::Device& device);

}  // namespace strata::llm::detail
