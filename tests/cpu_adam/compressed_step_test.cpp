// Proves step_compressed(): with fp32 state it is step() bit for bit (decay runs included); every
// state format gives the same bytes for every SIMD level, thread count and chunking; bf16 masters
// round stochastically without bias, Kahan-compensated ones follow a float64 reference; and 8-bit
// moments track the fp32 update.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "cpu_adam/compressed_step.hpp"
#include "cpu_adam/optimizer.hpp"
#include "cpu_adam/simd_level.hpp"
#include "cpu_adam/state_format.hpp"
#include "tests/cpu_adam/test_support.hpp"

namespace strata::cpu_adam {
namespace {

using testing::TypedBuffer;

constexpr std::size_t kCount = 4 * kQuantBlockElems + 123;

// A sub-group's state in the given formats, filled from the same fp32 values.
// kahan: a bf16 master with its compensation (the master's values split into weights and low
// parts).
struct State {
  StateDType master_dtype;
  StateDType moment_dtype;
  std::vector<std::byte> master, compensation, exp_avg, exp_avg_sq;
  TypedBuffer out;

  State(StateDType master_in, StateDType moment_in, std::uint64_t seed, bool edges = true,
        DType out_dtype = DType::kBf16, bool kahan = false)
      : master_dtype(master_in), moment_dtype(moment_in), out(out_dtype, kCount) {
    std::mt19937_64 rng(seed);
    std::vector<float> m(kCount), a(kCount), s(kCount);
    for (std::size_t i = 0; i < kCount; ++i) {
      m[i] = testing::random_value(rng, -6, 2, edges);
      a[i] = testing::random_value(rng, -12, -4, edges);
      s[i] = std::fabs(testing::random_value(rng, -24, -8, edges));
    }
    tbb::task_arena arena(1);
    master.resize(state_bytes(master_dtype, kCount));
    exp_avg.resize(state_bytes(moment_dtype, kCount));
    exp_avg_sq.resize(state_bytes(moment_dtype, kCount));
    encode_state(master_dtype, MomentKind::kExpAvg, m.data(), kCount, master.data(), arena);
    if (kahan) {
      compensation.resize(kCount * sizeof(Bf16));
      split_compensated(m.data(), kCount, master.data(), compensation.data(), arena);
    }
    encode_state(moment_dtype, MomentKind::kExpAvg, a.data(), kCount, exp_avg.data(), arena);
    encode_state(moment_dtype, MomentKind::kExpAvgSq, s.data(), kCount, exp_avg_sq.data(), arena);
  }
  CompressedSpans spans(const TypedBuffer& grad) {
    CompressedSpans spans;
    spans.numel = kCount;
    spans.master_dtype = master_dtype;
    spans.moment_dtype = moment_dtype;
    spans.master = master.data();
    if (!compensation.empty()) spans.compensation = compensation.data();
    spans.exp_avg = exp_avg.data();
    spans.exp_avg_sq = exp_avg_sq.data();
    spans.grad = grad.cspan();
    spans.param_out = out.span();
    return spans;
  }
  bool operator==(const State& other) const {
    return master == other.master && compensation == other.compensation &&
           exp_avg == other.exp_avg && exp_avg_sq == other.exp_avg_sq &&
           out.same_bytes(other.out);
  }
};

TypedBuffer random_grad(DType dtype, std::uint64_t seed, bool edges = true) {
  std::mt19937_64 rng(seed);
  TypedBuffer grad(dtype, kCount);
  for (std::size_t i = 0; i < kCount; ++i) grad.set(i, testing::random_value(rng, -16, 0, edges));
  return grad;
}

Hyperparams hyper_for(Algorithm algorithm, int step) {
  Hyperparams h;
  h.algorithm = algorithm;
  h.step = step;
  h.lr = 1e-3 * step;
  h.weight_decay = 0.01;
  h.beta2 = algorithm == Algorithm::kLion ? 0.99 : 0.999;
  return h;
}

// Runs that cut blocks in odd places: decay, no decay, decay.
const std::vector<DecayRun> kRuns = {
    {0, 700, true},
    {700, 2 * kQuantBlockElems, false},
    {700 + 2 * kQuantBlockElems, kCount - 700 - 2 * kQuantBlockElems, true}};

TEST(CompressedStep, Fp32StateIsStepBitForBit) {
  const std::uint64_t seed = testing::test_seed(31);
  tbb::task_arena arena(2);
  for (Algorithm algorithm :
       {Algorithm::kAdamW, Algorithm::kAdam, Algorithm::kAdagrad, Algorithm::kLion}) {
    State compressed(StateDType::kFp32, StateDType::kFp32, seed);
    State plain(StateDType::kFp32, StateDType::kFp32, seed);
    for (int step = 1; step <= 2; ++step) {
      const TypedBuffer grad = random_grad(DType::kBf16, seed + step);
      const Hyperparams h = hyper_for(algorithm, step);
      step_compressed(h, compressed.spans(grad), {}, {}, kRuns, arena);
      for (const DecayRun& run : kRuns) {
        ParamSpans spans;
        auto floats = [&](std::vector<std::byte>& bytes) {
          return std::span(reinterpret_cast<float*>(bytes.data()) + run.begin, run.numel);
        };
        spans.master = floats(plain.master);
        spans.exp_avg = floats(plain.exp_avg);
        spans.exp_avg_sq = floats(plain.exp_avg_sq);
        spans.grad = ConstTypedSpan(static_cast<const Bf16*>(grad.data()) + run.begin, run.numel,
                                    DType::kBf16);
        spans.param_out =
            TypedSpan(static_cast<Bf16*>(plain.out.data()) + run.begin, run.numel, DType::kBf16);
        Hyperparams run_hyper = h;
        if (!run.weight_decay) run_hyper.weight_decay = 0;
        cpu_adam::step(run_hyper, spans, {}, arena);
      }
    }
    EXPECT_TRUE(compressed == plain) << "algorithm " << static_cast<int>(algorithm);
  }
}

TEST(CompressedStep, SameBytesForEverySimdLevelThreadCountAndChunking) {
  const std::uint64_t seed = testing::test_seed(32);
  // The masters: fp32, bf16 rounded stochastically, bf16 with a Kahan compensation.
  const std::pair<StateDType, bool> masters[] = {
      {StateDType::kFp32, false}, {StateDType::kBf16, false}, {StateDType::kBf16, true}};
  for (Algorithm algorithm : {Algorithm::kAdamW, Algorithm::kAdagrad, Algorithm::kLion}) {
    for (const auto& [master, kahan] : masters) {
      for (StateDType moment : {StateDType::kBf16, StateDType::kInt8}) {
        std::optional<State> reference;
        for (SimdLevel level : available_simd_levels()) {
          for (int threads : {1, 3}) {
            State state(master, moment, seed, true, DType::kBf16, kahan);
            tbb::task_arena arena(threads);
            ExecOptions options;
            options.simd_level = level;
            options.chunk_elems = threads == 1 ? kDefaultChunkElems : kQuantBlockElems;
            for (int step = 1; step <= 2; ++step) {
              const TypedBuffer grad = random_grad(DType::kFp32, seed + step);
              step_compressed(hyper_for(algorithm, step), state.spans(grad), {}, {seed, 4096},
                              kRuns, arena, options);
            }
            if (!reference)
              reference.emplace(std::move(state));
            else
              ASSERT_TRUE(state == *reference)
                  << "algorithm " << static_cast<int>(algorithm) << " master "
                  << state_dtype_name(master) << (kahan ? " (kahan)" : "") << " moments " << state_dtype_name(moment)
                  << " level " << simd_level_name(level) << " threads " << threads << " "
                  << testing::seed_note(seed);
          }
        }
      }
    }
  }
}

// The rounding noise hashes the element's low 32 bits in vector lanes: a sub-group whose elements
// cross 2^32 (lanes that would carry into the high word) and an fp16 copy-out of the rounded
// master must still give the same bytes at every level, and the two sides of 2^32 must differ.
TEST(CompressedStep, Bf16MasterSameBytesAcrossTheHighWordAtEveryLevel) {
  const std::uint64_t seed = testing::test_seed(34);
  const std::uint64_t first_element = (std::uint64_t{1} << 32) - 2 * kQuantBlockElems - 3;
  std::optional<State> reference;
  for (SimdLevel level : available_simd_levels()) {
    State state(StateDType::kBf16, StateDType::kInt8, seed, true, DType::kFp16);
    tbb::task_arena arena(2);
    ExecOptions options;
    options.simd_level = level;
    options.chunk_elems = kQuantBlockElems;
    for (int step = 1; step <= 2; ++step) {
      const TypedBuffer grad = random_grad(DType::kBf16, seed + step);
      step_compressed(hyper_for(Algorithm::kAdamW, step), state.spans(grad), {},
                      {seed, first_element}, {}, arena, options);
    }
    EXPECT_TRUE(state.out.guards_intact());
    if (!reference) {
      reference.emplace(std::move(state));
    } else {
      ASSERT_TRUE(state == *reference)
          << "level " << simd_level_name(level) << " " << testing::seed_note(seed);
    }
  }
  // Shifting the elements by 2^32 changes only their high words: the bits must change.
  State shifted(StateDType::kBf16, StateDType::kInt8, seed, true, DType::kFp16);
  tbb::task_arena arena(2);
  for (int step = 1; step <= 2; ++step) {
    const TypedBuffer grad = random_grad(DType::kBf16, seed + step);
    step_compressed(hyper_for(Algorithm::kAdamW, step), shifted.spans(grad), {},
                    {seed, first_element + (std::uint64_t{1} << 32)}, {}, arena);
  }
  EXPECT_NE(shifted.master, reference->master) << testing::seed_note(seed);
}

// A bf16 master is rounded inside the update, except in a block whose elements cross a multiple
// of 2^32, which takes an fp32 copy and a separate rounding pass. With bf16 moments nothing
// depends on where blocks start, so one call whose block 2 crosses 2^32 must equal two calls split
// at 2^32 (no block crosses).
TEST(CompressedStep, Bf16MasterBlockAcrossTheHighWordMatchesTheInPlacePath) {
  const std::uint64_t seed = testing::test_seed(35);
  const std::uint64_t split = 2 * kQuantBlockElems + 3;
  const std::uint64_t first_element = (std::uint64_t{1} << 32) - split;
  State whole(StateDType::kBf16, StateDType::kBf16, seed);
  State halves(StateDType::kBf16, StateDType::kBf16, seed);
  tbb::task_arena arena(2);
  for (int step = 1; step <= 2; ++step) {
    const TypedBuffer grad = random_grad(DType::kFp32, seed + step);
    const Hyperparams h = hyper_for(Algorithm::kAdamW, step);
    step_compressed(h, whole.spans(grad), {}, {seed, first_element}, {}, arena);
    for (const auto& [begin, end] : {std::pair<std::uint64_t, std::uint64_t>{0, split},
                                     std::pair<std::uint64_t, std::uint64_t>{split, kCount}}) {
      CompressedSpans part = halves.spans(grad);
      part.numel = end - begin;
      part.master += begin * sizeof(Bf16);
      part.exp_avg += begin * sizeof(Bf16);
      part.exp_avg_sq += begin * sizeof(Bf16);
      part.grad = ConstTypedSpan(static_cast<const float*>(grad.data()) + begin, end - begin,
                                 DType::kFp32);
      part.param_out = TypedSpan(static_cast<Bf16*>(halves.out.data()) + begin, end - begin,
                                 DType::kBf16);
      step_compressed(h, part, {}, {seed, first_element + begin}, {}, arena);
    }
  }
  EXPECT_TRUE(whole == halves) << testing::seed_note(seed);
}

// Weight decay alone (zero gradients) moves every element from x0 to the same fp32 target x0 * d,
// which lies between two bf16 values: the mean of the stochastically rounded elements must be
// the target, within a bound from the binomial spread, far tighter than round-to-nearest's bias.
TEST(CompressedStep, Bf16MasterRoundsWithoutBias) {
  constexpr std::size_t kElements = 1 << 18;
  const float x0 = 1.0f + 0x1p-6f;  // a bf16 value
  std::vector<Bf16> master(kElements, to_bf16(x0));
  std::vector<float> grad(kElements, 0.0f);
  std::vector<std::byte> exp_avg(state_bytes(StateDType::kInt8, kElements));
  std::vector<std::byte> exp_avg_sq(exp_avg.size());
  Hyperparams h = hyper_for(Algorithm::kAdamW, 1);
  h.lr = 0.1;
  h.weight_decay = 0.0137;
  CompressedSpans spans;
  spans.numel = kElements;
  spans.master_dtype = StateDType::kBf16;
  spans.moment_dtype = StateDType::kInt8;
  spans.master = reinterpret_cast<std::byte*>(master.data());
  spans.exp_avg = exp_avg.data();
  spans.exp_avg_sq = exp_avg_sq.data();
  spans.grad = std::span<const float>(grad);
  tbb::task_arena arena(2);
  step_compressed(h, spans, {}, {7, 0}, {}, arena);
  const double target = double{x0 * static_cast<float>(1.0 - h.lr * h.weight_decay)};
  const double spacing = 0x1p-7;  // bf16 ulp in [1, 2)
  const double low = std::floor(target / spacing) * spacing;
  const double p = (target - low) / spacing;
  double sum = 0;
  for (Bf16 value : master) {
    const double v = to_float(value);
    ASSERT_TRUE(v == low || v == low + spacing) << v;
    sum += v;
  }
  const double mean = sum / kElements;
  const double bound = 6 * spacing * std::sqrt(p * (1 - p) / kElements);
  EXPECT_LE(std::fabs(mean - target), bound) << "mean " << mean << " target " << target;
  const double nearest_bias =
      std::fabs(double{to_float(to_bf16(static_cast<float>(target)))} - target);
  EXPECT_LT(bound, nearest_bias / 10);  // the test can tell SR from round-to-nearest
}

// Ten Adam steps on a fixed gradient sequence: 8-bit moments and a bf16 master stay close to the
// fp32 trajectory (a bound on the weights' drift relative to how far they moved).
TEST(CompressedStep, Int8MomentsTrackTheFp32Update) {
  const std::uint64_t seed = testing::test_seed(33);
  State exact(StateDType::kFp32, StateDType::kFp32, seed, false);
  State compressed(StateDType::kBf16, StateDType::kInt8, seed, false);
  // Start both from the same weights: the bf16 master's values.
  tbb::task_arena arena(2);
  std::vector<float> start(kCount);
  decode_state(StateDType::kBf16, MomentKind::kExpAvg, compressed.master.data(), kCount,
               start.data(), arena);
  std::memcpy(exact.master.data(), start.data(), kCount * sizeof(float));
  for (State* s : {&exact, &compressed}) {
    std::fill(s->exp_avg.begin(), s->exp_avg.end(), std::byte{0});
    std::fill(s->exp_avg_sq.begin(), s->exp_avg_sq.end(), std::byte{0});
  }
  for (int step = 1; step <= 10; ++step) {
    const TypedBuffer grad = random_grad(DType::kFp32, seed + step, false);
    Hyperparams h = hyper_for(Algorithm::kAdamW, step);
    h.lr = 1e-2;
    step_compressed(h, exact.spans(grad), {}, {seed, 0}, {}, arena);
    step_compressed(h, compressed.spans(grad), {}, {seed, 0}, {}, arena);
  }
  std::vector<float> got(kCount);
  decode_state(StateDType::kBf16, MomentKind::kExpAvg, compressed.master.data(), kCount, got.data(),
               arena);
  const float* want = reinterpret_cast<const float*>(exact.master.data());
  double moved = 0;
  double drift = 0;
  for (std::size_t i = 0; i < kCount; ++i) {
    moved += std::fabs(double{want[i]} - start[i]);
    drift += std::fabs(double{got[i]} - want[i]);
  }
  std::printf("int8+bf16 vs fp32 after 10 steps: mean |drift| %.3g, mean |move| %.3g\n",
              drift / kCount, moved / kCount);
  EXPECT_LT(drift, 0.1 * moved) << testing::seed_note(seed);
}

// The compensated master's split (state_format.hpp): weights to nearest, low parts toward zero,
// |low| <= half the weight's last place, the pair 16 bits of the value, and split(join) the same
// pair, ties included (a checkpoint stores the joined value and loads it back).
TEST(CompressedStep, KahanSplitIsAFixedPointOfItsJoin) {
  const std::uint64_t seed = testing::test_seed(34);
  std::mt19937_64 rng(seed);
  std::vector<float> values(kCount);
  for (float& v : values) v = testing::random_value(rng, -30, 30, true);
  // Ties: halfway between two bf16 values, and a hair either side.
  values[0] = 1.0f + 0x1p-8f;
  values[1] = 1.0f + 3 * 0x1p-8f;
  values[2] = std::nextafter(1.0f + 0x1p-8f, 2.0f);
  values[3] = -std::nextafter(1.0f + 0x1p-8f, 0.0f);
  tbb::task_arena arena(2);
  std::vector<std::byte> weights(kCount * sizeof(Bf16)), low(kCount * sizeof(Bf16));
  split_compensated(values.data(), kCount, weights.data(), low.data(), arena);
  std::vector<float> joined(kCount);
  decode_state(StateDType::kBf16, MomentKind::kExpAvg, weights.data(), kCount, joined.data(),
               arena);
  add_compensation(low.data(), kCount, joined.data(), arena);
  const auto* w = reinterpret_cast<const Bf16*>(weights.data());
  const auto* l = reinterpret_cast<const Bf16*>(low.data());
  for (std::size_t i = 0; i < kCount; ++i) {
    const float x = values[i];
    if (!std::isfinite(x)) continue;
    ASSERT_EQ(to_float(w[i]), to_float(to_bf16(x))) << "element " << i << " value " << x;
    const double weight = to_float(w[i]);
    if (weight == 0 || !std::isfinite(weight)) continue;
    const double half_ulp = std::ldexp(1.0, std::ilogb(weight) - 8);
    EXPECT_LE(std::fabs(double{to_float(l[i])}), half_ulp) << "element " << i;
    // 16 significant bits, down to bf16's subnormal spacing (2^-133).
    EXPECT_LE(std::fabs(double{joined[i]} - x), std::ldexp(std::fabs(double{x}), -15) + 0x1p-133)
        << "element " << i << " value " << x;
  }
  EXPECT_EQ(joined[0], values[0]);  // the tie is kept exactly: 1 + 2^-8 = 1 (even) + 2^-8
  EXPECT_EQ(joined[1], values[1]);
  std::vector<std::byte> weights2(weights.size()), low2(low.size());
  split_compensated(joined.data(), kCount, weights2.data(), low2.data(), arena);
  for (std::size_t i = 0; i < kCount; ++i) {
    if (std::memcmp(&weights2[2 * i], &weights[2 * i], 2) != 0 ||
        std::memcmp(&low2[2 * i], &low[2 * i], 2) != 0) {
      ADD_FAILURE() << "element " << i << " value " << values[i] << " weight " << to_float(w[i])
                    << " low " << to_float(l[i]) << " joined " << joined[i];
    }
  }
}

// One step of a bf16 master rounded to nearest, as `spans` steps its Kahan master: an fp32 master
// (moments m2, v2) from `nearest`, stepped, rounded back into `nearest`.
void step_rounded_to_nearest(const Hyperparams& h, const CompressedSpans& spans,
                             std::vector<Bf16>& nearest, std::vector<float>& nearest_fp32,
                             std::vector<float>& m2, std::vector<float>& v2,
                             tbb::task_arena& arena) {
  for (std::size_t i = 0; i < nearest.size(); ++i) nearest_fp32[i] = to_float(nearest[i]);
  CompressedSpans plain = spans;
  plain.master_dtype = StateDType::kFp32;
  plain.master = reinterpret_cast<std::byte*>(nearest_fp32.data());
  plain.compensation = nullptr;
  plain.exp_avg = reinterpret_cast<std::byte*>(m2.data());
  plain.exp_avg_sq = reinterpret_cast<std::byte*>(v2.data());
  step_compressed(h, plain, {}, {}, {}, arena);
  for (std::size_t i = 0; i < nearest.size(); ++i) nearest[i] = to_bf16(nearest_fp32[i]);
}

// Step `step` of the float64 reference: AdamW's recurrence on ref, m and v.
void reference_adamw_step(const Hyperparams& h, int step, const std::vector<float>& grad,
                          std::vector<double>& ref, std::vector<double>& m,
                          std::vector<double>& v) {
  const double bc1 = 1 - std::pow(h.beta1, step);
  const double bc2 = 1 - std::pow(h.beta2, step);
  for (std::size_t i = 0; i < grad.size(); ++i) {
    const double g = grad[i];
    m[i] = h.beta1 * m[i] + (1 - h.beta1) * g;
    v[i] = h.beta2 * v[i] + (1 - h.beta2) * g * g;
    ref[i] *= 1 - h.lr * h.weight_decay;
    ref[i] -= h.lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + h.eps);
  }
}

// 400 AdamW steps whose per-step change (1e-4) is a seventieth of the weights' bf16 spacing
// (2^-7 in [1, 2)): a bf16 master rounded to nearest never moves, a Kahan-compensated one follows
// a float64 reference of the same recurrence, and its weights stay within a bf16 spacing of it.
TEST(CompressedStep, KahanMasterTracksAFloat64Reference) {
  constexpr std::size_t kElements = 3 * kQuantBlockElems + 17;
  constexpr int kSteps = 400;
  const std::uint64_t seed = testing::test_seed(35);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> start_dist(1.0f, 1.9f);
  std::uniform_real_distribution<float> grad_dist(-1e-2f, 1e-2f);
  std::vector<float> start(kElements), grad(kElements);
  for (std::size_t i = 0; i < kElements; ++i) {
    start[i] = to_float(to_bf16(start_dist(rng)));
    grad[i] = grad_dist(rng);
  }
  Hyperparams h = hyper_for(Algorithm::kAdamW, 1);
  h.lr = 1e-4;
  h.weight_decay = 0.01;
  h.eps = 1e-8;
  // Kahan, and bf16 rounded to nearest (an fp32 master rounded after every step).
  std::vector<Bf16> weights(kElements), nearest(kElements);
  std::vector<Bf16> low(kElements, Bf16{0});
  std::vector<float> nearest_fp32(kElements);
  for (std::size_t i = 0; i < kElements; ++i) weights[i] = nearest[i] = to_bf16(start[i]);
  std::vector<float> m1(kElements, 0.0f), v1(kElements, 0.0f), m2 = m1, v2 = v1;
  std::vector<double> ref(start.begin(), start.end()), m(kElements, 0.0), v(kElements, 0.0);
  tbb::task_arena arena(2);
  for (int step = 1; step <= kSteps; ++step) {
    h.step = step;
    CompressedSpans spans;
    spans.numel = kElements;
    spans.master_dtype = StateDType::kBf16;
    spans.moment_dtype = StateDType::kFp32;
    spans.master = reinterpret_cast<std::byte*>(weights.data());
    spans.compensation = reinterpret_cast<std::byte*>(low.data());
    spans.exp_avg = reinterpret_cast<std::byte*>(m1.data());
    spans.exp_avg_sq = reinterpret_cast<std::byte*>(v1.data());
    spans.grad = std::span<const float>(grad);
    step_compressed(h, spans, {}, {}, {}, arena);
    step_rounded_to_nearest(h, spans, nearest, nearest_fp32, m2, v2, arena);
    reference_adamw_step(h, step, grad, ref, m, v);
  }
  double moved = 0, kahan_error = 0, nearest_error = 0, worst_weight = 0;
  for (std::size_t i = 0; i < kElements; ++i) {
    const double value = double{to_float(weights[i])} + double{to_float(low[i])};
    moved += std::fabs(ref[i] - start[i]);
    kahan_error += std::fabs(value - ref[i]);
    nearest_error += std::fabs(double{to_float(nearest[i])} - ref[i]);
    worst_weight = std::max(worst_weight, std::fabs(double{to_float(weights[i])} - ref[i]));
  }
  std::printf("after %d steps: mean |move| %.3g, mean |error| kahan %.3g, bf16 to nearest %.3g, "
              "worst kahan weight error %.3g (bf16 spacing 0.0078)\n",
              kSteps, moved / kElements, kahan_error / kElements, nearest_error / kElements,
              worst_weight);
  // Each step's change is ~6 units in the low part's last place (2^-16 of the weight).
  EXPECT_LT(kahan_error, 0.03 * moved) << testing::seed_note(seed);
  EXPECT_GT(nearest_error, 0.5 * moved);  // the test can tell compensation from none
  EXPECT_LE(worst_weight, 0x1p-7);
}

TEST(CompressedStep, RejectsACompensationWithoutABf16Master) {
  std::vector<float> master(4), grad(4), moments(8);
  std::vector<Bf16> low(4);
  CompressedSpans spans;
  spans.numel = 4;
  spans.master_dtype = StateDType::kFp32;
  spans.master = reinterpret_cast<std::byte*>(master.data());
  spans.compensation = reinterpret_cast<std::byte*>(low.data());
  spans.exp_avg = reinterpret_cast<std::byte*>(moments.data());
  spans.exp_avg_sq = reinterpret_cast<std::byte*>(moments.data() + 4);
  spans.grad = std::span<const float>(grad);
  tbb::task_arena arena(1);
  EXPECT_THROW(step_compressed(hyper_for(Algorithm::kAdamW, 1), spans, {}, {}, {}, arena),
               std::invalid_argument);
}

TEST(CompressedStep, RejectsAnInt8Master) {
  std::vector<std::byte> bytes(kQuantBlockBytes);
  std::vector<float> grad(4);
  CompressedSpans spans;
  spans.numel = 4;
  spans.master_dtype = StateDType::kInt8;
  spans.master = bytes.data();
  spans.exp_avg = bytes.data();
  spans.exp_avg_sq = bytes.data();
  spans.grad = std::span<const float>(grad);
  tbb::task_arena arena(1);
  EXPECT_THROW(step_compressed(hyper_for(Algorithm::kAdamW, 1), spans, {}, {}, {}, arena),
               std::invalid_argument);
}

}  // namespace
}  // namespace strata::cpu_adam
