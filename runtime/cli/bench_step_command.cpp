// `strata bench step CONFIG --params N`: optimizer steps over N parameters with the state placed as
// the config says (typically on NVMe). In one run it times the I/O pipeline alone (t_io: the same
// reads and writes with no arithmetic), Adam alone over sub-groups held in memory (t_adam), and the
// real step (t_step), and prints the overlap efficiency max(t_io, t_adam) / t_step, the effective
// NVMe bandwidth and the peak RSS.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <tbb/task_arena.h>
#include <nlohmann/json.hpp>

#include "cpu_adam/optimizer.hpp"
#include "runtime/byte_size.hpp"
#include "runtime/cli/commands.hpp"
#include "runtime/comm/local_comm.hpp"
#include "runtime/config.hpp"
#include "runtime/engine.hpp"
#include "tiers/device/device.hpp"

namespace strata::cli {
namespace {

struct StepBenchOptions {
  std::string config_path;
  std::string params = "1e8";
  std::string unit_params = "16e6";
  std::uint32_t steps = 2;
  bool json = false;
};

std::uint64_t parse_count(const std::string& text, const char* option) {
  double value = 0;
  std::size_t used = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || !(value >= 1) || value > 1e13 || value != std::floor(value)) {
    throw CLI::ValidationError(option, fmt::format("\"{}\" is not a whole count (e.g. 1e9)", text));
  }
  return static_cast<std::uint64_t>(value);
}

std::uint64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
}

struct Timing {
  double seconds = 0;
  std::uint64_t nvme_bytes = 0;
};

// Builds an Engine over `params` parameters in units of `unit_params`, and times `steps` steps.
Timing run_steps(const runtime::Config& config, std::uint64_t params, std::uint64_t unit_params,
                 std::uint32_t steps, runtime::EngineOptions::OptimizerCompute compute) {
  tiers::DeviceOptions device_options;
  device_options.kind = tiers::DeviceKind::kHost;
  device_options.budget_bytes = config.tiers.device.budget_bytes;
  auto device = tiers::make_device(device_options);
  runtime::comm::LocalComm comm;
  runtime::EngineOptions options;
  options.optimizer_compute = compute;
  runtime::Engine engine(config, *device, comm, options);
  std::vector<runtime::UnitId> units;
  for (std::uint64_t begin = 0, index = 0; begin < params; begin += unit_params, ++index) {
    const std::uint64_t count = std::min(unit_params, params - begin);
    units.push_back(engine.add_unit(
        {fmt::format("unit{}", index), {{"w", {count}, runtime::TensorInit::zeros()}}}));
  }
  engine.finalize();
  std::vector<float> grads;
  Timing timing;
  for (std::uint32_t step = 0; step < steps; ++step) {
    for (runtime::UnitId unit : units) {
      grads.assign(engine.unit_numel(unit), 1e-3f);
      engine.reduce_grads(unit, grads);
    }
    const runtime::StepStats stats = engine.step();
    timing.seconds += stats.step_s;
    timing.nvme_bytes += stats.nvme.read_bytes + stats.nvme.written_bytes;
  }
  return timing;
}

