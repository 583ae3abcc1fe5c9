// flash_attention.hpp's entry points: argument checks, the fp32 interface's rounding into the
// scratch, and the launches (flash_attention_launch.hpp).
#include "models/decoder/flash_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "models/decoder/flash_attention_launch.hpp"

namespace strata::llm::cuda {
namespace {

using flash::Problem;

constexpr std::size_t kGridLimit = 65535;  // grid y (heads) and z (sequences)

bool head_dim_supported(std::size_t head_dim) {
  return head_dim > 0 && head_dim % 8 == 0 && head_dim <= kMaxAttentionHeadDim;
}

// The problem in the kernels' int arithmetic, or false for a shape they do not take.
bool make_problem(const AttentionDims& dims, Problem& p) {
  if (!head_dim_supported(dims.head_dim) || dims.kv_heads == 0 || dims.heads % dims.kv_heads != 0 ||
      dims.heads > kGridLimit || dims.sequences > kGridLimit ||
      dims.positions >= (std::size_t{1} << 30)) {
    return false;
  }
  p.sequences = static_cast<int>(dims.sequences);
  p.positions = static_cast<int>(dims.positions);
  p.heads = static_cast<int>(dims.heads);
  p.kv_heads = static_cast<int>(dims.kv_heads);
  p.group = p.heads / p.kv_heads;
  p.head_dim = static_cast<int>(dims.head_dim);
  // A window reaching past the first position restricts nothing.
  p.window = dims.window >= dims.positions ? 0 : static_cast<int>(dims.window);
  p.first_key = dims.first_key;
  p.scale = 1.0f / std::sqrt(static_cast<float>(dims.head_dim));
  p.scale_log2 = p.scale * 1.4426950408889634f;
  return true;
}

// cp.async copies 16 bytes: every row of every head must start on a 16-byte boundary.
bool aligned(Bf16Rows rows) {
  return reinterpret_cast<std::uintptr_t>(rows.data) % 16 == 0 && rows.ld % 8 == 0;
}

bool empty(const AttentionDims& dims) {
  return dims.sequences * dims.positions == 0;
}

}  // namespace

bool flash_attention_supported(std::size_t head_dim, int device) {
  if (!head_dim_supported(head_dim)) return false;
  int major = 0;
  int shared_optin = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess) {
    return false;
  }
  const int dim = static_cast<int>(head_dim);
  const std::size_t needed =
      std::max(flash::forward_shared_bytes(dim), flash::backward_shared_bytes(dim));
  return major >= 8 && static_cast<std::size_t>(shared_optin) >= needed;  // bf16 mma: sm_80
}

cudaError_t flash_attention_forward(const AttentionDims& dims, Bf16Rows q, Bf16Rows k, Bf16Rows v,
                                    FloatRows out, float* lse, cudaStream_t stream) {
  if (empty(dims)) return cudaSuccess;
  Problem p{};
  if (!make_problem(dims, p) || !aligned(q) || !aligned(k) || !aligned(v)) {
    return cudaErrorInvalidValue;
  }
  return flash::launch_forward({p, q, k, v, out, lse}, stream);
}

cudaError_t flash_attention_forward(const AttentionDims& dims, Bf16Rows q, Bf16Rows k, Bf16Rows v,
                                    Bf16MutRows out, float* lse, cudaStream_t stream) {
  if (empty(dims)) return cudaSuccess;
  Problem p{};
  if (!make_problem(dims, p) || !aligned(q) || !aligned(k) || !aligned(v) ||
      reinterpret_cast<std::uintptr_t>(out.data) % 4 != 0 || out.ld % 2 != 0) {
    return cudaErrorInvalidValue;
  }
  flash::ForwardArgs args{p, q, k, v, {nullptr, 0}, lse};
  args.out_bf16 = out;
  return flash::launch_forward(args, stream);
}

cudaError_t flash_attention_backward(const AttentionDims& dims, Bf16Rows dout, Bf16Rows out,
                                     Bf16Rows q, Bf16Rows k, Bf16Rows v, const float* lse,
                                     float* delta, FloatRows dq, FloatRows dk, FloatRows dv,
                                     cudaStream_t stream) {
  if (empty(dims)) return cudaSuccess;
  Problem p{};
  if (!make_problem(dims, p) || !aligned(dout) || !aligned(q) || !aligned(k) || !aligned(v)) {
    return cudaErrorInvalidValue;
  }
  const cudaError_t result =
      flash::launch_delta(p, dout.data, dout.ld, out.data, out.ld, delta, stream);
  if (result != cudaSuccess) return result;
  return flash::launch_gradients({p, q, k, v, dout, lse, delta, dq, dk, dv}, stream);
}

