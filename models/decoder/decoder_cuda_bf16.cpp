// The CUDA decoder's default path: bf16 activations, cuBLASLt products, fused bf16 kernels and
// the chunked LM-head loss (decoder_cuda.hpp). Mirrors decoder_layer.cpp and decoder_model.cpp
// step for step, as the fp32 reference (decoder_cuda.cpp) does.
//
// [Note: bf16 decoder]
// What is bf16 and what stays fp32, and why:
//   - Stored per layer in bf16: the norm outputs, q | k | v (after bias and RoPE), the attention
//     output, the MLP pre-activations and activations: every product operand, the tensors the
//     backward reads. Their statistics stay fp32: norm mean and rstd, the attention's
//     log-sum-exp.
//   - The residual stream (each layer's input and the mid-layer sum) and its gradient d_resid
//     stay fp32. Each layer adds updates that are small against the stream; in bf16 every add
//     would round the whole stream to 8 bits of mantissa, 24 layers in a row, and the embedding's
//     gradient is a sum over rows of d_resid. It costs 2 bytes per element more than bf16 on
//     (layers + 1) · rows · hidden, a few percent of the activations. The products that read it
//     read the norms' bf16 outputs; the adds ride in the products' epilogues (C = the stream).
//     The products that read d_resid read a bf16 copy (d_resid_bf16_) that each norm backward
//     rounds in the same pass that updates d_resid (norm_backward_bf16).
//   - Products: bf16 operands, fp32 accumulation; bf16 outputs where the next reader is a bf16
//     kernel or product (q | k | v, the MLP pre-activations, d_att, d_act), fp32 where the
//     maths needs it: the residual stream, d_norm (read by the fp32 norm backward), the logits
//     (the softmax), every weight gradient (written straight into the caller's fp32 buffers).
//   - The tensor-core attention reads the bf16 q | k | v and stores its output rounded to bf16;
//     its dq, dk, dv come out fp32 (flash_attention.hpp); RoPE's backward reads
//     them, rotates back and rounds into d_qkv_bf16_ in one pass, keeping the fp32 values for
//     the bias gradients.
//   - Weights: the Engine gathers bf16 parameters and hands over both its bf16 copy and the
//     fp32 views widened from it (GatheredUnit::tensor_bf16; DecoderModel's UnitBf16), these
//     only for the tensors read in fp32 here (DecoderModel::fp32_views_read: the trainer
//     registers the others with runtime::TensorSpec::fp32_view = false, and no cast is spent on
//     them). The products read the bf16 copy: in place where a product's tensors lie side by
//     side there (q | k | v and gate | up: one product each; Llama's and Mistral's layers,
//     GPT-2's fused c_attn) and start with the alignment of their cache slot, so that cuBLASLt
//     picks the same kernel either way; otherwise copied into the slot (Qwen2's q, k, v with
//     their biases between them). Without a bf16 copy (fp32 parameters, direct callers), each unit call
//     rounds the fp32 views into the cache, which holds the same values. The backward takes
//     them again rather than keeping every layer's bf16 weights from the forward. Biases of
//     bf16 outputs come the same way (the epilogue adds a bias of the output's type); biases of
//     fp32 outputs and the norms' weights are read from the fp32 views. The head's matrix is
//     always copied (or rounded) into the cache: logits() recomputes from it after the call,
//     when the Engine may have evicted the unit.
//   - LM head and loss in row chunks (cuda_loss_chunk_rows): forward_head computes each chunk's
//     fp32 logits, its loss and log-sum-exp; backward_head recomputes the chunk's logits (the
//     same product on the same operands: the same bits), turns them into bf16 dlogits, then
//     d_norm for those rows and dW_head += dlogitsᵀ · head_norm. One product more than keeping
//     dlogits (2 of the head's 3 products' flops per step), and [rows × vocab] never exists.
// Determinism: cuBLASLt per [Note: cuBLASLt determinism] in cublaslt_gemm.cpp; every kernel
// here is atomic-free (fused_kernels.hpp, decoder_cuda_kernels.hpp, flash_attention.hpp).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "base/assert.hpp"
#include "models/decoder/cublaslt_gemm.hpp"
#include "models/decoder/decoder_cuda_base.hpp"
#include "models/decoder/flash_attention.hpp"
#include "models/decoder/fused_kernels.hpp"
#include "models/decoder/linear.hpp"

