#include "runtime/cli/step_runner.hpp"

#include <algorithm>
#include <chrono>
#include <span>

#include <fmt/format.h>
#include <tbb/task_arena.h>

#include "base/float16.hpp"
#include "cpu_adam/compressed_step.hpp"
#include "cpu_adam/optimizer.hpp"
#include "cpu_adam/state_format.hpp"
#include "runtime/buffer_plan.hpp"
#include "runtime/tune/measure.hpp"

namespace strata::cli {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// One Engine over `params` parameters in units of `unit_params`; steps alternate between the I/O
// pipeline alone and the real step, so both see the same files and the same machine noise.
Timings run_steps(const runtime::Config& config, tiers::Device& device,
                  runtime::comm::Communicator& comm, std::uint64_t params,
                  std::uint64_t unit_params, std::uint32_t steps,
                  const runtime::EngineOptions& engine_options) {
  runtime::Engine engine(config, device, comm, engine_options);
  std::vector<runtime::UnitId> units;
  for (std::uint64_t begin = 0, index = 0; begin < params; begin += unit_params, ++index) {
    const std::uint64_t count = std::min(unit_params, params - begin);
    units.push_back(engine.add_unit(
        {fmt::format("unit{}", index), {{"w", {count}, runtime::TensorInit::zeros()}}}));
  }
  // Gradients as a model would hand them over: in the device's memory (taken from the budget
  // before finalize, which gives the gathered units what is left).
  tiers::DeviceBuffer grads = device.allocate(std::min(unit_params, params) * sizeof(float));
  {
    tiers::Stream stream = device.create_stream();
    stream.fill(grads.span(), 1e-3f);
    stream.synchronize();
  }
  engine.finalize();
  Timings timings;
  using Compute = runtime::EngineOptions::OptimizerCompute;
  for (std::uint32_t step = 0; step < 2 * steps; ++step) {
    const bool real = step % 2 == 1;
    engine.set_optimizer_compute(real ? Compute::kRun : Compute::kSkip);
    for (runtime::UnitId unit : units) {
      engine.reduce_grads(
          unit, std::span<const float>(grads.span().as<float>(), engine.unit_numel(unit)));
    }
    const runtime::StepStats stats = engine.step();
    (real ? timings.step_s : timings.io_s).push_back(stats.step_s);
    if (real) {
      timings.step_nvme_bytes = stats.nvme_in_step.read_bytes + stats.nvme_in_step.written_bytes;
    }
  }
  return timings;
}

namespace {

// One sub-group of optimizer state in [optimizer] master_dtype / state_dtype (zero bytes decode
// to zero in every format), bf16 gradients, and parameters written out only when the Engine
// writes them (not when they are a bf16 master's own bytes).
class SyntheticCompressedState {
 public:
  SyntheticCompressedState(const runtime::Config& config, std::uint64_t count)
      : master_dtype_(config.optimizer.master_dtype),
        moment_dtype_(config.optimizer.state_dtype),
        master_(cpu_adam::state_bytes(master_dtype_, count)),
        exp_avg_(cpu_adam::state_bytes(moment_dtype_, count)),
        exp_avg_sq_(cpu_adam::state_bytes(moment_dtype_, count)),
        grad_(count, to_bf16(1e-3f)) {
    if (config.optimizer.master_rounding == runtime::MasterRounding::kKahan &&
        master_dtype_ == cpu_adam::StateDType::kBf16) {
      compensation_.resize(count * sizeof(Bf16));
    }
    // The buffer plan's rule for parameters that are the master's own bytes.
    const runtime::KindPlacement params =
        runtime::place_kinds(config, 1)[static_cast<std::size_t>(runtime::ShardKind::kParam)];
    if (!params.in_master && config.precision.params != DType::kFp32) {
      param_dtype_ = config.precision.params;
      param_out_.resize(count * dtype_bytes(param_dtype_));
    }
  }
  // The first `count` elements (a whole sub-group of at most the constructor's count).
  cpu_adam::CompressedSpans spans(std::uint64_t count) {
    cpu_adam::CompressedSpans spans;
    spans.numel = count;
    spans.master_dtype = master_dtype_;
    spans.moment_dtype = moment_dtype_;
    spans.master = master_.data();
    if (!compensation_.empty()) spans.compensation = compensation_.data();
    spans.exp_avg = exp_avg_.data();
    spans.exp_avg_sq = exp_avg_sq_.data();
    spans.grad = cpu_adam::ConstTypedSpan(grad_.data(), count, DType::kBf16);
    if (param_dtype_ != DType::kFp32) {
      spans.param_out = cpu_adam::TypedSpan(param_out_.data(), count, param_dtype_);
    }
    return spans;
  }

 private:
  cpu_adam::StateDType master_dtype_;
  cpu_adam::StateDType moment_dtype_;
  std::vector<std::byte> master_, compensation_, exp_avg_, exp_avg_sq_;  // compensation: Kahan
  std::vector<Bf16> grad_;
  DType param_dtype_ = DType::kFp32;  // kFp32: no parameters written out
  std::vector<std::byte> param_out_;
};

// time_adam for compressed state: the fused update the Engine runs (cpu_adam::step_compressed).
double time_compressed_adam(const runtime::Config& config, std::uint64_t params,
                            std::uint32_t steps, tbb::task_arena& arena) {
  const std::uint64_t group = std::min<std::uint64_t>(config.zero.sub_group_size, params);
  SyntheticCompressedState state(config, group);
  cpu_adam::Hyperparams hyper;
  hyper.step = 1;
  const cpu_adam::StochasticRounding rounding{config.run.seed, 0};
  cpu_adam::step_compressed(hyper, state.spans(group), {}, rounding, {}, arena);  // warm the pages
  const auto start = std::chrono::steady_clock::now();
  for (std::uint32_t step = 0; step < steps; ++step) {
    for (std::uint64_t done = 0; done < params; done += group) {
      const std::uint64_t count = std::min(group, params - done);
      cpu_adam::step_compressed(hyper, state.spans(count), {}, rounding, {}, arena);
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

// Adam over sub-group-sized state in memory, as many elements as the step updates, in the state's
// formats.
double time_adam(const runtime::Config& config, std::uint64_t params, std::uint32_t steps) {
  const int threads = config.optimizer.threads == 0 ? tbb::task_arena::automatic
                                                    : static_cast<int>(config.optimizer.threads);
  tbb::task_arena arena(threads);
  if (config.optimizer.state_dtype != cpu_adam::StateDType::kFp32 ||
      config.optimizer.master_dtype != cpu_adam::StateDType::kFp32) {
    return time_compressed_adam(config, params, steps, arena);
  }
  const std::uint64_t group = std::min<std::uint64_t>(config.zero.sub_group_size, params);
  const runtime::tune::SyntheticAdamState state(group);
  const cpu_adam::ParamSpans spans = state.spans(group);
  cpu_adam::Hyperparams hyper;
  cpu_adam::step(hyper, spans, {}, arena);  // warm the pages
  const auto start = std::chrono::steady_clock::now();
  for (std::uint32_t step = 0; step < steps; ++step) {
    for (std::uint64_t done = 0; done < params; done += group) {
      const std::uint64_t count = std::min(group, params - done);
      cpu_adam::step(hyper, state.spans(count), {}, arena);
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace strata::cli
