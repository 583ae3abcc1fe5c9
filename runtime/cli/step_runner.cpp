#include "runtime/cli/step_runner.hpp"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <span>
#include <string>

#include <fmt/format.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include "cpu_adam/compressed_step.hpp"
#include "cpu_adam/optimizer.hpp"
#include "runtime/tune/cost_model.hpp"
#include "runtime/tune/measure.hpp"

namespace strata::cli {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::vector<std::uint64_t> unit_sizes(std::uint64_t params, std::uint64_t unit_params) {
  std::vector<std::uint64_t> units;
  for (std::uint64_t done = 0; done < params; done += unit_params) {
    units.push_back(std::min(unit_params, params - done));
  }
  return units;
}

runtime::Config in_scratch_stores(runtime::Config config, std::string_view name) {
  for (std::string& path : config.tiers.nvme.paths) {
    path = (std::filesystem::path(path) / name).string();
    std::filesystem::create_directories(path);
  }
  config.tiers.device.kind = runtime::DeviceKind::kHost;
  return config;
}

void remove_scratch_stores(const runtime::Config& scratch) {
  for (const std::string& path : scratch.tiers.nvme.paths) std::filesystem::remove_all(path);
}

Timings run_steps_on_host(const runtime::Config& config, runtime::comm::Communicator& comm,
                          std::uint64_t params, std::uint64_t unit_params, std::uint32_t steps) {
  ::sync();
  tiers::DeviceOptions device_options;
  device_options.kind = tiers::DeviceKind::kHost;
  device_options.budget_bytes = config.tiers.device.budget_bytes;
  std::unique_ptr<tiers::Device> device = tiers::make_device(device_options);
  return run_steps(config, *device, comm, params, unit_params, steps,
                   runtime::EngineOptions{.overwrite = true});
}

// One Engine over `params` parameters in units of `unit_params`; steps alternate between the I/O
// pipeline alone and the real step, so both see the same files and the same machine noise.
Timings run_steps(const runtime::Config& config, tiers::Device& device,
                  runtime::comm::Communicator& comm, std::uint64_t params,
                  std::uint64_t unit_params, std::uint32_t steps,
                  const runtime::EngineOptions& engine_options) {
  // The step timed runs every update itself: [zero] overlap_optimizer would run them during the
  // reduce_grads loop when the norm stays under the clip (with --params 1e6 and these gradients it
  // does), and defer_update under the next forward, which this loop has none of, so either would
  // leave them outside the time measured. The parameters are bitwise the same either way.
  runtime::Config timed = config;
  timed.zero.overlap_optimizer = false;
  timed.zero.defer_update = false;
  runtime::Engine engine(timed, device, comm, engine_options);
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

// time_adam for compressed state: the fused update the Engine runs (cpu_adam::step_compressed).
double time_compressed_adam(const runtime::Config& config, std::uint64_t params,
                            std::uint32_t steps, tbb::task_arena& arena) {
  const std::uint64_t group = std::min<std::uint64_t>(config.zero.sub_group_size, params);
  runtime::tune::SyntheticCompressedAdamState state(runtime::tune::adam_update(config),
                                                   runtime::tune::compressed_param_out(config),
                                                   group);
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
  if (runtime::tune::adam_update(config).compressed()) {
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
