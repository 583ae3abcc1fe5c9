// DecoderModel: the decoder of Llama / Mistral / Qwen2 / GPT-2 (hf_config.hpp) in fp32 on the host
// (OpenBLAS), forward and backward one ZeRO-3 unit at a time over parameters it does not own, and
// incremental decoding with a KV cache. The caller (an Engine-driven trainer, or a plain host
// store in tests and strata-generate) hands each call the unit's full tensors:
//
//   model.set_batch(tokens, sequence_tokens, loss_weights);
//   for u in 0 .. unit_count-1:   model.forward_unit(u, params(u), shared(u));
//   loss = model.loss();
//   for u in unit_count-1 .. 0:   model.backward_unit(u, params(u), grads(u), shared(u));
//
// Units, in forward order (tensor names are Hugging Face's, `hf_name` in full):
//   0            "embed"      model.embed_tokens.weight [vocab, hidden]
//                             (GPT-2: transformer.wte.weight [vocab, d], transformer.wpe.weight [n_positions, d])
//   1 .. layers  "layers.{i}" input_layernorm.weight, self_attn.{q,k,v}_proj.weight (+ .bias: Qwen2),
//                             self_attn.o_proj.weight, post_attention_layernorm.weight,
//                             mlp.{gate,up,down}_proj.weight  (HF [out, in] layout: y = x·Wᵀ)
//                             (GPT-2: ln_1.{weight,bias}, attn.c_attn.{weight,bias},
//                              attn.c_proj.{weight,bias}, ln_2.{weight,bias}, mlp.c_fc.{weight,bias},
//                              mlp.c_proj.{weight,bias}; Conv1D [in, out] layout: y = x·W + b)
//   layers + 1   "head"       model.norm.weight (+ lm_head.weight [vocab, hidden] when untied)
//                             (GPT-2: transformer.ln_f.{weight,bias}; the head is always tied)
// A tied head reads the embedding unit's parameters: pass them as `shared` (reads_embedding).
// Weight decay: matrices and embeddings only, never norms or biases.
//
// Gradients: backward_unit overwrites every gradient span of the unit; with a tied head the
// embedding unit's gradient arrives complete (lookup part + head part) at the embedding unit.
// Activation checkpointing (DecoderOptions): each layer keeps only its input and recomputes its
// forward inside backward_unit; results are bitwise the same as without it.
// CUDA: given a device of kind kCuda (decoder_cuda.hpp), every parameter and gradient span is
// device memory, activations live in device memory allocated through that Device, matrix products
// run on the tensor cores with bf16 operands and fp32 accumulation, and attention is tiled (no
// [seq × seq] buffer). Each unit call returns once its work on the device is done. Tokens and loss
// weights stay host spans; logits() copies to the host. Decoding (the KV cache) is host-only.
// Threading: one thread drives a model; matrix products use OpenBLAS's threads. Results are
// bitwise reproducible for a fixed OpenBLAS thread count. Misuse of the call order trips
// STRATA_ASSERT; bad tokens are std::out_of_range naming the position.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "models/decoder/hf_config.hpp"
#include "runtime/engine/unit_spec.hpp"

namespace strata::tiers {
class ComputeFence;
class Device;
}

namespace strata::llm {

struct TensorSpec {
  std::string name;     // within the unit, e.g. "self_attn.q_proj.weight"
  std::string hf_name;  // the checkpoint's name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<std::size_t> shape;  // as the checkpoint stores it (row-major)
  runtime::TensorInit init;        // for training from scratch (tests, benchmarks)
  bool weight_decay = true;
  std::size_t offset = 0;  // elements from the start of the unit's flat buffer