namespace strata::llm::detail {
namespace {

using bf16 = __nv_bfloat16;
using cuda::ElementType;
using cuda::GemmOperand;
using cuda::GemmProduct;
using cuda::Transpose;

// A layer's bf16 weights as its products read them: in the weight cache, or in place in the
// Engine's gathered bf16 copy (take_layer_weights). The cache's own slots are LayerWeights of
// writable pointers; the head uses the cache's start alone.
template <typename Element>
struct LayerWeightsOf {
  Element *qkv, *out, *pre, *down;  // q | k | v (or c_attn), o (c_proj), gate | up (c_fc), down
  Element *qkv_bias, *pre_bias;     // the biases of bf16 outputs (Qwen2's q, k, v; GPT-2's)
};
using LayerWeights = LayerWeightsOf<const bf16>;
using CacheSlots = LayerWeightsOf<bf16>;

class CudaDecoderBf16 final : public CudaDecoderBase {
 public:
  CudaDecoderBf16(const HfConfig& config, const DecoderOptions& options, tiers::Device& device)
      : CudaDecoderBase(config, options, device),
        chunk_rows_(cuda_loss_chunk_rows(config, options)) {
    flash_attention_ = use_flash_attention(true);
    allocate_buffers();
    gemm_.emplace(workspace_, workspace_bytes_, device_index_, "decoder");
  }
  // The stream's work is done before cuBLASLt's handle goes (the base synchronises only after
  // this class's members are gone).
  ~CudaDecoderBf16() override { cudaStreamSynchronize(stream_); }
  CudaDecoderBf16(const CudaDecoderBf16&) = delete;
  CudaDecoderBf16& operator=(const CudaDecoderBf16&) = delete;

  std::string_view attention_implementation() const override {
    return flash_attention_ ? "flash-attention, bf16 tensor cores" : "tiled fp32, CUDA cores";
  }

  void forward_layer(std::size_t layer, UnitParams p, UnitParamsBf16 p16) override {
    set_device();
    take_layer_weights(p, p16);
    Layer& a = layer_buffers(layer);
    attention_inputs(p, resid_[layer], a);
    attention_forward(a);
    attention_output_and_mlp(p, resid_[layer], a, resid_[layer + 1]);
    end_call();
  }

  void forward_head(UnitParams p, UnitParams shared, UnitBf16 p16) override {
    set_device();
    norm_forward(p[head_.norm_weight].data(), tensor(p, head_.norm_bias), resid_.back(), head_norm_,
                 head_mean_, head_rstd_);
    take_head_weights(p, shared, p16);
    for (std::size_t first = 0; first < rows_; first += chunk_rows_) {
      const std::size_t rows = std::min(chunk_rows_, rows_ - first);
      head_logits(first, rows);
      check(cuda::cross_entropy_forward(logits_, targets_ + first, weights_ + first,
                                        head_lse_ + first, row_loss_ + first, rows, dims_.vocab,
                                        stream_),
            "cross_entropy_forward");
    }
    end_call();
  }

  LossTotals loss() override {
    set_device();
    LossTotals totals;
    inverse_loss_weight(&totals.weight);
    host_loss_.resize(rows_);
    check(cudaMemcpyAsync(host_loss_.data(), row_loss_, rows_ * sizeof(double),
                          cudaMemcpyDeviceToHost, stream_),
          "cudaMemcpyAsync");
    finish();
    for (std::size_t r = 0; r < rows_; ++r) totals.loss_sum += host_weights_[r] * host_loss_[r];
    return totals;
  }

  void backward_head(UnitParams p, UnitGrads g, UnitParams shared, UnitBf16 p16) override {
    set_device();
    const std::size_t d = dims_.hidden;
    const std::size_t vocab = dims_.vocab;
    double total_weight = 0.0;
    const float inv_weight = inverse_loss_weight(&total_weight);
    float* dhead = config_.tie_word_embeddings ? tied_grad_ : g[head_.lm_head].data();
    take_head_weights(p, shared, p16);
    for (std::size_t first = 0; first < rows_; first += chunk_rows_) {
      const std::size_t rows = std::min(chunk_rows_, rows_ - first);
      head_logits(first, rows);  // the forward's product again: the same logits, bit for bit
      check(cuda::cross_entropy_backward(logits_, head_lse_ + first, targets_ + first,
                                         weights_ + first, inv_weight, dlogits_, rows, vocab,
                                         stream_),
            "cross_entropy_backward");
      // d_norm rows = dlogits · W_head; dW_head (+)= dlogitsᵀ · head_norm rows.
      product(rows, d, vocab, {dlogits_, vocab, Transpose::kNo}, {weight_cache_, d, Transpose::kNo},
              d_norm_ + first * d, d, ElementType::kFp32);
      product(vocab, d, rows, {dlogits_, vocab, Transpose::kYes},
              {head_norm_ + first * d, d, Transpose::kNo}, dhead, d, ElementType::kFp32,
              first == 0 ? nullptr : dhead);
    }
    if (rows_ == 0) fill_zero(dhead, vocab * d);
    // The first gradient into d_resid: written, not added (no memset first).
    norm_backward(p[head_.norm_weight].data(), resid_.back(), head_mean_, head_rstd_,
                  g[head_.norm_weight].data(), tensor(g, head_.norm_bias),
                  cuda::DxUpdate::kOverwrite);
    end_call();
  }

