// The kernel bodies, written once over an Ops type (VectorOps<Arch> or ScalarOps) and
// instantiated by each kernels_<level>.cpp. Include only from those files.
//
// Bitwise identity across levels, thread counts and chunkings rests on three rules:
//  - every element goes through the same sequence of fp32 operations (mul, add, sub, div, sqrt:
//    all correctly rounded), with no FMA contraction (-ffp-contract=off on these files);
//  - loop tails use ScalarOps with the same sequence, so where a chunk ends does not matter;
//  - the norm accumulates in double in a fixed lane layout that does not depend on the width.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu_adam/detail/kernel_table.hpp"
#include "cpu_adam/detail/state_codec.hpp"
#include "cpu_adam/detail/vector_ops.hpp"

namespace strata::cpu_adam::detail {
namespace {

// Out = void means "no param_out".
template <class Ops, class Out>
inline void store_out(const UpdateArgs& args, std::size_t i, typename Ops::F value) {
  if constexpr (!std::is_void_v<Out>) Ops::store(static_cast<Out*>(args.param_out) + i, value);
}

// The Master type of a Kahan-compensated bf16 master: args.master_bf16 + args.master_low.
struct KahanBf16 {};

// Master = float: args.master, fp32. Master = Bf16: args.master_bf16, stored by stochastic
// rounding (step_compressed's bf16 master, its block's elements in one 2^32 range of indices).
// Master = KahanBf16: weights and low parts joined on load and split on store (state_codec.hpp's
// join (add_nonzero) and split_compensated, element by element).
template <class Ops, class Master>
inline typename Ops::F load_master(const UpdateArgs& args, std::size_t i) {
  if constexpr (std::is_same_v<Master, Bf16>) {
    return Ops::load(args.master_bf16 + i);
  } else if constexpr (std::is_same_v<Master, KahanBf16>) {
    return Ops::add_nonzero(Ops::load(args.master_bf16 + i), Ops::load(args.master_low + i));
  } else {
    return Ops::load(args.master + i);
  }
}

template <class Ops, class Master>
inline void store_master(const UpdateArgs& args, std::size_t i, typename Ops::F value) {
  using F = typename Ops::F;
  if constexpr (std::is_same_v<Master, Bf16>) {
    Ops::store_stochastic(args.master_bf16 + i, value, args.rounding_high_key,
                          args.rounding_first_low + static_cast<std::uint32_t>(i));
  } else if constexpr (std::is_same_v<Master, KahanBf16>) {
    Ops::store(args.master_bf16 + i, value);
    const F residual = value - Ops::load(args.master_bf16 + i);
    Ops::store(args.master_low + i, Ops::truncate_bf16(Ops::nan_to_zero(residual)) + F(0.0f));
  } else {
    Ops::store(args.master + i, value);
  }
}

// Moments = float: args.exp_avg and args.exp_avg_sq, fp32, read and written. Bf16:
// args.exp_avg_bf16 and args.exp_avg_sq_bf16 (step_compressed's bf16 moments), read and written
// rounded to nearest.
template <class Ops, class Moments>
inline typename Ops::F load_exp_avg(const UpdateArgs& args, std::size_t i) {
  if constexpr (std::is_same_v<Moments, Bf16>) {
    return Ops::load(args.exp_avg_bf16 + i);
  } else {
    return Ops::load(args.exp_avg + i);
  }
}

template <class Ops, class Moments>
inline typename Ops::F load_exp_avg_sq(const UpdateArgs& args, std::size_t i) {
  if constexpr (std::is_same_v<Moments, Bf16>) {
    return Ops::load(args.exp_avg_sq_bf16 + i);
  } else {
    return Ops::load(args.exp_avg_sq + i);
  }
}

template <class Ops, class Moments>
inline void store_exp_avg(const UpdateArgs& args, std::size_t i, typename Ops::F value) {
  if constexpr (std::is_same_v<Moments, Bf16>) {
    Ops::store(args.exp_avg_bf16 + i, value);
  } else {
    Ops::store(args.exp_avg + i, value);
  }
}

template <class Ops, class Moments>
inline void store_exp_avg_sq(const UpdateArgs& args, std::size_t i, typename Ops::F value) {
  if constexpr (std::is_same_v<Moments, Bf16>) {
    Ops::store(args.exp_avg_sq_bf16 + i, value);
  } else {
    Ops::store(args.exp_avg_sq + i, value);
  }
}

template <class Ops, class Grad>
inline typename Ops::F load_scaled_grad(const UpdateArgs& args, std::size_t i) {
  using F = typename Ops::F;
  return Ops::load(static_cast<const Grad*>(args.grad) + i) * F(args.constants.grad_multiplier);
}

struct AdamRule {
  template <class Ops, class Grad, class Out, class Master, class Moments>
  static void apply(const UpdateArgs& args, std::size_t i) {
    using F = typename Ops::F;
    const UpdateConstants& c = args.constants;
    F param = load_master<Ops, Master>(args, i);
    F grad = load_scaled_grad<Ops, Grad>(args, i);
    if (c.use_l2) grad = grad + F(c.l2) * param;
    const F exp_avg =
        F(c.beta1) * load_exp_avg<Ops, Moments>(args, i) + F(c.one_minus_beta1) * grad;
    const F exp_avg_sq = F(c.beta2) * load_exp_avg_sq<Ops, Moments>(args, i) +
                         F(c.one_minus_beta2) * (grad * grad);
    const F root = Ops::sqrt(exp_avg_sq);
    if (args.exp_avg_sq_root != nullptr) Ops::store(args.exp_avg_sq_root + i, root);
    const F denom = root * F(c.inv_sqrt_bias_correction2) + F(c.eps);
    if (c.use_decay) param = param * F(c.decay);
    // Divide first: exp_avg / denom is well scaled, while step_size * exp_avg can fall into the
    // denormals, where its rounding error would then be magnified by the division.
    param = param - F(c.step_size) * (exp_avg / denom);
    store_exp_avg<Ops, Moments>(args, i, exp_avg);
    store_exp_avg_sq<Ops, Moments>(args, i, exp_avg_sq);
    store_master<Ops, Master>(args, i, param);
    store_out<Ops, Out>(args, i, param);
  }
};

struct AdagradRule {
  template <class Ops, class Grad, class Out, class Master, class Moments>
  static void apply(const UpdateArgs& args, std::size_t i) {
    using F = typename Ops::F;
    const UpdateConstants& c = args.constants;
    F param = load_master<Ops, Master>(args, i);
    F grad = load_scaled_grad<Ops, Grad>(args, i);
    if (c.use_l2) grad = grad + F(c.l2) * param;
    const F sum_sq = load_exp_avg_sq<Ops, Moments>(args, i) + grad * grad;
    const F root = Ops::sqrt(sum_sq);
    if (args.exp_avg_sq_root != nullptr) Ops::store(args.exp_avg_sq_root + i, root);
    param = param - F(c.step_size) * (grad / (root + F(c.eps)));
    store_exp_avg_sq<Ops, Moments>(args, i, sum_sq);
    store_master<Ops, Master>(args, i, param);
    store_out<Ops, Out>(args, i, param);
  }
};

struct LionRule {
  template <class Ops, class Grad, class Out, class Master, class Moments>
  static void apply(const UpdateArgs& args, std::size_t i) {
    using F = typename Ops::F;
    const UpdateConstants& c = args.constants;
    F param = load_master<Ops, Master>(args, i);
    const F grad = load_scaled_grad<Ops, Grad>(args, i);
    const F exp_avg = load_exp_avg<Ops, Moments>(args, i);
    const F direction = F(c.beta1) * exp_avg + F(c.one_minus_beta1) * grad;
    if (c.use_decay) param = param * F(c.decay);
    param = param - F(c.step_size) * Ops::sign(direction);
    store_exp_avg<Ops, Moments>(args, i, F(c.beta2) * exp_avg + F(c.one_minus_beta2) * grad);
    store_master<Ops, Master>(args, i, param);
    store_out<Ops, Out>(args, i, param);
  }
};

template <class V, class Rule, class Grad, class Out, class Master = float,
          class Moments = float>
void update_kernel(const UpdateArgs& shared_args, std::size_t begin, std::size_t end) {
  // A local copy: the float stores could alias the caller's constants and pointers, which would
  // then be reloaded every vector; a copy whose address never escapes stays in registers.
  const UpdateArgs args = shared_args;
  std::size_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) {
    Rule::template apply<V, Grad, Out, Master, Moments>(args, i);
  }
  for (; i < end; ++i) Rule::template apply<ScalarOps, Grad, Out, Master, Moments>(args, i);
}

// The n elements of the block at `first` through the rule, each decay run with its constants.
template <class V, class Rule, class Grad, class Out, class Master, class Moments>
void update_runs(const CompressedArgs& a, UpdateArgs block, std::uint64_t first, std::size_t n) {
  const std::uint64_t last = first + n;
  if (a.run_count == 0) {
    block.constants = a.with_decay;
    update_kernel<V, Rule, Grad, Out, Master, Moments>(block, 0, n);
    return;
  }
  // The first run that ends after `first`.
  const DecayRun* run = std::upper_bound(
      a.runs, a.runs + a.run_count, first,
      [](std::uint64_t element, const DecayRun& r) { return element < r.begin + r.numel; });
  for (; run != a.runs + a.run_count && run->begin < last; ++run) {
    const std::uint64_t begin = std::max(run->begin, first);
    const std::uint64_t end = std::min(run->begin + run->numel, last);
    block.constants = run->weight_decay ? a.with_decay : a.without_decay;
    update_kernel<V, Rule, Grad, Out, Master, Moments>(block, begin - first, end - first);
  }
}

// The n elements of the block at `first` through update_runs (block's master fields set): fp32
// and bf16 moments are read and written where they lie; int8 ones are decoded into the fp32
// buffers first (a separate pass measured faster than decoding inside the update, ~39 vs ~44 ms
// per 3e7 elements on Zen 4), and the update leaves them there for the block's encode.
template <class V, class Rule, class Grad, class Out, class Master>
void update_block(const CompressedArgs& a, UpdateArgs& block, std::uint64_t first, std::size_t n,
                  float* exp_avg, float* exp_avg_sq) {
  switch (a.moment_dtype) {
    case StateDType::kFp32:
      if (a.exp_avg) block.exp_avg = reinterpret_cast<float*>(a.exp_avg) + first;
      if (a.exp_avg_sq) block.exp_avg_sq = reinterpret_cast<float*>(a.exp_avg_sq) + first;
      update_runs<V, Rule, Grad, Out, Master, float>(a, block, first, n);
      return;
    case StateDType::kBf16:
      if (a.exp_avg) block.exp_avg_bf16 = reinterpret_cast<Bf16*>(a.exp_avg) + first;
      if (a.exp_avg_sq) block.exp_avg_sq_bf16 = reinterpret_cast<Bf16*>(a.exp_avg_sq) + first;
      update_runs<V, Rule, Grad, Out, Master, Bf16>(a, block, first, n);
      return;
    case StateDType::kInt8:
      if (a.exp_avg) {
        decode_moment<V>(StateDType::kInt8, MomentKind::kExpAvg, a.exp_avg, first, n, exp_avg);
        block.exp_avg = exp_avg;
      }
      if (a.exp_avg_sq) {
        decode_moment<V>(StateDType::kInt8, MomentKind::kExpAvgSq, a.exp_avg_sq, first, n,
                         exp_avg_sq);
        block.exp_avg_sq = exp_avg_sq;
      }
      update_runs<V, Rule, Grad, Out, Master, float>(a, block, first, n);
      return;
  }
}

// One block: the update reads and writes fp32 and bf16 state where it lies; int8 moments go
// through cache-resident fp32 buffers and are encoded once the block's absmax is known
// (exp_avg_sq from the roots the update took, encode_root_block). A bf16 master is rounded
// stochastically by the update itself, and param_out then written from the rounded master (what
// the model keeps); a compensated one (Kahan) is joined with its low parts as it is loaded and
// split back as it is stored. A block whose element indices
// cross a multiple of 2^32 (its noise lanes would carry into the high word) instead updates an
// fp32 copy of its master and rounds it with round_master, which gives the same bits.
template <class V, class Rule, class Grad, class Out>
void compressed_kernel(const CompressedArgs& a, std::size_t begin_block, std::size_t end_block) {
  alignas(64) float master[kQuantBlockElems];
  alignas(64) float exp_avg[kQuantBlockElems];
  alignas(64) float exp_avg_sq[kQuantBlockElems];
  alignas(64) float exp_avg_sq_root[kQuantBlockElems];
  const bool bf16_master = a.master_dtype == StateDType::kBf16;
  const bool int8 = a.moment_dtype == StateDType::kInt8;
  for (std::size_t b = begin_block; b < end_block; ++b) {
    const std::uint64_t first = b * kQuantBlockElems;
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(
        kQuantBlockElems, a.numel - first));
    UpdateArgs block;
    block.grad = static_cast<const Grad*>(a.grad) + first;
    if (int8 && a.exp_avg_sq) block.exp_avg_sq_root = exp_avg_sq_root;
    Bf16* kept = reinterpret_cast<Bf16*>(a.master) + first;
    const std::uint64_t element = a.first_element + first;
    if (!bf16_master) {
      block.master = reinterpret_cast<float*>(a.master) + first;
      if constexpr (!std::is_void_v<Out>) block.param_out = static_cast<Out*>(a.param_out) + first;
      update_block<V, Rule, Grad, Out, float>(a, block, first, n, exp_avg, exp_avg_sq);
    } else if (a.compensation != nullptr) {
      block.master_bf16 = kept;
      block.master_low = reinterpret_cast<Bf16*>(a.compensation) + first;
      update_block<V, Rule, Grad, void, KahanBf16>(a, block, first, n, exp_avg, exp_avg_sq);
    } else if ((element & 0xFFFF'FFFFu) + n <= (std::uint64_t{1} << 32)) {
      block.master_bf16 = kept;
      block.rounding_high_key = rounding_high_key(a.rounding_key, element);
      block.rounding_first_low = static_cast<std::uint32_t>(element);
      update_block<V, Rule, Grad, void, Bf16>(a, block, first, n, exp_avg, exp_avg_sq);
    } else {
      decode_moment<V>(StateDType::kBf16, MomentKind::kExpAvg, a.master, first, n, master);
      block.master = master;
      update_block<V, Rule, Grad, void, float>(a, block, first, n, exp_avg, exp_avg_sq);
      round_master<V>(a.rounding_key, element, master, n, kept);
    }
    if (int8 && a.exp_avg) {
      encode_moment<V>(StateDType::kInt8, MomentKind::kExpAvg, exp_avg, first, n, a.exp_avg);
    }
    if (int8 && a.exp_avg_sq) {
      encode_root_block<V>(exp_avg_sq, exp_avg_sq_root, n,
                           a.exp_avg_sq + first / kQuantBlockElems * kQuantBlockBytes);
    }
    if (!bf16_master) continue;
    if constexpr (std::is_same_v<Out, Bf16>) {
      std::memcpy(static_cast<Bf16*>(a.param_out) + first, kept, n * sizeof(Bf16));
    } else if constexpr (std::is_same_v<Out, Fp16>) {
      Fp16* out = static_cast<Fp16*>(a.param_out) + first;
      std::size_t i = 0;
      for (; i + V::kWidth <= n; i += V::kWidth) V::store(out + i, V::load(kept + i));
      for (; i < n; ++i) ScalarOps::store(out + i, ScalarOps::load(kept + i));
    }
  }
}

// V supplies D (double vector), kWidth elements per widen(), kDoubles per D, zero_d, square_add,
// store_d; ScalarOps (kWidth 1) takes the plain loop.
template <class V, class Grad>
double norm_kernel(const void* data, std::size_t begin, std::size_t end) {
  const Grad* values = static_cast<const Grad*>(data);
  double lanes[kNormLanes] = {};
  std::size_t i = begin;
  if constexpr (V::kWidth > 1) {
    using D = typename V::D;
    constexpr std::size_t kAccumulators = kNormLanes / V::kDoubles;
    D sums[kAccumulators];
    for (auto& sum : sums) sum = V::zero_d();
    for (; i + kNormLanes <= end; i += kNormLanes) {
      for (std::size_t k = 0; k < kNormLanes / V::kWidth; ++k) {
        D low;
        D high;
        V::widen(values + i + k * V::kWidth, low, high);
        // x*x is exact in double for any fp32 x, so the add is the only rounding and a fused
        // multiply-add (AVX2, AVX-512) gives the same bits as SSE2's separate mul and add.
        sums[2 * k] = V::square_add(low, sums[2 * k]);
        sums[2 * k + 1] = V::square_add(high, sums[2 * k + 1]);
      }
    }
    for (std::size_t k = 0; k < kAccumulators; ++k) V::store_d(lanes + k * V::kDoubles, sums[k]);
  } else {
    // Whole rows of lanes first: independent chains the compiler can keep in registers.
    for (; i + kNormLanes <= end; i += kNormLanes) {
      for (std::size_t k = 0; k < kNormLanes; ++k) {
        const double value = to_float(values[i + k]);
        lanes[k] += value * value;
      }
    }
  }
  for (; i < end; ++i) {
    const double value = to_float(values[i]);
    lanes[(i - begin) % kNormLanes] += value * value;
  }
  for (std::size_t stride = kNormLanes / 2; stride > 0; stride /= 2) {
    for (std::size_t k = 0; k < stride; ++k) lanes[k] += lanes[k + stride];
  }
  return lanes[0];
}

template <class T>
inline void touch_scalar(T* p) {
  volatile T* slot = p;
  *slot = *slot;
}

// Same bytes read and written as update_kernel<V, ..., Grad, Out>, no arithmetic: the bound.
template <class V, class Grad, class Out>
void stream_kernel(const UpdateArgs& args, std::size_t begin, std::size_t end) {
  using F = typename V::F;
  std::size_t i = begin;
  if constexpr (V::kWidth > 1) {
    constexpr std::size_t kW = V::kWidth;
    // Two vectors of elements per step, so 16-bit arrays move whole fp32 vectors of raw bits.
    for (; i + 2 * kW <= end; i += 2 * kW) {
      F master0 = V::load(args.master + i);
      F master1 = V::load(args.master + i + kW);
      F avg0 = V::load(args.exp_avg + i);
      F avg1 = V::load(args.exp_avg + i + kW);
      F sq0 = V::load(args.exp_avg_sq + i);
      F sq1 = V::load(args.exp_avg_sq + i + kW);
      const Grad* grad = static_cast<const Grad*>(args.grad) + i;
      F grad0 = V::load(reinterpret_cast<const float*>(grad));
      V::opaque(grad0);
      if constexpr (sizeof(Grad) == 4) {
        F grad1 = V::load(reinterpret_cast<const float*>(grad + kW));
        V::opaque(grad1);
      }
      V::opaque(master0);
      V::opaque(master1);
      V::opaque(avg0);
      V::opaque(avg1);
      V::opaque(sq0);
      V::opaque(sq1);
      V::store(args.master + i, master0);
      V::store(args.master + i + kW, master1);
      V::store(args.exp_avg + i, avg0);
      V::store(args.exp_avg + i + kW, avg1);
      V::store(args.exp_avg_sq + i, sq0);
      V::store(args.exp_avg_sq + i + kW, sq1);
      if constexpr (!std::is_void_v<Out>) {
        V::store(reinterpret_cast<float*>(static_cast<Out*>(args.param_out) + i), master0);
      }
    }
  }
  for (; i < end; ++i) {
    touch_scalar(args.master + i);
    touch_scalar(args.exp_avg + i);
    touch_scalar(args.exp_avg_sq + i);
    [[maybe_unused]] const unsigned char grad_byte =
        static_cast<const volatile unsigned char*>(args.grad)[i * sizeof(Grad)];
    if constexpr (!std::is_void_v<Out>) {
      static_cast<volatile std::uint16_t*>(args.param_out)[i] = 0;
    }
  }
}

template <class V, class Source, class Destination>
void convert_kernel(const void* source, void* destination, std::size_t begin, std::size_t end) {
  const Source* from = static_cast<const Source*>(source);
  Destination* to = static_cast<Destination*>(destination);
  std::size_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) V::store(to + i, V::load(from + i));
  for (; i < end; ++i) ScalarOps::store(to + i, ScalarOps::load(from + i));
}

