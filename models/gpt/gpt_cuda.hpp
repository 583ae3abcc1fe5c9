// The CUDA backend of GptModel (gpt_cuda.cpp, built with CUDA only): the same forward and backward
// as the host path, over device pointers. Activations and scratch live in device memory allocated
// through the tiers::Device (within its budget); matrix products run on cuBLAS and everything else
// on the kernels of cuda_kernels.cu, all on the backend's own stream. Each unit call returns once
// its work is done on the device, so the caller may release the parameter views and read the
// gradients; after enable_asynchronous_calls() once it is queued, the caller waiting through the
// fence ([Note: asynchronous unit calls] in docs/design.md). This header is CUDA-free; GptModel
// checks order and sizes before calling in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "models/gpt/device_bytes.hpp"
#include "models/gpt/gpt_model.hpp"

namespace strata::tiers {
class ComputeFence;
}

namespace strata::gpt::detail {

class CudaGpt {
 public:
  virtual ~CudaGpt() = default;

  virtual std::size_t activation_bytes() const = 0;
  // From now on the unit calls return with their work queued; loss(), copy_logits() and
  // set_batch() still return done.
  virtual tiers::ComputeFence* enable_asynchronous_calls() = 0;
  // inputs, targets: rows tokens each, already checked to lie in [0, vocab).
  virtual void set_batch(std::span<const std::int32_t> inputs,
                         std::span<const std::int32_t> targets, std::size_t sequences) = 0;
  virtual void forward_embedding(UnitParams params) = 0;
  virtual void forward_block(std::size_t layer, UnitParams params) = 0;
  virtual void forward_head(UnitParams params, UnitParams shared) = 0;
  virtual double loss() = 0;
  virtual void backward_head(UnitParams params, UnitGrads grads, UnitParams shared) = 0;
  virtual void backward_block(std::size_t layer, UnitParams params, UnitGrads grads) = 0;
  virtual void backward_embedding(UnitGrads grads) = 0;
  // Logits of the last forward, copied to the host.
  virtual void copy_logits(std::vector<float>& out) const = 0;
};

// The device memory make_cuda_gpt's backend allocates for `config` (micro-batch × seq_len rows).
// CUDA-free: the memory plan counts it without a GPU.
examples::DeviceBytes cuda_gpt_activation_bytes(const runtime::ModelConfig& config);

// Throws tiers::CudaError when a CUDA or cuBLAS call fails, tiers::DeviceBudgetError when the
// activations do not fit the device's budget.
std::unique_ptr<CudaGpt> make_cuda_gpt(const runtime::ModelConfig& config, tiers::Device& device);

}  // namespace strata::gpt::detail
