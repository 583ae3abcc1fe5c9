// `strata bench step CONFIG --params N`: optimizer steps over N parameters with the state placed as
// the config says (typically on NVMe). In one run it times the I/O pipeline alone (t_io: the same
// reads and writes with no arithmetic), Adam alone over sub-groups held in memory (t_adam), and the
// real step (t_step), and prints the overlap efficiency max(t_io, t_adam) / t_step, the effective
// NVMe bandwidth and the peak RSS. `--device cuda` (or auto on a GPU machine) runs the Engine on a
// CudaDevice: state homed on "device" lives in GPU memory, gradients are handed over in GPU memory,
// and the optimizer works on host/NVMe state through pinned staging (docs/design.md). Under mpirun
// the ranks shard the state over MpiComm, or over NcclComm (bootstrapped over MPI) on CUDA.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <tbb/task_arena.h>
#include <nlohmann/json.hpp>

#include "cpu_adam/optimizer.hpp"
#include "runtime/config/byte_size.hpp"
#include "runtime/cli/commands.hpp"
#include "runtime/cli/step_runner.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/config/config.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/plan/rank_placement.hpp"
#include "runtime/engine/step_overlap.hpp"
#include "tiers/device/device.hpp"

namespace strata::cli {
namespace {

struct StepBenchOptions {
  std::string config_path;
  std::string params = "1e8";
  std::string unit_params = "16e6";
  std::uint32_t steps = 2;
  std::string device = "host";
  bool json = false;
  bool overwrite = false;  // start over a store that holds a committed step (a training run's)
  std::string trace;       // Chrome trace output; empty: [trace] path
};

std::uint64_t parse_count(const std::string& text, const char* option) {
  const std::optional<std::uint64_t> count = parse_whole_count(text, 1e13);
  if (!count) {
    throw CLI::ValidationError(option, fmt::format("\"{}\" is not a whole count (e.g. 1e9)", text));
  }
  return *count;
}

std::uint64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
}

// The device the placement picks for this rank (--device), and its own communicator when it has
// one (NcclComm); config's device kind becomes the one it got.
struct PlacedDevice {
  std::unique_ptr<tiers::Device> device;
  std::unique_ptr<runtime::comm::Communicator> comm;
};

std::optional<PlacedDevice> place_device(runtime::Config& config,
                                         runtime::comm::Communicator& host_comm,
                                         const std::string& device_option) {
  config.tiers.device.kind = device_option == "cuda"   ? runtime::DeviceKind::kCuda
                             : device_option == "auto" ? runtime::DeviceKind::kAuto
                                                       : runtime::DeviceKind::kHost;
  PlacedDevice placed;
  try {
    const auto ranks = static_cast<std::uint32_t>(host_comm.size());
    const runtime::RankPlacement placement =
        runtime::select_rank_placement(config, runtime::detect_placement_environment(ranks));
    placed.device = tiers::make_device(runtime::placed_device_options(placement, config));
    placed.comm = runtime::make_placed_device_comm(placement, host_comm);
  } catch (const std::exception& error) {
    std::cerr << "strata bench step: --device " << device_option << ": " << error.what() << "\n";
    return std::nullopt;
  }
  config.tiers.device.kind = placed.device->kind();
  return placed;
}

// What one run prints.
struct StepFigures {
  std::uint64_t params = 0;
  double t_io = 0;
  double adam_per_step = 0;
  double t_step = 0;
  runtime::StepOverlap overlap;
  double bytes_per_step = 0;  // NVMe bytes moved within a step
  double nvme_gb_per_s = 0;
  std::uint64_t rss = 0;
};

StepFigures figures_of(const Timings& timings, double adam_per_step, std::uint64_t params) {
  StepFigures f;
  f.params = params;
  f.t_io = median(timings.io_s);
  f.adam_per_step = adam_per_step;
  f.t_step = median(timings.step_s);
  f.overlap = runtime::step_overlap(f.t_io, adam_per_step, f.t_step);
  f.bytes_per_step = static_cast<double>(timings.step_nvme_bytes);
  f.nvme_gb_per_s = f.bytes_per_step / f.t_step / 1e9;
  f.rss = peak_rss_bytes();
  return f;
}

void print_json(const runtime::Config& config, const tiers::Device& device,
                const StepBenchOptions& options, const StepFigures& f) {
  nlohmann::json out = {{"params", f.params},
                        {"device", device.name()},
                        {"steps", options.steps},
                        {"t_io_s", f.t_io},
                        {"t_adam_s", f.adam_per_step},
                        {"t_step_s", f.t_step},
                        {"overlap_efficiency", f.overlap.ratio},
                        {"exposed_io_s", f.overlap.exposed_io_s},
                        {"exposed_adam_s", f.overlap.exposed_adam_s},
                        {"hidden_fraction", f.overlap.hidden_fraction},
                        {"nvme_bytes_per_step", f.bytes_per_step},
                        {"nvme_gb_per_s", f.nvme_gb_per_s},
                        {"peak_rss_bytes", f.rss},
                        {"host_budget_bytes", config.tiers.host.budget_bytes}};
  std::cout << out.dump() << "\n";
}

void print_text(const runtime::Config& config, const tiers::Device& device,
                const StepBenchOptions& options, const StepFigures& f) {
  std::cout << fmt::format(
      "strata bench step: {} parameters on device {}, {} step(s) of each kind, params {} / grads "
      "{} / optimizer {}\n"
      "  t_io   {:8.3f} s  (median step with the arithmetic off: the I/O pipeline alone)\n"
      "  t_adam {:8.3f} s  (Adam over the same elements in memory)\n"
      "  t_step {:8.3f} s  (median real step)\n"
      "  exposed: I/O {:.3f} s (t_step - t_adam), Adam {:.3f} s (t_step - t_io); {:.0f}% of the "
      "smaller phase hidden under the larger\n"
      "  overlap efficiency max(t_io, t_adam) / t_step = {:.2f}\n"
      "  NVMe: {} moved within a step, {:.2f} GB/s effective\n"
      "  peak RSS {} (host budget {})\n",
      f.params, device.name(), options.steps, runtime::to_string(config.zero.params),
      runtime::to_string(config.zero.grads), runtime::to_string(config.zero.optimizer), f.t_io,
      f.adam_per_step, f.t_step, f.overlap.exposed_io_s, f.overlap.exposed_adam_s,
      100 * f.overlap.hidden_fraction, f.overlap.ratio,
      runtime::format_decimal_bytes(f.bytes_per_step), f.nvme_gb_per_s,
      runtime::format_binary_bytes(f.rss),
      runtime::format_binary_bytes(config.tiers.host.budget_bytes));
}

int run(const StepBenchOptions& options) {
  std::optional<runtime::Config> loaded =
      load_config_or_report(options.config_path, "strata bench step");
  if (!loaded) return kExitBadInput;
  runtime::Config& config = *loaded;
  // LocalComm, or MpiComm under mpirun; the placement picks each rank's GPU and NcclComm.
  std::unique_ptr<runtime::comm::Communicator> host_comm = runtime::comm::make_communicator();
  std::optional<PlacedDevice> placed = place_device(config, *host_comm, options.device);
  if (!placed) return kExitBadInput;
  tiers::Device& device = *placed->device;
  const std::uint64_t params = parse_count(options.params, "--params");
  const std::uint64_t unit_params = parse_count(options.unit_params, "--unit-params");
  for (const std::string& path : config.tiers.nvme.paths) std::filesystem::create_directories(path);

  runtime::comm::Communicator& comm = placed->comm ? *placed->comm : *host_comm;
  // Every step's work on one timeline ([trace] path, or --trace). [checkpoint] does not apply: a
  // benchmark's state is synthetic, and saving it would sit inside the timings.
  runtime::Tracer tracer;
  const std::string trace = options.trace.empty() ? config.trace.path : options.trace;
  const Timings timings =
      run_steps(config, device, comm, params, unit_params, options.steps,
                runtime::EngineOptions{.overwrite = options.overwrite,
                                       .tracer = trace.empty() ? nullptr : &tracer});
  if (!trace.empty() && host_comm->rank() == 0) tracer.write_chrome_json(trace);
  const double adam_per_step = time_adam(config, params, options.steps) / options.steps;
  const StepFigures figures = figures_of(timings, adam_per_step, params);
  if (options.json) {
    print_json(config, device, options, figures);
  } else {
    print_text(config, device, options, figures);
  }
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
  command
      ->add_option("--steps", options->steps,
                   "steps of each kind, alternating I/O-only and real (default 2)")
      ->check(CLI::Range(1u, 1000u));
  command->add_option("--device", options->device, "host (default), cuda or auto")
      ->check(CLI::IsMember({"host", "cuda", "auto"}));
  command->add_flag("--json", options->json, "print one JSON object");
  command->add_option("--trace", options->trace,
                      "write a Chrome trace of the steps here (default: [trace] path)");
  command->add_flag("--overwrite", options->overwrite,
                    "run over an NVMe store that holds a committed step (its state is lost); "
                    "without it that is refused");
  command->callback([options] {
    const int code = run(*options);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace strata::cli
