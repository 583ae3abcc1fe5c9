// The fused CUDA optimizer: one kernel launch per sub-group updates its state in device memory in
// place and writes the new 16-bit parameters in the same pass, bit for bit what cpu_adam's
// step_compressed() writes for the same StepPlan (the arithmetic is cuda_update_rules.cuh's).
//  - fp32 and bf16 moments: update_elements_kernel, a grid-stride loop over groups of kGroup
//    elements per thread; when every array starts on a 16-byte boundary a group moves as 16-byte
//    vectors (fp32: two float4, 16-bit: one uint4), else element by element (the same bits).
//  - int8 moments: update_int8_kernel, a thread block per 1 KiB quantization block at a time, 255
//    threads of 4 elements (1020): decode, update, the block's absmax in shared memory, encode.
// The element-wise update makes the grid shape irrelevant to the bits; the absmax is a max, exact
// in any order (NaNs skipped, as the CPU's selects skip them).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "tiers/device/cuda_optimizer.hpp"
#include "tiers/device/cuda_update_rules.cuh"

namespace strata::tiers::detail {
namespace {

using namespace gpu;  // NOLINT(google-build-using-namespace): the kernels' own arithmetic
using cpu_adam::DecayRun;
using cpu_adam::kQuantBlockBytes;
using cpu_adam::kQuantBlockElems;
using cpu_adam::StateDType;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kGroup = 8;      // elements per thread and iteration: 16-bit arrays move as uint4
constexpr int kInt8Group = 4;  // elements per thread in a quantization block: 255 x 4 = 1020
static_assert((kThreads - 1) * kInt8Group == static_cast<int>(kQuantBlockElems));

// Everything a kernel needs, by value (__grid_constant__: read in place, never copied).
struct KernelArgs {
  UpdateConstants with_decay;
  UpdateConstants without_decay;
  const DecayRun* runs;
  std::uint64_t run_count;
  std::uint64_t rounding_key;
  std::uint64_t first_element;
  std::uint64_t numel;
  void* master;
  void* compensation;
  std::byte* exp_avg;
  std::byte* exp_avg_sq;
  const void* grad;
  void* param_out;
  DType grad_dtype;
  DType out_dtype;
  bool has_out;
  bool vector;  // every array starts on a 16-byte boundary
};

// Elements left from `first`, at most `limit` (device code has no std::min).
__device__ __forceinline__ int elements_from(std::uint64_t first, std::uint64_t numel, int limit) {
  const std::uint64_t left = numel - first;
  return left < static_cast<std::uint64_t>(limit) ? static_cast<int>(left) : limit;
}

// ---- groups of N consecutive elements in registers ------------------------------------------

template <int N>
__device__ __forceinline__ void load_floats(const float* p, float (&out)[N], int n, bool vector) {
  if (vector && n == N) {
#pragma unroll
    for (int k = 0; k < N; k += 4) {
      const float4 q = *reinterpret_cast<const float4*>(p + k);
      out[k] = q.x;
      out[k + 1] = q.y;
      out[k + 2] = q.z;
      out[k + 3] = q.w;
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if (k < n) out[k] = p[k];
  }
}

template <int N>
__device__ __forceinline__ void store_floats(float* p, const float (&in)[N], int n, bool vector) {
  if (vector && n == N) {
#pragma unroll
    for (int k = 0; k < N; k += 4) {
      *reinterpret_cast<float4*>(p + k) = make_float4(in[k], in[k + 1], in[k + 2], in[k + 3]);
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if (k < n) p[k] = in[k];
  }
}

// 16-bit elements: the lower address is the low half of a word (little-endian).
__device__ __forceinline__ void split_word(std::uint32_t word, std::uint16_t& low,
                                           std::uint16_t& high) {
  low = static_cast<std::uint16_t>(word & 0xFFFFu);
  high = static_cast<std::uint16_t>(word >> 16);
}

__device__ __forceinline__ std::uint32_t join_word(std::uint16_t low, std::uint16_t high) {
  return static_cast<std::uint32_t>(low) | (static_cast<std::uint32_t>(high) << 16);
}

template <int N>
__device__ __forceinline__ void load_halves(const std::uint16_t* p, std::uint16_t (&out)[N], int n,
                                            bool vector) {
  static_assert(N == 4 || N == 8);
  if (vector && n == N) {
    if constexpr (N == 8) {
      const uint4 q = *reinterpret_cast<const uint4*>(p);
      split_word(q.x, out[0], out[1]);
      split_word(q.y, out[2], out[3]);
      split_word(q.z, out[4], out[5]);
      split_word(q.w, out[6], out[7]);
    } else {
      const uint2 q = *reinterpret_cast<const uint2*>(p);
      split_word(q.x, out[0], out[1]);
      split_word(q.y, out[2], out[3]);
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if (k < n) out[k] = p[k];
  }
}

template <int N>
__device__ __forceinline__ void store_halves(std::uint16_t* p, const std::uint16_t (&in)[N], int n,
                                             bool vector) {
  static_assert(N == 4 || N == 8);
  if (vector && n == N) {
    if constexpr (N == 8) {
      *reinterpret_cast<uint4*>(p) = make_uint4(join_word(in[0], in[1]), join_word(in[2], in[3]),
                                                join_word(in[4], in[5]), join_word(in[6], in[7]));
    } else {
      *reinterpret_cast<uint2*>(p) = make_uint2(join_word(in[0], in[1]), join_word(in[2], in[3]));
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if (k < n) p[k] = in[k];
  }
}

template <int N>
__device__ __forceinline__ void load_grad(const KernelArgs& a, std::uint64_t first, int n,
                                          float (&grad)[N]) {
  if (a.grad_dtype == DType::kFp32) {
    load_floats<N>(static_cast<const float*>(a.grad) + first, grad, n, a.vector);
    return;
  }
  std::uint16_t bits[N] = {};
  load_halves<N>(static_cast<const std::uint16_t*>(a.grad) + first, bits, n, a.vector);
  const bool bf16 = a.grad_dtype == DType::kBf16;
#pragma unroll
  for (int k = 0; k < N; ++k) grad[k] = bf16 ? to_float(Bf16{bits[k]}) : to_float(Fp16{bits[k]});
}

// ---- master weights: fp32, bf16 rounded stochastically, bf16 + Kahan low parts ---------------

// kept: the bf16 weights as stored (param_out is written from them); unused for fp32.
struct Fp32Master {
  static constexpr bool kFp32 = true;
  template <int N>
  __device__ static void load(const KernelArgs& a, std::uint64_t first, int n, float (&param)[N]) {
    load_floats<N>(static_cast<const float*>(a.master) + first, param, n, a.vector);
  }
  template <int N>
  __device__ static void store(const KernelArgs& a, std::uint64_t first, int n,
                               const float (&param)[N], std::uint16_t (&/*kept*/)[N]) {
    store_floats<N>(static_cast<float*>(a.master) + first, param, n, a.vector);
  }
};

struct StochasticBf16Master {
  static constexpr bool kFp32 = false;
  template <int N>
  __device__ static void load(const KernelArgs& a, std::uint64_t first, int n, float (&param)[N]) {
    std::uint16_t bits[N] = {};
    load_halves<N>(static_cast<const std::uint16_t*>(a.master) + first, bits, n, a.vector);
#pragma unroll
    for (int k = 0; k < N; ++k) param[k] = bf16_value(bits[k]);
  }
  template <int N>
  __device__ static void store(const KernelArgs& a, std::uint64_t first, int n,
                               const float (&param)[N], std::uint16_t (&kept)[N]) {
    const std::uint64_t element = a.first_element + first;
#pragma unroll
    for (int k = 0; k < N; ++k) kept[k] = round_master(param[k], a.rounding_key, element + k);
    store_halves<N>(static_cast<std::uint16_t*>(a.master) + first, kept, n, a.vector);
  }
};

struct KahanBf16Master {
  static constexpr bool kFp32 = false;
  template <int N>
  __device__ static void load(const KernelArgs& a, std::uint64_t first, int n, float (&param)[N]) {
    std::uint16_t weight[N] = {};
    std::uint16_t low[N] = {};
    load_halves<N>(static_cast<const std::uint16_t*>(a.master) + first, weight, n, a.vector);
    load_halves<N>(static_cast<const std::uint16_t*>(a.compensation) + first, low, n, a.vector);
#pragma unroll
    for (int k = 0; k < N; ++k) param[k] = join_compensated(weight[k], low[k]);
  }
  template <int N>
  __device__ static void store(const KernelArgs& a, std::uint64_t first, int n,
                               const float (&param)[N], std::uint16_t (&kept)[N]) {
    std::uint16_t low[N] = {};
#pragma unroll
    for (int k = 0; k < N; ++k) split_compensated(param[k], kept[k], low[k]);
    store_halves<N>(static_cast<std::uint16_t*>(a.master) + first, kept, n, a.vector);
    store_halves<N>(static_cast<std::uint16_t*>(a.compensation) + first, low, n, a.vector);
  }
};

// param_out: the fp32 master rounded to nearest, or the bf16 master as kept (converted for fp16).
template <class Master, int N>
__device__ __forceinline__ void store_out(const KernelArgs& a, std::uint64_t first, int n,
                                          const float (&param)[N], const std::uint16_t (&kept)[N]) {
  if (!a.has_out) return;
  const bool bf16 = a.out_dtype == DType::kBf16;
  std::uint16_t bits[N] = {};
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if constexpr (Master::kFp32) {
      bits[k] = bf16 ? to_bf16(param[k]).bits : to_fp16(param[k]).bits;
    } else {
      bits[k] = bf16 ? kept[k] : to_fp16(bf16_value(kept[k])).bits;
    }
  }
  store_halves<N>(static_cast<std::uint16_t*>(a.param_out) + first, bits, n, a.vector);
}

// ---- moments where they lie: fp32 or bf16 (rounded to nearest) -------------------------------

struct Fp32Moments {
  template <int N>
  __device__ static void load(const std::byte* state, std::uint64_t first, int n, float (&out)[N],
                              bool vector) {
    load_floats<N>(reinterpret_cast<const float*>(state) + first, out, n, vector);
  }
  template <int N>
  __device__ static void store(std::byte* state, std::uint64_t first, int n, const float (&in)[N],
                               bool vector) {
    store_floats<N>(reinterpret_cast<float*>(state) + first, in, n, vector);
  }
};

struct Bf16Moments {
  template <int N>
  __device__ static void load(const std::byte* state, std::uint64_t first, int n, float (&out)[N],
                              bool vector) {
    std::uint16_t bits[N] = {};
    load_halves<N>(reinterpret_cast<const std::uint16_t*>(state) + first, bits, n, vector);
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = bf16_value(bits[k]);
  }
  template <int N>
  __device__ static void store(std::byte* state, std::uint64_t first, int n, const float (&in)[N],
                               bool vector) {
    std::uint16_t bits[N] = {};
#pragma unroll
    for (int k = 0; k < N; ++k) bits[k] = to_bf16(in[k]).bits;
    store_halves<N>(reinterpret_cast<std::uint16_t*>(state) + first, bits, n, vector);
  }
};

// ---- per-tensor weight decay -----------------------------------------------------------------

// The run of the elements a thread visits, which only grow (grid-stride): a binary search at the
// first, then a step forward whenever an element passes the run's end.
class DecayCursor {
 public:
  __device__ DecayCursor(const DecayRun* runs, std::uint64_t count, std::uint64_t element)
      : runs_(runs) {
    if (count == 0) return;  // every element decays
    std::uint64_t low = 0;
    std::uint64_t high = count;
    while (low < high) {  // the first run that ends after `element`
      const std::uint64_t middle = low + (high - low) / 2;
      if (runs[middle].begin + runs[middle].numel <= element) {
        low = middle + 1;
      } else {
        high = middle;
      }
    }
    index_ = low;
    enter(index_);
  }
  // Runs tile [0, numel): an element of the sub-group is always inside one.
  __device__ bool decays(std::uint64_t element) {
    while (element >= end_) enter(++index_);
    return decays_;
  }

 private:
  __device__ void enter(std::uint64_t index) {
    end_ = runs_[index].begin + runs_[index].numel;
    decays_ = runs_[index].weight_decay;
  }
  const DecayRun* runs_;
  std::uint64_t index_ = 0;
  std::uint64_t end_ = ~std::uint64_t{0};
  bool decays_ = true;
};

template <class Rule, int N>
__device__ __forceinline__ void apply_rule(const KernelArgs& a, std::uint64_t first, int n,
                                           DecayCursor& decay, const float (&grad)[N],
                                           float (&param)[N], float (&exp_avg)[N],
                                           float (&exp_avg_sq)[N], float (&root)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if (k < n) {
      const UpdateConstants c = decay.decays(first + k) ? a.with_decay : a.without_decay;
      root[k] = Rule::apply(c, grad[k], param[k], exp_avg[k], exp_avg_sq[k]);
    }
  }
}

// ---- the kernels -----------------------------------------------------------------------------

template <class Rule, class Master, class Moments>
__global__ void __launch_bounds__(kThreads)
    update_elements_kernel(const __grid_constant__ KernelArgs a) {
  const std::uint64_t groups = (a.numel + kGroup - 1) / kGroup;
  std::uint64_t g = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= groups) return;
  DecayCursor decay(a.runs, a.run_count, g * kGroup);
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (; g < groups; g += stride) {
    const std::uint64_t first = g * kGroup;
    const int n = elements_from(first, a.numel, kGroup);
    float param[kGroup] = {};
    float exp_avg[kGroup] = {};
    float exp_avg_sq[kGroup] = {};
    float grad[kGroup] = {};
    float root[kGroup] = {};
    std::uint16_t kept[kGroup] = {};
    Master::template load<kGroup>(a, first, n, param);
    load_grad<kGroup>(a, first, n, grad);
    if constexpr (Rule::kExpAvg)
      Moments::template load<kGroup>(a.exp_avg, first, n, exp_avg, a.vector);
    if constexpr (Rule::kExpAvgSq) {
      Moments::template load<kGroup>(a.exp_avg_sq, first, n, exp_avg_sq, a.vector);
    }
    apply_rule<Rule, kGroup>(a, first, n, decay, grad, param, exp_avg, exp_avg_sq, root);
    if constexpr (Rule::kExpAvg)
      Moments::template store<kGroup>(a.exp_avg, first, n, exp_avg, a.vector);
    if constexpr (Rule::kExpAvgSq) {
      Moments::template store<kGroup>(a.exp_avg_sq, first, n, exp_avg_sq, a.vector);
    }
    Master::template store<kGroup>(a, first, n, param, kept);
    store_out<Master, kGroup>(a, first, n, param, kept);
  }
}

// Both maxima over the thread block, in every thread. Bracketed by barriers so the shared slots
// can be reused by the next quantization block.
__device__ void block_max(float& first, float& second, float (&slots)[2][kWarps]) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    first = fmaxf(first, __shfl_xor_sync(0xFFFF'FFFFu, first, offset));
    second = fmaxf(second, __shfl_xor_sync(0xFFFF'FFFFu, second, offset));
  }
  const int warp = static_cast<int>(threadIdx.x) / 32;
  if (threadIdx.x % 32 == 0) {
    slots[0][warp] = first;
    slots[1][warp] = second;
  }
  __syncthreads();
  first = slots[0][0];
  second = slots[1][0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) {
    first = fmaxf(first, slots[0][w]);
    second = fmaxf(second, slots[1][w]);
  }
  __syncthreads();
}

// The 4 codes of a thread's elements (their bytes in address order in one word) and the scale.
__device__ __forceinline__ std::uint32_t load_codes(const std::byte* block, int j0, float& scale) {
  scale = *reinterpret_cast<const float*>(block);
  return *reinterpret_cast<const std::uint32_t*>(block + sizeof(float) + j0);
}

__device__ __forceinline__ std::uint8_t code_byte(std::uint32_t codes, int k) {
  return static_cast<std::uint8_t>((codes >> (8 * k)) & 0xFFu);
}

// A thread's moments decoded from the int8 blocks' codes (each moment the rule keeps).
template <class Rule, int N>
__device__ __forceinline__ void decode_moments(const std::byte* avg_block,
                                               const std::byte* sq_block, int j0, int n,
                                               float (&exp_avg)[N], float (&exp_avg_sq)[N]) {
  float scale = 0.0f;
  if constexpr (Rule::kExpAvg) {
    const std::uint32_t codes = load_codes(avg_block, j0, scale);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (k < n)
        exp_avg[k] = decode_signed(static_cast<std::int8_t>(code_byte(codes, k)), scale);
    }
  }
  if constexpr (Rule::kExpAvgSq) {
    const std::uint32_t codes = load_codes(sq_block, j0, scale);
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (k < n) exp_avg_sq[k] = decode_unsigned(code_byte(codes, k), scale);
    }
  }
}

// A thread's moments encoded into the int8 blocks' codes, each block's scale its maximum (written
// by thread 0); sqrt(exp_avg_sq) is encoded from `root`.
template <class Rule, int N>
__device__ __forceinline__ void encode_moments(std::byte* avg_block, std::byte* sq_block, int j0,
                                               int n, float avg_max, float sq_max,
                                               const float (&exp_avg)[N], const float (&root)[N]) {
  if constexpr (Rule::kExpAvg) {
    const float inverse = inverse_of(avg_max);
    std::uint32_t codes = 0;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const std::uint8_t code =
          k < n ? static_cast<std::uint8_t>(encode_signed(exp_avg[k], inverse)) : 0;
      codes |= static_cast<std::uint32_t>(code) << (8 * k);
    }
    *reinterpret_cast<std::uint32_t*>(avg_block + sizeof(float) + j0) = codes;
    if (threadIdx.x == 0) *reinterpret_cast<float*>(avg_block) = avg_max;
  }
  if constexpr (Rule::kExpAvgSq) {
    const float factor = root_code_factor(sq_max);
    std::uint32_t codes = 0;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const std::uint8_t code = k < n ? encode_unsigned_root(root[k], factor) : 0;
      codes |= static_cast<std::uint32_t>(code) << (8 * k);
    }
    *reinterpret_cast<std::uint32_t*>(sq_block + sizeof(float) + j0) = codes;
    if (threadIdx.x == 0) *reinterpret_cast<float*>(sq_block) = sq_max;
  }
}

template <class Rule, class Master>
__global__ void __launch_bounds__(kThreads)
    update_int8_kernel(const __grid_constant__ KernelArgs a) {
  constexpr int N = kInt8Group;
  constexpr int kBlockElems = static_cast<int>(kQuantBlockElems);
  __shared__ float slots[2][kWarps];
  const std::uint64_t blocks = (a.numel + kQuantBlockElems - 1) / kQuantBlockElems;
  const int j0 = static_cast<int>(threadIdx.x) * N;  // thread 255 holds no element
  for (std::uint64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::uint64_t block_first = b * kQuantBlockElems;
    const int block_n = elements_from(block_first, a.numel, kBlockElems);
    const int n = block_n <= j0 ? 0 : (block_n - j0 < N ? block_n - j0 : N);
    const std::uint64_t first = block_first + static_cast<std::uint64_t>(j0);
    std::byte* avg_block = a.exp_avg + b * kQuantBlockBytes;
    std::byte* sq_block = a.exp_avg_sq + b * kQuantBlockBytes;
    float param[N] = {};
    float exp_avg[N] = {};
    float exp_avg_sq[N] = {};
    float grad[N] = {};
    float root[N] = {};
    std::uint16_t kept[N] = {};
    if (n > 0) {
      decode_moments<Rule, N>(avg_block, sq_block, j0, n, exp_avg, exp_avg_sq);
      Master::template load<N>(a, first, n, param);
      load_grad<N>(a, first, n, grad);
      DecayCursor decay(a.runs, a.run_count, first);
      apply_rule<Rule, N>(a, first, n, decay, grad, param, exp_avg, exp_avg_sq, root);
      Master::template store<N>(a, first, n, param, kept);
      store_out<Master, N>(a, first, n, param, kept);
    }
    float avg_max = 0.0f;  // block_absmax: max(0, |x|) over the block, NaNs skipped
    float sq_max = 0.0f;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if (k < n) {
        avg_max = fmaxf(avg_max, fabsf(exp_avg[k]));
        sq_max = fmaxf(sq_max, fabsf(exp_avg_sq[k]));
      }
    }
    block_max(avg_max, sq_max, slots);
    if (j0 >= kBlockElems) continue;  // codes past the block's n are zero (encode_block)
    encode_moments<Rule, N>(avg_block, sq_block, j0, n, avg_max, sq_max, exp_avg, root);
  }
}