  std::size_t numel() const;
};

enum class UnitKind : std::uint8_t { kEmbedding, kLayer, kHead };

struct UnitSpec {
  std::string name;  // "embed", "layers.{i}", "head"
  UnitKind kind = UnitKind::kLayer;
  std::uint32_t layer = 0;  // kLayer only
  std::vector<TensorSpec> tensors;
  std::size_t numel = 0;
  bool reads_embedding = false;  // the tied head
};

// The units of `config`, in forward order. Throws HfConfigError for an impossible shape.
std::vector<UnitSpec> decoder_units(const HfConfig& config);
// What the Engine registers for a unit (names within the unit, shapes, inits, decay flags).
runtime::UnitSpec engine_unit(const UnitSpec& unit);
// Which of the unit's tensors CUDA's bf16 path reads as fp32 views when given bf16 views too: the
// norms' gains and biases and the biases of fp32 outputs (GPT-2's attention and MLP projections).
std::vector<bool> cuda_bf16_fp32_views_read(const UnitSpec& unit);
// Splits a unit's flat buffer into one span per tensor, in spec order.
std::vector<std::span<const float>> split_unit(const UnitSpec& unit, std::span<const float> flat);
std::vector<std::span<float>> split_unit(const UnitSpec& unit, std::span<float> flat);
std::vector<std::span<const std::uint16_t>> split_unit(const UnitSpec& unit,
                                                       std::span<const std::uint16_t> flat);

// CUDA only: the kernels that compute attention (decoder_cuda.hpp).
enum class CudaAttention : std::uint8_t {
  // kTensorCores where it applies (bf16 products, a head_dim it takes on this GPU), else kFp32.
  kAuto,
  // Flash attention on the tensor cores: bf16 q, k, v, fp32 softmax and accumulation. A head_dim
  // it does not take (not a multiple of 8, over 128, a GPU before sm_80) is refused.
  kTensorCores,
  // The tiled fp32 kernel on the CUDA cores: the reference, and what a head_dim the tensor-core
  // kernel does not take falls back to.
  kFp32,
};

struct DecoderOptions {
  std::uint32_t seq_len = 128;     // positions per training sequence (inputs; targets shift by 1)
  std::uint32_t micro_batch = 1;   // sequences per batch
  bool activation_checkpointing = false;
  // CUDA only: the fp32 reference path (fp32 activations, fp32 cuBLAS products, fp32 attention
  // unless cuda_attention asks otherwise) instead of the default bf16 one (bf16 activations,
  // cuBLASLt bf16 products, the chunked LM-head loss). The tests use it to check the CUDA kernels
  // against the host model to fp32 rounding.
  bool cuda_fp32_products = false;
  // Host only: every projection's and the head's product rounds both operands to bf16 first
  // (linear.hpp's Bf16OperandsScope), to study what bf16 operands alone do to the model.
  bool host_bf16_operands = false;
  // CUDA only. kAuto keeps the fp32 attention with cuda_fp32_products, so that path stays fp32
  // end to end.
  CudaAttention cuda_attention = CudaAttention::kAuto;
  // Packed documents: when set, an input token that follows this token (the eos the data puts
  // between documents) starts a new document. Attention then stays inside each document and
  // positions restart at 0 in each, as transformers computes a packed batch with restarting
  // position_ids (padding-free / varlen packing): every document is scored as if alone.
  std::optional<std::int32_t> document_separator = std::nullopt;
  // CUDA only, bf16 path: rows per chunk of the LM head's loss (logits, cross-entropy and the
  // head's backward run chunk by chunk, so [rows × vocab] logits never exist whole); 0 picks
  // about 2^26 logits per chunk (cuda_loss_chunk_rows in decoder_cuda.hpp).
  std::uint32_t cuda_loss_chunk_rows = 0;
};

using UnitParams = std::span<const std::span<const float>>;
using UnitGrads = std::span<const std::span<float>>;
// A unit's parameters as bf16 bits, one span per tensor: the Engine's gathered bf16 copy
// (GatheredUnit::tensor_bf16), of which the fp32 views are the widening. The CUDA bf16 path feeds
// its products from them (in place where they lie as the products take them) instead of rounding
// the fp32 views again: the same values. Empty: it rounds the fp32 views. The host ignores them.
using UnitParamsBf16 = std::span<const std::span<const std::uint16_t>>;
struct UnitBf16 {
  UnitParamsBf16 params;  // the unit's, or empty
  UnitParamsBf16 shared;  // the embedding's, for a tied head, or empty
};

class DecoderModel {
 public:
  // forward_unit and backward_unit take the parameters' bf16 views too (UnitBf16); the training
  // passes (unit_passes.hpp) hand them over when the Engine has them.
  static constexpr bool kReadsBf16Views = true;