std::size_t flash_attention_scratch_elements(const AttentionDims& dims) {
  const std::size_t rows = dims.sequences * dims.positions;
  return rows * 2 * (dims.heads + dims.kv_heads) * dims.head_dim;
}

namespace {

// q, k, v (and dout) of the fp32 interface rounded to bf16, packed in the scratch: q [rows ×
// heads·head_dim], then k and v [rows × kv_heads·head_dim], then dout like q.
class RoundedInputs {
 public:
  RoundedInputs(const AttentionDims& dims, __nv_bfloat16* scratch, cudaStream_t stream)
      : rows_(dims.sequences * dims.positions),
        q_width_(dims.heads * dims.head_dim),
        kv_width_(dims.kv_heads * dims.head_dim),
        q_(scratch),
        k_(q_ + rows_ * q_width_),
        v_(k_ + rows_ * kv_width_),
        dout_(v_ + rows_ * kv_width_),
        stream_(stream) {}

  // Rounds q, k, v (row stride ld); the first failure is kept.
  cudaError_t round_qkv(const float* q, const float* k, const float* v, std::size_t ld) {
    round(q_, q_width_, q, ld);
    round(k_, kv_width_, k, ld);
    round(v_, kv_width_, v, ld);
    return result_;
  }
  cudaError_t round_dout(const float* dout, std::size_t ld) {
    round(dout_, q_width_, dout, ld);
    return result_;
  }

  Bf16Rows q() const { return {q_, q_width_}; }
  Bf16Rows k() const { return {k_, kv_width_}; }
  Bf16Rows v() const { return {v_, kv_width_}; }
  Bf16Rows dout() const { return {dout_, q_width_}; }

 private:
  void round(__nv_bfloat16* to, std::size_t width, const float* from, std::size_t ld) {
    if (result_ == cudaSuccess) result_ = cast_to_bf16(from, ld, to, width, rows_, width, stream_);
  }

  std::size_t rows_, q_width_, kv_width_;
  __nv_bfloat16 *q_, *k_, *v_, *dout_;
  cudaStream_t stream_;
  cudaError_t result_ = cudaSuccess;
};

}  // namespace

cudaError_t flash_attention_forward(const AttentionDims& dims, const float* q, const float* k,
                                    const float* v, std::size_t ld_qkv, float* out,
                                    std::size_t ld_out, float* lse, __nv_bfloat16* scratch,
                                    cudaStream_t stream) {
  if (empty(dims)) return cudaSuccess;
  Problem p{};
  if (!make_problem(dims, p)) return cudaErrorInvalidValue;
  RoundedInputs in(dims, scratch, stream);
  const cudaError_t result = in.round_qkv(q, k, v, ld_qkv);
  if (result != cudaSuccess) return result;
  return flash_attention_forward(dims, in.q(), in.k(), in.v(), {out, ld_out}, lse, stream);
}

cudaError_t flash_attention_backward(const AttentionDims& dims, const float* dout,
                                     std::size_t ld_out, const float* out, const float* q,
                                     const float* k, const float* v, std::size_t ld_qkv,
                                     const float* lse, float* delta, float* dq, float* dk,
                                     float* dv, __nv_bfloat16* scratch, cudaStream_t stream) {
  if (empty(dims)) return cudaSuccess;
  Problem p{};
  if (!make_problem(dims, p)) return cudaErrorInvalidValue;
  RoundedInputs in(dims, scratch, stream);
  cudaError_t result = in.round_qkv(q, k, v, ld_qkv);
  if (result == cudaSuccess) result = in.round_dout(dout, ld_out);
  // delta from the fp32 values: the closest rowsum(dO ∘ O) there is.
  if (result == cudaSuccess)
    result = flash::launch_delta(p, dout, ld_out, out, ld_out, delta, stream);
  if (result != cudaSuccess) return result;
  return flash::launch_gradients(
      {p, in.q(), in.k(), in.v(), in.dout(), lse, delta, {dq, ld_qkv}, {dk, ld_qkv}, {dv, ld_qkv}},
      stream);
}

}  // namespace strata::llm::cuda