template <class Ops, class T>
inline void scale_at(T* data, float factor, std::size_t i) {
  using F = typename Ops::F;
  Ops::store(data + i, Ops::load(data + i) * F(factor));
}

template <class V, class T>
void scale_kernel(void* data, float factor, std::size_t begin, std::size_t end) {
  T* values = static_cast<T*>(data);
  std::size_t i = begin;
  for (; i + V::kWidth <= end; i += V::kWidth) scale_at<V>(values, factor, i);
  for (; i < end; ++i) scale_at<ScalarOps>(values, factor, i);
}

// dtype index -> element type; kOut* index -> output type (void for none).
template <int kDtype>
using DtypeType =
    std::conditional_t<kDtype == 0, float, std::conditional_t<kDtype == 1, Bf16, Fp16>>;
template <int kOut>
using OutType =
    std::conditional_t<kOut == kOutNone, void, std::conditional_t<kOut == kOutBf16, Bf16, Fp16>>;

template <class V, class Rule, int kGrad, int kOut>
constexpr void fill_update(KernelTable& table, int rule) {
  table.update[rule][kGrad][kOut] = &update_kernel<V, Rule, DtypeType<kGrad>, OutType<kOut>>;
}

template <class V, class Rule, int kGrad, int kOut>
constexpr void fill_compressed(KernelTable& table, int rule) {
  table.compressed[rule][kGrad][kOut] =
      &compressed_kernel<V, Rule, DtypeType<kGrad>, OutType<kOut>>;
}