// ---- launch ----------------------------------------------------------------------------------

// Resident blocks on the whole device (one wave; the kernels loop over the rest), at most
// `needed`. Each kernel's occupancy is asked once (a template per kernel, so each has its own; a
// process is assumed to drive GPUs of one architecture).
template <auto kKernel>
cudaError_t grid_size(std::uint64_t needed, unsigned& blocks) {
  int device = 0;
  int sms = 0;
  cudaError_t result = cudaGetDevice(&device);
  if (result == cudaSuccess) {
    result = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (result != cudaSuccess) return result;
  static const int per_sm = [] {
    int resident = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kKernel, kThreads, 0) !=
        cudaSuccess) {
      resident = 1;
    }
    return std::max(resident, 1);
  }();
  const std::uint64_t wave = static_cast<std::uint64_t>(sms) * static_cast<std::uint64_t>(per_sm);
  blocks = static_cast<unsigned>(std::max<std::uint64_t>(1, std::min(needed, wave)));
  return cudaSuccess;
}

template <class Rule, class Master, class Moments>
cudaError_t launch_elements(const KernelArgs& a, cudaStream_t stream) {
  constexpr auto kKernel = update_elements_kernel<Rule, Master, Moments>;
  const std::uint64_t groups = (a.numel + kGroup - 1) / kGroup;
  unsigned blocks = 0;
  const cudaError_t result = grid_size<kKernel>((groups + kThreads - 1) / kThreads, blocks);
  if (result != cudaSuccess) return result;
  kKernel<<<blocks, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <class Rule, class Master>
cudaError_t launch_int8(const KernelArgs& a, cudaStream_t stream) {
  constexpr auto kKernel = update_int8_kernel<Rule, Master>;
  unsigned blocks = 0;
  const cudaError_t result =
      grid_size<kKernel>((a.numel + kQuantBlockElems - 1) / kQuantBlockElems, blocks);
  if (result != cudaSuccess) return result;
  kKernel<<<blocks, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <class Rule, class Master>
cudaError_t launch_for_moments(const KernelArgs& a, StateDType moments, cudaStream_t stream) {
  switch (moments) {
    case StateDType::kFp32:
      return launch_elements<Rule, Master, Fp32Moments>(a, stream);
    case StateDType::kBf16:
      return launch_elements<Rule, Master, Bf16Moments>(a, stream);
    case StateDType::kInt8:
      return launch_int8<Rule, Master>(a, stream);
  }
  return cudaErrorInvalidValue;
}

template <class Rule>
cudaError_t launch_for_master(const OptimizerOp& op, const KernelArgs& a, cudaStream_t stream) {
  if (op.master_dtype == StateDType::kFp32) {
    return launch_for_moments<Rule, Fp32Master>(a, op.moment_dtype, stream);
  }
  if (op.master_dtype != StateDType::kBf16) return cudaErrorInvalidValue;
  if (op.compensation != nullptr) {
    return launch_for_moments<Rule, KahanBf16Master>(a, op.moment_dtype, stream);
  }
  return launch_for_moments<Rule, StochasticBf16Master>(a, op.moment_dtype, stream);
}

bool vector_aligned(const void* pointer) {
  return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0;
}

KernelArgs kernel_args(const OptimizerOp& op) {
  KernelArgs a{};
  a.with_decay = op.plan.with_decay;
  a.without_decay = op.plan.without_decay;
  a.runs = op.decay_runs;
  a.run_count = op.decay_run_count;
  a.rounding_key = op.plan.rounding_key;
  a.first_element = op.plan.first_element;
  a.numel = op.numel;
  a.master = op.master;
  a.compensation = op.compensation;
  a.exp_avg =
      cpu_adam::rule_uses_exp_avg(op.plan.rule) ? static_cast<std::byte*>(op.exp_avg) : nullptr;
  a.exp_avg_sq = cpu_adam::rule_uses_exp_avg_sq(op.plan.rule)
                     ? static_cast<std::byte*>(op.exp_avg_sq)
                     : nullptr;
  a.grad = op.grad;
  a.param_out = op.param_out;
  a.grad_dtype = op.grad_dtype;
  a.out_dtype = op.param_out_dtype;
  a.has_out = op.param_out != nullptr;
  // Absent arrays (null) count as aligned.
  a.vector = vector_aligned(a.master) && vector_aligned(a.compensation) &&
             vector_aligned(a.exp_avg) && vector_aligned(a.exp_avg_sq) && vector_aligned(a.grad) &&
             vector_aligned(a.param_out);
  return a;
}

}  // namespace

cudaError_t launch_optimizer(const OptimizerOp& op, cudaStream_t stream) {
  if (op.numel == 0) return cudaSuccess;
  const KernelArgs a = kernel_args(op);
  switch (op.plan.rule) {
    case cpu_adam::UpdateRule::kAdam:
      return launch_for_master<AdamRule>(op, a, stream);
    case cpu_adam::UpdateRule::kAdagrad:
      return launch_for_master<AdagradRule>(op, a, stream);
    case cpu_adam::UpdateRule::kLion:
      return launch_for_master<LionRule>(op, a, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace strata::tiers::detail
