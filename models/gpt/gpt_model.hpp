// GptModel: a GPT-2 decoder's forward and backward in fp32, one unit at a time, over parameters it
// does not own: on the host (OpenBLAS), or on a CUDA device (cuBLAS and kernels, gpt_cuda.hpp). The
// caller (the ZeRO-3 Engine, or ParameterStore for tests) hands each call the unit's full parameter
// tensors and, in backward, buffers for their gradients:
//
//   model.set_batch(tokens);
//   for u in 0 .. unit_count-1:   model.forward_unit(u, params(u), shared(u));
//   loss = model.loss();
//   for u in unit_count-1 .. 0:   model.backward_unit(u, params(u), grads(u), shared(u));
//
// params(u): one span per tensor of units()[u], in spec order (split_unit() makes them from a
// flat unit buffer). shared(u): the embedding unit's params when units()[u].reads_embedding (the
// tied head reads wte.weight), else empty.
//
// Gradients: backward_unit overwrites every gradient span of the unit (callers accumulate across
// micro-batches themselves). Tied head: wte.weight is used twice, by the embedding lookup and by
// the head. The head's backward (which runs first) writes its wte gradient into a buffer the model
// owns; the embedding unit's backward then writes dwte = head part + lookup part, so wte's
// gradient reaches the caller once, complete, with the embedding unit's other gradients.
//
// Activations: the model keeps every activation backward needs (nothing is recomputed), sized
// for micro_batch × seq_len tokens at construction; the hot path does not allocate.
// Threading: one thread drives a model; matrix products run on OpenBLAS's threads
// (set_blas_threads). Results are bitwise reproducible for a fixed OpenBLAS thread count.
// CUDA: given a device of kind kCuda, every parameter and gradient span is device memory, the
// activations live in device memory allocated through that Device (within its budget), and each
// unit call returns once its work on the device is done. Tokens stay host spans (set_batch
// checks them and copies them over). Results are bitwise reproducible run to run on one GPU.
// Order misuse (backward before loss, a unit out of order) trips STRATA_ASSERT.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "models/gpt/gpt_spec.hpp"
#include "runtime/config/config.hpp"

namespace strata::tiers {
class ComputeFence;
class Device;
}

namespace strata::gpt {

using UnitParams = std::span<const std::span<const float>>;
using UnitGrads = std::span<const std::span<float>>;

// OpenBLAS worker threads for every matrix product in the process (0: all hardware threads).
void set_blas_threads(std::uint32_t threads);
std::uint32_t blas_threads();

namespace detail {
class CudaGpt;
}

class GptModel {
 public:
  // Throws std::invalid_argument for an impossible shape (see gpt_units). `device`: null or a
  // host device runs on the host; a CUDA device runs there (std::invalid_argument when this
  // build has no CUDA).
  explicit GptModel(const runtime::ModelConfig& config, tiers::Device* device = nullptr);
  ~GptModel();
  GptModel(GptModel&&) noexcept;
  GptModel& operator=(GptModel&&) noexcept;

  const runtime::ModelConfig& config() const { return config_; }
  const std::vector<UnitSpec>& units() const { return units_; }
  std::size_t unit_count() const { return units_.size(); }
  std::size_t parameter_count() const;
  // Tokens one micro-batch holds: micro_batch sequences of seq_len + 1 (inputs, shifted targets).
  std::size_t batch_tokens() const;
  // Bytes of the activations and backward scratch the model holds (allocated up front), in host
  // memory or, on CUDA, in device memory.
  std::size_t activation_bytes() const;
  bool on_cuda() const { return cuda_ != nullptr; }
  // On CUDA: from now on forward_unit and backward_unit return once their work is queued; the
  // returned fence says when it is done (wait on its mark() before releasing the views a call
  // read or reading the gradients it wrote). loss(), logits() and set_batch() still return done.
  // nullptr on the host. [Note: asynchronous unit calls] in docs/design.md.
  tiers::ComputeFence* enable_asynchronous_calls();

  // Starts a step on `tokens`: 1 .. micro_batch sequences of seq_len + 1 tokens each. Throws
  // std::out_of_range naming the position of a token outside [0, vocab).
  void set_batch(std::span<const std::int32_t> tokens);
  void forward_unit(std::size_t unit, UnitParams params, UnitParams shared = {});
  // Mean cross-entropy over every predicted token; prepares backward. After the last forward.
  double loss();
  void backward_unit(std::size_t unit, UnitParams params, UnitGrads grads, UnitParams shared = {});

  // Logits [sequences·seq_len × vocab] of the last forward (on CUDA: copied to the host).
  std::span<const float> logits() const;

 private:
  struct BlockActivations {
    std::vector<float> ln1_out, ln1_mean, ln1_rstd, qkv, prob, att_out;
    std::vector<float> resid_mid, ln2_out, ln2_mean, ln2_rstd, fc_pre, fc_tanh, fc_act;
  };
  enum class Phase { kIdle, kForward, kLossReady, kBackward };

  void forward_embedding(UnitParams params);
  void forward_block(std::size_t layer, UnitParams params);
  void forward_head(UnitParams params, UnitParams shared);
  void backward_head(UnitParams params, UnitGrads grads, UnitParams shared);
  void backward_block(std::size_t layer, UnitParams params, UnitGrads grads);
  void backward_embedding(UnitGrads grads);
  void check_unit_views(std::size_t unit, UnitParams params, UnitParams shared) const;

  runtime::ModelConfig config_;
  std::vector<UnitSpec> units_;
  std::size_t sequences_ = 0;  // in the current batch
  std::size_t rows_ = 0;       // sequences_ · seq_len
  Phase phase_ = Phase::kIdle;
  std::size_t next_unit_ = 0;  // forward: next unit; backward: one past the next unit

  std::vector<std::int32_t> inputs_, targets_;
  std::vector<std::vector<float>> resid_;  // layers + 1 residual streams [rows × d]
  std::vector<BlockActivations> blocks_;
  std::vector<float> lnf_out_, lnf_mean_, lnf_rstd_, logits_, dlogits_;
  // Backward scratch, reused by every block.
  std::vector<float> d_resid_, d_norm_, d_att_, d_qkv_, d_fc_, attention_scratch_;
  std::vector<float> tied_wte_grad_;       // head's share of dwte (tied head only)
  std::unique_ptr<detail::CudaGpt> cuda_;  // set on a CUDA device; the host buffers stay empty
  mutable std::vector<float> cuda_logits_;
};

}  // namespace strata::gpt