template <class V, class Rule>
constexpr void fill_compressed_rule(KernelTable& table, UpdateRule rule) {
  const int r = static_cast<int>(rule);
  fill_compressed<V, Rule, 0, 0>(table, r);
  fill_compressed<V, Rule, 0, 1>(table, r);
  fill_compressed<V, Rule, 0, 2>(table, r);
  fill_compressed<V, Rule, 1, 0>(table, r);
  fill_compressed<V, Rule, 1, 1>(table, r);
  fill_compressed<V, Rule, 1, 2>(table, r);
  fill_compressed<V, Rule, 2, 0>(table, r);
  fill_compressed<V, Rule, 2, 1>(table, r);
  fill_compressed<V, Rule, 2, 2>(table, r);
}

template <class V, class Rule>
constexpr void fill_rule(KernelTable& table, UpdateRule rule) {
  const int r = static_cast<int>(rule);
  fill_compressed_rule<V, Rule>(table, rule);
  fill_update<V, Rule, 0, 0>(table, r);
  fill_update<V, Rule, 0, 1>(table, r);
  fill_update<V, Rule, 0, 2>(table, r);
  fill_update<V, Rule, 1, 0>(table, r);
  fill_update<V, Rule, 1, 1>(table, r);
  fill_update<V, Rule, 1, 2>(table, r);
  fill_update<V, Rule, 2, 0>(table, r);
  fill_update<V, Rule, 2, 1>(table, r);
  fill_update<V, Rule, 2, 2>(table, r);
}