// Adam over sub-group-sized state in memory, as many elements as the step updates.
double time_adam(const runtime::Config& config, std::uint64_t params, std::uint32_t steps) {
  const std::uint64_t group = std::min<std::uint64_t>(config.zero.sub_group_size, params);
  std::vector<float> master(group, 0.1f), exp_avg(group), exp_avg_sq(group);
  std::vector<cpu_adam::Bf16> grad(group, cpu_adam::to_bf16(1e-3f)), param_out(group);
  cpu_adam::ParamSpans spans;
  spans.master = master;
  spans.exp_avg = exp_avg;
  spans.exp_avg_sq = exp_avg_sq;
  spans.grad = std::span<const cpu_adam::Bf16>(grad);
  spans.param_out = std::span<cpu_adam::Bf16>(param_out);
  cpu_adam::Hyperparams hyper;
  const int threads = config.optimizer.threads == 0 ? tbb::task_arena::automatic
                                                    : static_cast<int>(config.optimizer.threads);
  tbb::task_arena arena(threads);
  cpu_adam::step(hyper, spans, {}, arena);  // warm the pages
  const auto start = std::chrono::steady_clock::now();
  for (std::uint32_t step = 0; step < steps; ++step) {
    for (std::uint64_t done = 0; done < params; done += group) {
      const std::uint64_t count = std::min(group, params - done);
      cpu_adam::ParamSpans part = spans;
      part.master = spans.master.first(count);
      part.exp_avg = spans.exp_avg.first(count);
      part.exp_avg_sq = spans.exp_avg_sq.first(count);
      part.grad = cpu_adam::ConstTypedSpan(grad.data(), count, cpu_adam::Dtype::kBf16);
      part.param_out = cpu_adam::TypedSpan(param_out.data(), count, cpu_adam::Dtype::kBf16);
      cpu_adam::step(hyper, part, {}, arena);
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int run(const StepBenchOptions& options) {
  runtime::Config config;
  try {
    config = runtime::load_config(options.config_path);
  } catch (const runtime::ConfigError& error) {
    std::cerr << "strata bench step: bad config: " << error.what() << "\n";
    return kExitBadInput;
  }
  config.tiers.device.kind = runtime::DeviceKind::kHost;
  const std::uint64_t params = parse_count(options.params, "--params");
  const std::uint64_t unit_params = parse_count(options.unit_params, "--unit-params");
  for (const std::string& path : config.tiers.nvme.paths) std::filesystem::create_directories(path);

  using Compute = runtime::EngineOptions::OptimizerCompute;
  const Timing io = run_steps(config, params, unit_params, options.steps, Compute::kSkip);
  const double t_adam = time_adam(config, params, options.steps);
  const Timing step = run_steps(config, params, unit_params, options.steps, Compute::kRun);
  const double per_step = static_cast<double>(options.steps);
  const double t_io = io.seconds / per_step;
  const double t_step = step.seconds / per_step;
  const double adam_per_step = t_adam / per_step;
  const double overlap = std::max(t_io, adam_per_step) / t_step;
  const double bytes_per_step = static_cast<double>(step.nvme_bytes) / per_step;
  const double nvme_gb_per_s = bytes_per_step / t_step / 1e9;
  const std::uint64_t rss = peak_rss_bytes();

  if (options.json) {
    nlohmann::json out = {{"params", params},
                          {"steps", options.steps},
                          {"t_io_s", t_io},
                          {"t_adam_s", adam_per_step},
                          {"t_step_s", t_step},
                          {"overlap_efficiency", overlap},
                          {"nvme_bytes_per_step", bytes_per_step},
                          {"nvme_gb_per_s", nvme_gb_per_s},
                          {"peak_rss_bytes", rss},
                          {"host_budget_bytes", config.tiers.host.budget_bytes}};
    std::cout << out.dump() << "\n";
    return 0;
  }
  std::cout << fmt::format(
      "strata bench step: {} parameters, {} step(s), params {} / grads {} / optimizer {}\n"
      "  t_io   {:8.3f} s  (pipeline, no arithmetic)\n"
      "  t_adam {:8.3f} s  (Adam over the same elements in memory)\n"
      "  t_step {:8.3f} s  (the real step)\n"
      "  overlap efficiency max(t_io, t_adam) / t_step = {:.2f}\n"
      "  NVMe: {} per step, {:.2f} GB/s effective\n"
      "  peak RSS {} (host budget {})\n",
      params, options.steps, runtime::to_string(config.zero.params),
      runtime::to_string(config.zero.grads), runtime::to_string(config.zero.optimizer), t_io,
      adam_per_step, t_step, overlap, runtime::format_decimal_bytes(bytes_per_step), nvme_gb_per_s,
      runtime::format_binary_bytes(rss),
      runtime::format_binary_bytes(config.tiers.host.budget_bytes));
  return 0;
}

}  // namespace

void add_bench_step_command(CLI::App& bench) {
  auto options = std::make_shared<StepBenchOptions>();
  CLI::App* command = bench.add_subcommand(
      "step", "time optimizer steps with the state where CONFIG puts it (I/O vs Adam overlap)");
  command->add_option("config", options->config_path, "TOML config file")->required();
  command->add_option("--params", options->params, "parameters (default 1e8)");
  command->add_option("--unit-params", options->unit_params, "parameters per unit (default 16e6)");
  command->add_option("--steps", options->steps, "timed steps per measurement (default 2)")
      ->check(CLI::Range(1u, 1000u));
  command->add_flag("--json", options->json, "print one JSON object");
  command->callback([options] {
    const int code = run(*options);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace strata::cli