  // Throws HfConfigError when seq_len exceeds max_position_embeddings (Mistral's sliding window
  // is implemented as a banded causal mask, so any seq_len up to that limit works), and
  // std::invalid_argument when seq_len or micro_batch is 0. Allocates every training buffer.
  // `device`: null or a host device computes on the host; a CUDA device computes there
  // (std::invalid_argument when this build has no CUDA; tiers::CudaError when CUDA fails).
  DecoderModel(const HfConfig& config, const DecoderOptions& options,
               tiers::Device* device = nullptr);
  ~DecoderModel();
  DecoderModel(DecoderModel&&) noexcept;
  DecoderModel& operator=(DecoderModel&&) noexcept;

  const HfConfig& config() const;
  const DecoderOptions& options() const;
  const std::vector<UnitSpec>& units() const;
  std::size_t unit_count() const;
  std::size_t parameter_count() const;
  std::size_t activation_bytes() const;  // host or device memory, wherever it computes
  bool on_cuda() const;
  // On CUDA: from now on forward_unit and backward_unit return once their work is queued on the
  // device, and the returned fence says when it is done: wait on its mark() before releasing the
  // views a call read or reading the gradients it wrote. loss(), logits() and set_batch() still
  // return done. nullptr on the host, whose calls return done. [Note: asynchronous unit calls] in
  // docs/design.md.
  tiers::ComputeFence* enable_asynchronous_calls();
  // Which of unit `unit`'s tensors this model reads as fp32 views when it is given bf16 views
  // too (UnitBf16): on CUDA's bf16 path those cuda_bf16_fp32_views_read names, the others' fp32
  // views may be empty (the Engine then neither casts nor keeps them: runtime::TensorSpec::
  // fp32_view); on the host and the fp32 reference path, all.
  std::vector<bool> fp32_views_read(std::size_t unit) const;
  // Which attention runs, for run logs: "fp32 on the host", or the CUDA backend's kernels
  // ("flash-attention, bf16 tensor cores" or "tiled fp32, CUDA cores").
  std::string_view attention_implementation() const;

  // Starts a batch: `tokens` holds whole sequences of `sequence_tokens` tokens each (inputs and
  // the shifted targets: 2 .. seq_len + 1; 0 means seq_len + 1), at most micro_batch of them.
  // `loss_weights` (empty: all 1) has one weight per predicted target, sequences × (sequence_tokens
  // - 1): 0 leaves a target out of the loss (prompt tokens, padding), 1 counts it.
  // Throws std::invalid_argument for a token count or weight count that does not fit, or a
  // negative or non-finite weight; std::out_of_range for a token outside the vocabulary, naming
  // its position.
  void set_batch(std::span<const std::int32_t> tokens, std::size_t sequence_tokens = 0,
                 std::span<const float> loss_weights = {});
  void forward_unit(std::size_t unit, UnitParams params, UnitParams shared = {},
                    UnitBf16 bf16 = {});
  // Weighted mean next-token cross-entropy (nats) over the batch; prepares backward. A batch
  // whose weights are all 0 has loss 0 and zero gradients.
  double loss();
  // Sum of the weighted per-token losses and the sum of the weights (strata-eval's totals).
  double loss_sum() const;
  double loss_weight() const;
  void backward_unit(std::size_t unit, UnitParams params, UnitGrads grads, UnitParams shared = {},
                     UnitBf16 bf16 = {});
  // Logits [sequences · (sequence_tokens - 1) × vocab] of the last forward. On CUDA's bf16 path
  // they are recomputed from the head's bf16 weights kept since the head's forward (the loss
  // never holds them whole): valid until a layer's backward, std::logic_error after.
  std::span<const float> logits() const;

  // Incremental decoding of one sequence with a KV cache (strata-generate):
  //   model.start_decoding(max_positions);
  //   model.feed(prompt);  for u: model.decode_unit(u, params(u), shared(u));  logits = next_logits();
  //   model.feed({token}); for u: ...                                            (and so on)
  // Allocates the KV cache and decoding buffers (std::invalid_argument beyond
  // max_position_embeddings, or on a CUDA model). feed: 1 .. remaining positions tokens (std::invalid_argument past
  // max_positions, std::out_of_range for a token outside the vocabulary, naming its position).
  void start_decoding(std::size_t max_positions);
  void feed(std::span<const std::int32_t> tokens);
  void decode_unit(std::size_t unit, UnitParams params, UnitParams shared = {});
  std::span<const float> next_logits() const;  // [vocab], for the last fed token
  std::size_t decoded_positions() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// OpenBLAS worker threads for every matrix product in the process (0: all hardware threads).
void set_blas_threads(std::uint32_t threads);

}  // namespace strata::llm