template <class V, int kGrad>
constexpr void fill_stream(KernelTable& table) {
  using Grad = DtypeType<kGrad>;
  table.stream[kGrad][kOutNone] = &stream_kernel<V, Grad, void>;
  table.stream[kGrad][kOutBf16] = &stream_kernel<V, Grad, Bf16>;
  table.stream[kGrad][kOutFp16] = &stream_kernel<V, Grad, Fp16>;
}

// NormV lets a level use narrower vectors for the norm (same bits: the lane layout is fixed).
template <class V, class NormV = V>
KernelTable make_kernel_table(SimdLevel level) {
  KernelTable table{};
  table.level = level;
  fill_rule<V, AdamRule>(table, UpdateRule::kAdam);
  fill_rule<V, AdagradRule>(table, UpdateRule::kAdagrad);
  fill_rule<V, LionRule>(table, UpdateRule::kLion);
  table.norm[0] = &norm_kernel<NormV, float>;
  table.norm[1] = &norm_kernel<NormV, Bf16>;
  table.norm[2] = &norm_kernel<NormV, Fp16>;
  fill_stream<V, 0>(table);
  fill_stream<V, 1>(table);
  fill_stream<V, 2>(table);
  table.convert[0][1] = &convert_kernel<V, float, Bf16>;
  table.convert[0][2] = &convert_kernel<V, float, Fp16>;
  table.convert[1][0] = &convert_kernel<V, Bf16, float>;
  table.convert[2][0] = &convert_kernel<V, Fp16, float>;
  table.convert[1][2] = &convert_kernel<V, Bf16, Fp16>;
  table.convert[2][1] = &convert_kernel<V, Fp16, Bf16>;
  table.scale[0] = &scale_kernel<V, float>;
  table.scale[1] = &scale_kernel<V, Bf16>;
  table.scale[2] = &scale_kernel<V, Fp16>;
  table.decode = &decode_moment<V>;
  table.encode = &encode_moment<V>;
  return table;
}

}  // namespace
}  // namespace strata::cpu_adam::detail
