// Proves Stream::optimizer_update: on every backend a sub-group's update in device memory is
// cpu_adam's byte for byte, for every algorithm, state format, gradient dtype and param_out dtype,
// at sizes that are multiples of no vector or block width, aligned and misaligned, across a 2^32
// element boundary, over several steps with weight-decay runs (CudaOptimizer/* on a GPU); and that
// HostDevice's run of the op is cpu_adam::step()'s for fp32 state.
#include <gtest/gtest.h>

#include <oneapi/tbb/task_arena.h>

#include <cstring>
#include <optional>
#include <span>
#include <tuple>
#include <vector>

#include "cpu_adam/optimizer.hpp"
#include "tests/tiers/device/optimizer_case.hpp"
#include "tests/tiers/device_backends.hpp"
#include "tiers/device/device.hpp"

namespace strata::tiers {
namespace {

using cpu_adam::Algorithm;
using testing::expect_device_matches_cpu;
using testing::OptimizerCase;
using testing::Shape;

constexpr std::uint64_t kBlock = cpu_adam::kQuantBlockElems;
constexpr std::uint64_t k2To32 = std::uint64_t{1} << 32;
constexpr int kSteps = 3;

using MatrixParam = std::tuple<DeviceKind, Algorithm, int, DType, std::optional<DType>>;

OptimizerCase case_of(const MatrixParam& param) {
  return OptimizerCase{std::get<1>(param), testing::kStateFormats[std::get<2>(param)],
                       std::get<3>(param), std::get<4>(param)};
}

std::string matrix_name(const ::testing::TestParamInfo<MatrixParam>& info) {
  return testing::case_name(case_of(info.param));
}

class OptimizerMatrixBase : public ::testing::TestWithParam<MatrixParam> {
 protected:
  void SetUp() override {
    if (std::get<0>(GetParam()) == DeviceKind::kCuda) {
      const std::string reason = cuda_unavailable_reason();
      if (!reason.empty()) GTEST_SKIP() << "no usable CUDA device: " << reason;
    }
    DeviceOptions options;
    options.kind = std::get<0>(GetParam());
    options.budget_bytes = 1ull << 30;
    options.poison = PoisonOnRelease::kOff;
    device_ = make_device(options);
  }
  void run(std::initializer_list<Shape> shapes) {
    for (const Shape& shape : shapes) {
      expect_device_matches_cpu(*device_, case_of(GetParam()), shape, testing::test_seed(), kSteps,
                                arena_);
      if (HasFailure()) return;
    }
  }