  // On entry d_resid (and its bf16 copy) holds dL/d(layer output); on exit dL/d(layer input).
  void backward_layer(std::size_t layer, UnitParams p, UnitGrads g,
                      UnitParamsBf16 p16) override {
    set_device();
    take_layer_weights(p, p16);
    Layer& a = layer_buffers(layer);
    mlp_backward(p, g, a);
    attention_output_backward(g, a);
    attention_backward(a);
    qkv_backward(p, g, a, resid_[layer]);
    end_call();
  }

  // Recomputes the last forward's logits chunk by chunk from the bf16 head weights still in the
  // cache: valid after forward_head or backward_head, until a layer's call recasts the cache.
  void copy_logits(std::vector<float>& out) const override {
    set_device();
    if (cache_holds_ != CacheHolds::kHead) {
      throw std::logic_error(
          "decoder: logits() on CUDA needs the head's weights of the last forward; a layer's "
          "call has replaced them since");
    }
    out.resize(rows_ * dims_.vocab);
    for (std::size_t first = 0; first < rows_; first += chunk_rows_) {
      const std::size_t rows = std::min(chunk_rows_, rows_ - first);
      head_logits(first, rows);
      check(cudaMemcpyAsync(out.data() + first * dims_.vocab, logits_,
                            rows * dims_.vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync");
      finish();  // logits_ holds one chunk
    }
  }

 private:
  struct Layer {
    bf16 *norm1, *qkv, *att, *norm2, *pre, *act;
    float *norm1_mean, *norm1_rstd, *lse, *mid, *norm2_mean, *norm2_rstd;
  };
  enum class CacheHolds : std::uint8_t { kNothing, kLayer, kHead };

  void allocate_buffers() {
    const std::size_t rows = max_rows_;
    const std::size_t d = dims_.hidden;
    const std::size_t lse = std::size_t{options_.micro_batch} * dims_.heads * options_.seq_len;
    layers_.resize(options_.activation_checkpointing ? 1 : config_.num_layers);
    for (Layer& layer : layers_) {  // in decoder_cuda_plan.cpp's order
      layer.norm1 = allocate<bf16>(rows * d);
      layer.norm1_mean = allocate<float>(rows);
      layer.norm1_rstd = allocate<float>(rows);
      layer.qkv = allocate<bf16>(rows * dims_.qkv_width);
      layer.lse = allocate<float>(lse);
      layer.att = allocate<bf16>(rows * dims_.q_width);
      layer.mid = allocate<float>(rows * d);
      layer.norm2 = allocate<bf16>(rows * d);
      layer.norm2_mean = allocate<float>(rows);
      layer.norm2_rstd = allocate<float>(rows);
      layer.pre = allocate<bf16>(rows * dims_.pre_width);
      layer.act = allocate<bf16>(rows * dims_.inner);
    }
    head_norm_ = allocate<bf16>(rows * d);
    head_mean_ = allocate<float>(rows);
    head_rstd_ = allocate<float>(rows);
    head_lse_ = allocate<float>(rows);
    logits_ = allocate<float>(chunk_rows_ * dims_.vocab);
    dlogits_ = allocate<bf16>(chunk_rows_ * dims_.vocab);
    d_resid_bf16_ = allocate<bf16>(rows * d);
    d_norm_ = allocate<float>(rows * d);
    d_att_ = allocate<bf16>(rows * dims_.q_width);
    d_qkv_ = allocate<float>(rows * dims_.qkv_width);
    d_qkv_bf16_ = allocate<bf16>(rows * dims_.qkv_width);
    d_pre_ = allocate<bf16>(rows * dims_.pre_width);
    d_act_ = allocate<bf16>(rows * dims_.inner);
    delta_ = allocate<float>(lse);
    if (!flash_attention_) {  // the fp32 attention's inputs and output, widened
      qkv32_ = allocate<float>(rows * dims_.qkv_width);
      att32_ = allocate<float>(rows * dims_.q_width);
      d_att32_ = allocate<float>(rows * dims_.q_width);
    }
    weight_cache_ = allocate<bf16>(cuda_weight_cache_elements(config_));
    workspace_bytes_ = cuda_gemm_workspace_bytes(config_, options_);
    STRATA_ASSERT(workspace_bytes_ <= cuda::LtGemm::kWorkspaceBytes);
    workspace_ = allocate<std::byte>(workspace_bytes_);
    STRATA_ASSERT(allocated_bytes() ==
                      cuda_decoder_activation_bytes(config_, options_, flash_attention_).allocated,
                  "decoder_cuda_plan.cpp counts other buffers than these");
    bf16* next = weight_cache_;
    auto take = [&next](std::size_t elements) {
      bf16* at = next;
      next += elements;
      return at;
    };
    cache_slots_.qkv = take(dims_.qkv_width * d);
    cache_slots_.out = take(dims_.q_width * d);
    cache_slots_.pre = take(dims_.pre_width * d);
    cache_slots_.down = take(dims_.inner * d);
    cache_slots_.qkv_bias = take(dims_.qkv_width);
    cache_slots_.pre_bias = take(dims_.pre_width);
    STRATA_ASSERT(next <= weight_cache_ + cuda_weight_cache_elements(config_));
  }

  Layer& layer_buffers(std::size_t layer) {
    return options_.activation_checkpointing ? layers_.front() : layers_[layer];
  }

  // --- weights -----------------------------------------------------------------------------------

  void cast(const float* src, bf16* dst, std::size_t count) {
    if (src == nullptr) return;
    check(cuda::round_to_bf16(src, dst, count, stream_), "round_to_bf16");
  }

  // The layer's matrices (q, k, v adjacent: one [qkv_width × hidden] matrix; gate, up likewise)
  // and the biases of its bf16 outputs.
  void cast_layer_weights(UnitParams p) {
    const LayerLayout& l = layout_;
    const std::size_t d = dims_.hidden;
    const CacheSlots& c = cache_slots_;
    if (dims_.gpt2) {
      cast(tensor(p, l.qkv_weight), c.qkv, d * dims_.qkv_width);
      cast(tensor(p, l.qkv_bias), c.qkv_bias, dims_.qkv_width);
      cast(tensor(p, l.out_weight), c.out, d * d);
      cast(tensor(p, l.fc_weight), c.pre, d * dims_.inner);
      cast(tensor(p, l.fc_bias), c.pre_bias, dims_.inner);
      cast(tensor(p, l.proj_weight), c.down, dims_.inner * d);
    } else {
      const std::size_t q = dims_.q_width * d;
      const std::size_t kv = dims_.kv_width * d;
      cast(tensor(p, l.q_weight), c.qkv, q);
      cast(tensor(p, l.k_weight), c.qkv + q, kv);
      cast(tensor(p, l.v_weight), c.qkv + q + kv, kv);
      cast(tensor(p, l.q_bias), c.qkv_bias, dims_.q_width);
      cast(tensor(p, l.k_bias), c.qkv_bias + dims_.q_width, dims_.kv_width);
      cast(tensor(p, l.v_bias), c.qkv_bias + dims_.q_width + dims_.kv_width, dims_.kv_width);
      cast(tensor(p, l.o_weight), c.out, d * dims_.q_width);
      cast(tensor(p, l.gate_weight), c.pre, dims_.inner * d);
      cast(tensor(p, l.up_weight), c.pre + dims_.inner * d, dims_.inner * d);
      cast(tensor(p, l.down_weight), c.down, d * dims_.inner);
    }
    layer_weights_ = {c.qkv, c.out, c.pre, c.down, c.qkv_bias, c.pre_bias};
    cache_holds_ = CacheHolds::kLayer;
  }

  // [Note: bf16 decoder] The layer's weights from the Engine's bf16 copy (the values the fp32
  // views widen): each group of tensors a product reads as one (q | k | v, gate | up) is read in
  // place when its tensors lie side by side there and its start has the alignment its cache slot
  // has (so cuBLASLt runs the same kernel either way: the same bits), else copied into the slot.
  // Without the copy (empty `p16`), the fp32 views are rounded into the cache.
  void take_layer_weights(UnitParams p, UnitParamsBf16 p16) {
    if (p16.empty()) {
      cast_layer_weights(p);
      return;
    }
    const LayerLayout& l = layout_;
    const CacheSlots& c = cache_slots_;
    if (dims_.gpt2) {
      layer_weights_ = {in_place_or_copied(p16, {l.qkv_weight}, c.qkv),
                        in_place_or_copied(p16, {l.out_weight}, c.out),
                        in_place_or_copied(p16, {l.fc_weight}, c.pre),
                        in_place_or_copied(p16, {l.proj_weight}, c.down),
                        in_place_or_copied(p16, {l.qkv_bias}, c.qkv_bias),
                        in_place_or_copied(p16, {l.fc_bias}, c.pre_bias)};
    } else {
      layer_weights_ = {in_place_or_copied(p16, {l.q_weight, l.k_weight, l.v_weight}, c.qkv),
                        in_place_or_copied(p16, {l.o_weight}, c.out),
                        in_place_or_copied(p16, {l.gate_weight, l.up_weight}, c.pre),
                        in_place_or_copied(p16, {l.down_weight}, c.down),
                        in_place_or_copied(p16, {l.q_bias, l.k_bias, l.v_bias}, c.qkv_bias),
                        c.pre_bias};
    }
    cache_holds_ = CacheHolds::kLayer;
  }

  // The tensors `indices` (kAbsent: none, then the slot, unused) as one bf16 array: in place in
  // `p16` when they are adjacent there and the first has the slot's operand alignment, else
  // copied one after another into `slot`.
  const bf16* in_place_or_copied(UnitParamsBf16 p16, std::initializer_list<std::size_t> indices,
                                 bf16* slot) {
    if (*indices.begin() == kAbsent) return slot;
    const std::uint16_t* first = p16[*indices.begin()].data();
    bool adjacent = cuda::operand_alignment(first) == cuda::operand_alignment(slot);
    const std::uint16_t* next = first;
    for (const std::size_t index : indices) {
      adjacent = adjacent && p16[index].data() == next;
      next = p16[index].data() + p16[index].size();
    }
    if (adjacent) return reinterpret_cast<const bf16*>(first);
    bf16* at = slot;
    for (const std::size_t index : indices) {
      check(cudaMemcpyAsync(at, p16[index].data(), p16[index].size_bytes(),
                            cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpyAsync");
      at += p16[index].size();
    }
    return slot;
  }

  // The head's matrix into the cache, copied from the bf16 copy or rounded from the fp32 view:
  // logits() recomputes from it after the call, when the Engine may have let the unit go.
  void take_head_weights(UnitParams p, UnitParams shared, UnitBf16 p16) {
    const UnitParamsBf16 source = config_.tie_word_embeddings ? p16.shared : p16.params;
    const std::size_t index = config_.tie_word_embeddings ? kTokenEmbedding : head_.lm_head;
    if (source.empty()) {
      cast(head_matrix(p, shared), weight_cache_, dims_.vocab * dims_.hidden);
    } else {
      check(cudaMemcpyAsync(weight_cache_, source[index].data(), source[index].size_bytes(),
                            cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpyAsync");
    }
    cache_holds_ = CacheHolds::kHead;
  }

  // Whether the layer's q | k | v projection has biases (Qwen2, GPT-2).
  bool qkv_has_bias() const {
    return dims_.gpt2 ? layout_.qkv_bias != kAbsent : layout_.q_bias != kAbsent;
  }

  // --- products ----------------------------------------------------------------------------------

  // D[m × n] = op(A)·op(B) (+ C) (+ bias) on cuBLASLt (cublaslt_gemm.hpp).
  void product(std::size_t m, std::size_t n, std::size_t k, GemmOperand a, GemmOperand b, void* d,
               std::size_t ldd, ElementType type, const void* c = nullptr,
               const void* bias = nullptr) const {
    GemmProduct gemm;
    gemm.m = m;
    gemm.n = n;
    gemm.k = k;
    gemm.a = a;
    gemm.b = b;
    gemm.d = d;
    gemm.ldd = ldd;
    gemm.d_type = type;
    gemm.c = c;
    gemm.bias = bias;
    gemm_->run(gemm, stream_);
  }

  // The weight operand of y = x·op(W): HF [out × in] (transposed) or Conv1D [in × out].
  GemmOperand forward_weight(const bf16* w, std::size_t in, std::size_t out) const {
    return dims_.gpt2 ? GemmOperand{w, out, Transpose::kNo} : GemmOperand{w, in, Transpose::kYes};
  }
  // The weight operand of dx = dy·op(W)ᵀ.
  GemmOperand backward_weight(const bf16* w, std::size_t in, std::size_t out) const {
    return dims_.gpt2 ? GemmOperand{w, out, Transpose::kYes} : GemmOperand{w, in, Transpose::kNo};
  }
  // dW (fp32, overwritten) of y = x·op(W) over the batch's rows, dy columns [0, out) at dy.
  void weight_grad(const bf16* x, std::size_t ldx, const bf16* dy, std::size_t lddy, std::size_t in,
                   std::size_t out, float* dweight) const {
    if (dims_.gpt2) {  // [in × out] = xᵀ·dy
      product(in, out, rows_, {x, ldx, Transpose::kYes}, {dy, lddy, Transpose::kNo}, dweight, out,
              ElementType::kFp32);
    } else {  // [out × in] = dyᵀ·x
      product(out, in, rows_, {dy, lddy, Transpose::kYes}, {x, ldx, Transpose::kNo}, dweight, in,
              ElementType::kFp32);
    }
  }

  // logits_ [rows × vocab] (fp32) of the head's rows [first, first + rows).
  void head_logits(std::size_t first, std::size_t rows) const {
    const std::size_t d = dims_.hidden;
    product(rows, dims_.vocab, d, {head_norm_ + first * d, d, Transpose::kNo},
            {weight_cache_, d, Transpose::kYes}, logits_, dims_.vocab, ElementType::kFp32);
  }

  // --- forward -----------------------------------------------------------------------------------

  void norm_forward(const float* weight, const float* bias, const float* x, bf16* y, float* mean,
                    float* rstd) {
    check(cuda::norm_forward_bf16(x, weight, dims_.gpt2 ? bias : nullptr, y, mean, rstd, rows_,
                                  dims_.hidden, dims_.eps, stream_),
          "norm_forward_bf16");
  }

  void attention_inputs(UnitParams p, const float* x, Layer& a) {
    const LayerLayout& l = layout_;
    const std::size_t d = dims_.hidden;
    const std::size_t ld = dims_.qkv_width;
    norm_forward(tensor(p, l.norm1_weight), tensor(p, l.norm1_bias), x, a.norm1, a.norm1_mean,
                 a.norm1_rstd);
    product(rows_, ld, d, {a.norm1, d, Transpose::kNo}, forward_weight(layer_weights_.qkv, d, ld),
            a.qkv, ld, ElementType::kBf16, nullptr,
            qkv_has_bias() ? layer_weights_.qkv_bias : nullptr);
    if (!dims_.gpt2) {  // q's heads and k's are adjacent: one launch rotates both
      check(cuda::rope_forward_bf16(a.qkv, ld, rows_, dims_.heads + dims_.kv_heads, rope_half_,
                                    row_positions_, rope_cos_, rope_sin_, stream_),
            "rope_forward_bf16");
    }
  }

  // a.att = softmax(q·kᵀ)·v (bf16) and the log-sum-exp per query.
  void attention_forward(Layer& a) {
    const std::size_t ld = dims_.qkv_width;
    const std::size_t q_width = dims_.q_width;
    if (flash_attention_) {  // bf16 in, the output rounded to bf16 as it is stored
      const bf16* k = a.qkv + q_width;
      check(cuda::flash_attention_forward(attention_dims(), cuda::Bf16Rows{a.qkv, ld},
                                          cuda::Bf16Rows{k, ld},
                                          cuda::Bf16Rows{k + dims_.kv_width, ld},
                                          cuda::Bf16MutRows{a.att, q_width}, a.lse, stream_),
            "flash_attention_forward");
      return;
    }
    check(cuda::widen_to_fp32(a.qkv, ld, qkv32_, ld, rows_, ld, stream_), "widen_to_fp32");
    const float* k = qkv32_ + q_width;
    check(cuda::attention_forward(attention_dims(), qkv32_, k, k + dims_.kv_width, ld, att32_,
                                  q_width, a.lse, stream_),
          "attention_forward");
    check(cuda::cast_to_bf16(att32_, q_width, a.att, q_width, rows_, q_width, stream_),
          "cast_to_bf16");
  }

  // From a.att on: o_proj (+ x in its epilogue), norm2, MLP (+ mid in its epilogue) into out.
  void attention_output_and_mlp(UnitParams p, const float* x, Layer& a, float* out) {
    const LayerLayout& l = layout_;
    const std::size_t d = dims_.hidden;
    const std::size_t inner = dims_.inner;
    const cuda::ActivationCode act = activation_code(dims_.activation);
    product(rows_, d, dims_.q_width, {a.att, dims_.q_width, Transpose::kNo},
            forward_weight(layer_weights_.out, dims_.q_width, d), a.mid, d, ElementType::kFp32, x,
            tensor(p, l.out_bias));
    norm_forward(tensor(p, l.norm2_weight), tensor(p, l.norm2_bias), a.mid, a.norm2, a.norm2_mean,
                 a.norm2_rstd);
    product(rows_, dims_.pre_width, d, {a.norm2, d, Transpose::kNo},
            forward_weight(layer_weights_.pre, d, dims_.pre_width), a.pre, dims_.pre_width,
            ElementType::kBf16, nullptr, dims_.gpt2 ? layer_weights_.pre_bias : nullptr);
    if (dims_.gpt2) {
      check(cuda::plain_forward_bf16(act, a.pre, a.act, rows_ * inner, stream_),
            "plain_forward_bf16");
    } else {
      check(cuda::gated_forward_bf16(act, a.pre, a.act, rows_, inner, stream_),
            "gated_forward_bf16");
    }
    product(rows_, d, inner, {a.act, inner, Transpose::kNo},
            forward_weight(layer_weights_.down, inner, d), out, d, ElementType::kFp32, a.mid,
            tensor(p, l.proj_bias));
  }

  // --- backward ----------------------------------------------------------------------------------

  // d_resid += dL/d(norm input) from d_norm_ (or =, kOverwrite) and, in the same pass, the bf16
  // copy of d_resid the next products read; the weight's (and bias's) gradients overwritten.
  void norm_backward(const float* weight, const float* x, const float* mean, const float* rstd,
                     float* dweight, float* dbias,
                     cuda::DxUpdate update = cuda::DxUpdate::kAccumulate) {
    check(cuda::norm_backward_bf16(d_norm_, x, dims_.gpt2 ? mean : nullptr, rstd, weight, d_resid_,
                                   d_resid_bf16_, dweight, dims_.gpt2 ? dbias : nullptr, rows_,
                                   dims_.hidden, update, stream_),
          "norm_backward_bf16");
  }

  void mlp_backward(UnitParams p, UnitGrads g, Layer& a) {
    const LayerLayout& l = layout_;
    const std::size_t d = dims_.hidden;
    const std::size_t inner = dims_.inner;
    const std::size_t pre = dims_.pre_width;
    const cuda::ActivationCode act = activation_code(dims_.activation);
    const bf16* dout = d_resid_bf16_;
    // Down projection: d_act = dout·op(W_down)ᵀ, dW_down.
    product(rows_, inner, d, {dout, d, Transpose::kNo},
            backward_weight(layer_weights_.down, inner, d), d_act_, inner, ElementType::kBf16);
    weight_grad(a.act, inner, dout, d, inner, d,
                tensor(g, dims_.gpt2 ? l.proj_weight : l.down_weight));
    if (dims_.gpt2) {
      check(cuda::column_sums(d_resid_, d, rows_, d, tensor(g, l.proj_bias), stream_),
            "column_sums");
      check(cuda::plain_backward_bf16(act, d_act_, a.pre, d_pre_, rows_ * inner, stream_),
            "plain_backward_bf16");
      check(cuda::column_sums_bf16(d_pre_, inner, rows_, inner, tensor(g, l.fc_bias), stream_),
            "column_sums_bf16");
      weight_grad(a.norm2, d, d_pre_, inner, d, inner, tensor(g, l.fc_weight));
    } else {
      check(cuda::gated_backward_bf16(act, d_act_, a.pre, d_pre_, rows_, inner, stream_),
            "gated_backward_bf16");
      weight_grad(a.norm2, d, d_pre_, pre, d, inner, tensor(g, l.gate_weight));
      weight_grad(a.norm2, d, d_pre_ + inner, pre, d, inner, tensor(g, l.up_weight));
    }
    // d_norm = d_pre·op(W_pre)ᵀ: gate and up in one product.
    product(rows_, d, pre, {d_pre_, pre, Transpose::kNo},
            backward_weight(layer_weights_.pre, d, pre), d_norm_, d, ElementType::kFp32);
    norm_backward(tensor(p, l.norm2_weight), a.mid, a.norm2_mean, a.norm2_rstd,
                  tensor(g, l.norm2_weight), tensor(g, l.norm2_bias));
  }

  // d_att = dL/d(attention output) from dL/d(mid), and the output projection's gradients.
  void attention_output_backward(UnitGrads g, Layer& a) {
    const LayerLayout& l = layout_;
    const std::size_t d = dims_.hidden;
    const std::size_t q_width = dims_.q_width;
    const bf16* dout = d_resid_bf16_;
    product(rows_, q_width, d, {dout, d, Transpose::kNo},
            backward_weight(layer_weights_.out, q_width, d), d_att_, q_width, ElementType::kBf16);
    weight_grad(a.att, q_width, dout, d, q_width, d,
                tensor(g, dims_.gpt2 ? l.out_weight : l.o_weight));
    if (dims_.gpt2) {
      check(cuda::column_sums(d_resid_, d, rows_, d, tensor(g, l.out_bias), stream_),
            "column_sums");
    }
  }

  // d_qkv_ (fp32) = dL/d(q | k | v) from d_att_.
  void attention_backward(Layer& a) {
    const std::size_t ld = dims_.qkv_width;
    const std::size_t q_width = dims_.q_width;
    float* dk = d_qkv_ + q_width;
    float* dv = dk + dims_.kv_width;
    if (flash_attention_) {
      const bf16* k = a.qkv + q_width;
      check(cuda::flash_attention_backward(attention_dims(), {d_att_, q_width}, {a.att, q_width},
                                           {a.qkv, ld}, {k, ld}, {k + dims_.kv_width, ld}, a.lse,
                                           delta_, {d_qkv_, ld}, {dk, ld}, {dv, ld}, stream_),
            "flash_attention_backward");
      return;
    }
    check(cuda::widen_to_fp32(a.qkv, ld, qkv32_, ld, rows_, ld, stream_), "widen_to_fp32");
    check(cuda::widen_to_fp32(a.att, q_width, att32_, q_width, rows_, q_width, stream_),
          "widen_to_fp32");
    check(cuda::widen_to_fp32(d_att_, q_width, d_att32_, q_width, rows_, q_width, stream_),
          "widen_to_fp32");
    const float* k = qkv32_ + q_width;
    check(cuda::attention_backward(attention_dims(), d_att32_, q_width, att32_, qkv32_, k,
                                   k + dims_.kv_width, ld, a.lse, delta_, d_qkv_, dk, dv, stream_),
          "attention_backward");
  }

  // RoPE's backward, the q | k | v projections' gradients and norm1's backward into d_resid.
  void qkv_backward(UnitParams p, UnitGrads g, Layer& a, const float* x) {
    const LayerLayout& l = layout_;
    const std::size_t d = dims_.hidden;
    const std::size_t ld = dims_.qkv_width;
    const std::size_t rotated = dims_.gpt2 ? 0 : dims_.heads + dims_.kv_heads;
    check(cuda::rope_backward_to_bf16(d_qkv_, d_qkv_bf16_, ld, rows_, ld, rotated, rope_half_,
                                      row_positions_, rope_cos_, rope_sin_, stream_),
          "rope_backward_to_bf16");
    if (dims_.gpt2) {
      check(cuda::column_sums(d_qkv_, ld, rows_, ld, tensor(g, l.qkv_bias), stream_),
            "column_sums");
      weight_grad(a.norm1, d, d_qkv_bf16_, ld, d, ld, tensor(g, l.qkv_weight));
    } else {
      const std::size_t k_offset = dims_.q_width;
      const std::size_t v_offset = dims_.q_width + dims_.kv_width;
      if (qkv_has_bias()) {
        check(cuda::column_sums(d_qkv_, ld, rows_, dims_.q_width, tensor(g, l.q_bias), stream_),
              "column_sums");
        check(cuda::column_sums(d_qkv_ + k_offset, ld, rows_, dims_.kv_width, tensor(g, l.k_bias),
                                stream_),
              "column_sums");
        check(cuda::column_sums(d_qkv_ + v_offset, ld, rows_, dims_.kv_width, tensor(g, l.v_bias),
                                stream_),
              "column_sums");
      }
      weight_grad(a.norm1, d, d_qkv_bf16_, ld, d, dims_.q_width, tensor(g, l.q_weight));
      weight_grad(a.norm1, d, d_qkv_bf16_ + k_offset, ld, d, dims_.kv_width, tensor(g, l.k_weight));
      weight_grad(a.norm1, d, d_qkv_bf16_ + v_offset, ld, d, dims_.kv_width, tensor(g, l.v_weight));
    }
    // d_norm = d_qkv·op(W_qkv)ᵀ: q, k and v in one product.
    product(rows_, d, ld, {d_qkv_bf16_, ld, Transpose::kNo},
            backward_weight(layer_weights_.qkv, d, ld), d_norm_, d, ElementType::kFp32);
    norm_backward(tensor(p, l.norm1_weight), x, a.norm1_mean, a.norm1_rstd,
                  tensor(g, l.norm1_weight), tensor(g, l.norm1_bias));
  }

  void fill_zero(float* data, std::size_t count) {
    check(cudaMemsetAsync(data, 0, count * sizeof(float), stream_), "cudaMemsetAsync");
  }

  std::size_t chunk_rows_;
  bool flash_attention_ = false;  // the tensor-core attention (use_flash_attention)
  std::vector<Layer> layers_;
  bf16* head_norm_ = nullptr;
  float *head_mean_ = nullptr, *head_rstd_ = nullptr, *head_lse_ = nullptr;
  float* logits_ = nullptr;  // one chunk's
  bf16* dlogits_ = nullptr;  // one chunk's
  bf16* d_resid_bf16_ = nullptr;
  float *d_norm_ = nullptr, *d_qkv_ = nullptr, *delta_ = nullptr;
  bf16 *d_att_ = nullptr, *d_qkv_bf16_ = nullptr, *d_pre_ = nullptr, *d_act_ = nullptr;
  // The fp32 attention's inputs and output, widened (fallback only).
  float *qkv32_ = nullptr, *att32_ = nullptr, *d_att32_ = nullptr;
  bf16* weight_cache_ = nullptr;
  CacheSlots cache_slots_{};      // the weight cache's slots for a layer
  LayerWeights layer_weights_{};  // what the layer's products read (take_layer_weights)
  CacheHolds cache_holds_ = CacheHolds::kNothing;
  std::byte* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  mutable std::optional<cuda::LtGemm> gemm_;  // after workspace_: it keeps the pointer
};

}  // namespace

std::unique_ptr<CudaDecoder> make_cuda_bf16_decoder(const HfConfig& config,
                                                    const DecoderOptions& options,
                                                    tiers::Device& device) {
  return std::make_unique<CudaDecoderBf16>(config, options, device);
}

}  // namespace strata::llm::detail