  std::unique_ptr<Device> device_;
  tbb::task_arena arena_;
};

class OptimizerMatrix : public OptimizerMatrixBase {};
class OptimizerMatrixLarge : public OptimizerMatrixBase {};

TEST_P(OptimizerMatrix, SmallSizesMatchCpuAdam) {
  run({{1, false, 0},
       {1023, false, 5},
       {1023, true, 77},
       // Block 1 holds elements 2^32 - 480 .. 2^32 + 539: its rounding noise crosses the high word.
       {2 * kBlock + 5, false, k2To32 - 1500}});
}

TEST_P(OptimizerMatrixLarge, LargeSizesMatchCpuAdam) {
  run({{1024 * kBlock + 7, false, k2To32 - 300 * kBlock - 13},
       {1024 * kBlock + 7, true, 123},
       {3'000'017, false, 9}});
}

const auto kAlgorithms =
    ::testing::Values(Algorithm::kAdamW, Algorithm::kAdam, Algorithm::kAdagrad, Algorithm::kLion);
const auto kFormats = ::testing::Range(0, static_cast<int>(std::size(testing::kStateFormats)));
const auto kGrads = ::testing::Values(DType::kFp32, DType::kBf16, DType::kFp16);
const auto kOuts = ::testing::Values(std::optional<DType>(), std::optional(DType::kBf16),
                                     std::optional(DType::kFp16));

// HostDevice runs cpu_adam itself: its matrix checks the op's plumbing (addresses, formats, runs,
// stream order) at small sizes; the GPU's is the whole matrix at every size.
INSTANTIATE_TEST_SUITE_P(HostDeviceOptimizer, OptimizerMatrix,
                         ::testing::Combine(::testing::Values(DeviceKind::kHost), kAlgorithms,
                                            kFormats, kGrads, kOuts),
                         matrix_name);
#if defined(STRATA_HAVE_CUDA)
INSTANTIATE_TEST_SUITE_P(CudaOptimizer, OptimizerMatrix,
                         ::testing::Combine(::testing::Values(DeviceKind::kCuda), kAlgorithms,
                                            kFormats, kGrads, kOuts),
                         matrix_name);
INSTANTIATE_TEST_SUITE_P(CudaOptimizer, OptimizerMatrixLarge,
                         ::testing::Combine(::testing::Values(DeviceKind::kCuda), kAlgorithms,
                                            kFormats, kGrads, kOuts),
                         matrix_name);
#endif
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(OptimizerMatrixLarge);

// The sub-group of Fp32StateIsCpuAdamStepBitForBit.
constexpr std::uint64_t kFp32Numel = 3 * kBlock + 11;

// The HostDevice buffers of one fp32-state case: the state (master | exp_avg | exp_avg_sq),
// param_out, one step's gradients and the weight-decay runs.
struct Fp32Buffers {
  DeviceBuffer state, out, grad, runs;
};

// The op of one step over `b`: fp32 state, every run of `run_count`.
OptimizerOp fp32_state_op(const cpu_adam::Hyperparams& hyper, const cpu_adam::GradScaling& scaling,
                          const OptimizerCase& c, const Fp32Buffers& b, std::size_t run_count) {
  const DType grad_dtype = c.grad_dtype;
  const std::optional<DType> out = c.out_dtype;
  OptimizerOp op;
  op.plan = cpu_adam::plan_step(hyper, scaling, {});
  op.numel = kFp32Numel;
  op.master = b.state.data();
  op.exp_avg = b.state.data() + kFp32Numel * sizeof(float);
  op.exp_avg_sq = b.state.data() + 2 * kFp32Numel * sizeof(float);
  op.grad = b.grad.data();
  op.grad_dtype = grad_dtype;
  op.param_out = out ? b.out.data() : nullptr;
  op.param_out_dtype = out.value_or(DType::kBf16);
  op.decay_runs = reinterpret_cast<const cpu_adam::DecayRun*>(b.runs.data());
  op.decay_run_count = run_count;
  return op;
}

// cpu_adam::step() called as the Engine calls it for fp32 state: once per weight-decay run,
// weight decay 0 on the runs that opt out; on `reference` (laid out as the device state) and
// `out_reference`.
void reference_step(const cpu_adam::Hyperparams& hyper, const cpu_adam::GradScaling& scaling,
                    const OptimizerCase& c, const std::vector<cpu_adam::DecayRun>& runs,
                    const std::vector<std::byte>& grad, std::vector<float>& reference,
                    std::vector<std::uint16_t>& out_reference, tbb::task_arena& arena) {
  const DType grad_dtype = c.grad_dtype;
  const std::optional<DType> out = c.out_dtype;
  for (const cpu_adam::DecayRun& run : runs) {
    cpu_adam::ParamSpans spans;
    spans.master = std::span(reference).subspan(run.begin, run.numel);
    spans.exp_avg = std::span(reference).subspan(kFp32Numel + run.begin, run.numel);
    spans.exp_avg_sq = std::span(reference).subspan(2 * kFp32Numel + run.begin, run.numel);
    spans.grad = cpu_adam::ConstTypedSpan(grad.data() + run.begin * dtype_bytes(grad_dtype),
                                          run.numel, grad_dtype);
    if (out) {
      spans.param_out = cpu_adam::TypedSpan(out_reference.data() + run.begin, run.numel, *out);
    }
    cpu_adam::Hyperparams run_hyper = hyper;
    if (!run.weight_decay) run_hyper.weight_decay = 0;
    cpu_adam::step(run_hyper, spans, scaling, arena);
  }
}

// kSteps steps of case `c` through the op and through reference_step(), compared bit for bit
// after each.
void expect_fp32_steps_match(Device& device, Stream& stream, tbb::task_arena& arena,
                             const OptimizerCase& c, const std::vector<cpu_adam::DecayRun>& runs,
                             std::uint64_t seed) {
  const DType grad_dtype = c.grad_dtype;
  const std::optional<DType> out = c.out_dtype;
  std::vector<float> state(3 * kFp32Numel);
  for (std::uint64_t i = 0; i < state.size(); ++i) {
    state[i] = 0.25f + 1e-3f * static_cast<float>(i % 997);  // master, exp_avg, exp_avg_sq
  }
  std::vector<float> reference = state;
  const Fp32Buffers b{device.allocate(state.size() * sizeof(float)),
                      device.allocate(kFp32Numel * 2),
                      device.allocate(kFp32Numel * dtype_bytes(grad_dtype)),
                      device.allocate(runs.size() * sizeof(cpu_adam::DecayRun))};
  stream.copy_to_device(b.state.span(), state.data());
  stream.copy_to_device(b.runs.span(), runs.data());
  std::vector<std::uint16_t> out_reference(kFp32Numel);
  for (int step = 1; step <= kSteps; ++step) {
    const std::vector<std::byte> grad = testing::random_grads(grad_dtype, kFp32Numel, seed + step);
    stream.copy_to_device(b.grad.span(), grad.data());
    const cpu_adam::Hyperparams hyper = testing::step_hyperparams(c.algorithm, step);
    const cpu_adam::GradScaling scaling = testing::step_scaling(grad_dtype, step);
    stream.optimizer_update(fp32_state_op(hyper, scaling, c, b, runs.size()));
    reference_step(hyper, scaling, c, runs, grad, reference, out_reference, arena);

    std::vector<float> updated(state.size());
    std::vector<std::uint16_t> updated_out(kFp32Numel);
    stream.copy_to_host(updated.data(), b.state.span());
    stream.copy_to_host(updated_out.data(), b.out.span());
    stream.synchronize();
    ASSERT_EQ(std::memcmp(updated.data(), reference.data(), updated.size() * 4), 0)
        << "step " << step;
    if (out) {
      ASSERT_EQ(std::memcmp(updated_out.data(), out_reference.data(), kFp32Numel * 2), 0)
          << "param_out, step " << step;
    }
  }
}

// fp32 state through the op on HostDevice against cpu_adam::step() called as the Engine calls it
// for fp32 state: once per weight-decay run, weight decay 0 on the runs that opt out.
TEST(HostDeviceOptimizer, Fp32StateIsCpuAdamStepBitForBit) {
  const std::uint64_t seed = testing::test_seed();
  DeviceOptions options;
  options.kind = DeviceKind::kHost;
  options.poison = PoisonOnRelease::kOff;
  auto device = make_device(options);
  Stream stream = device->create_stream();
  tbb::task_arena arena;
  const std::vector<cpu_adam::DecayRun> runs = testing::decay_runs_for(kFp32Numel);
  for (Algorithm algorithm :
       {Algorithm::kAdamW, Algorithm::kAdam, Algorithm::kAdagrad, Algorithm::kLion}) {
    for (DType grad_dtype : {DType::kFp32, DType::kBf16, DType::kFp16}) {
      for (std::optional<DType> out :
           {std::optional<DType>(), std::optional(DType::kBf16), std::optional(DType::kFp16)}) {
        const OptimizerCase c{algorithm, testing::kStateFormats[0], grad_dtype, out};
        SCOPED_TRACE(testing::case_name(c) + ", seed " + std::to_string(seed));
        ASSERT_NO_FATAL_FAILURE(expect_fp32_steps_match(*device, stream, arena, c, runs, seed));
      }
    }
  }
}

}  // namespace
}  // namespace strata::tiers
