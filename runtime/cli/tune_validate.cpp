#include "runtime/cli/tune_validate.hpp"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <unistd.h>

#include "runtime/cli/step_runner.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/tune/cost_model.hpp"

namespace strata::cli {
namespace {

// Real steps timed per config (as many I/O-only steps alternate with them): the median of three
// keeps one disturbed step on a shared machine out of the figure.
constexpr std::uint32_t kSteps = 3;

struct HandConfig {
  std::string name;
  runtime::Config config;
};

// The tuned config and its neighbours one knob away, and the config as given.
std::vector<HandConfig> grid(const runtime::Config& given, const runtime::Config& tuned) {
  std::vector<HandConfig> out = {{"tuned", tuned}, {"as given", given}};
  auto variant = [&](std::string name, auto change) {
    runtime::Config c = tuned;
    change(c.zero, c.tiers.nvme);
    // A neighbour the tuned config already is stays in the table: the two figures of one config
    // show the run's noise.
    out.push_back({c == tuned ? "(= tuned) " + name : std::move(name), c});
  };
  variant("sub_group_size / 4", [](runtime::ZeroConfig& z, auto&) {
    z.sub_group_size = std::max<std::uint64_t>(1024, z.sub_group_size / 4);
  });
  variant("sub_group_size x 4", [](runtime::ZeroConfig& z, auto&) { z.sub_group_size *= 4; });
  variant("buffer_count 2", [](runtime::ZeroConfig& z, auto&) { z.buffer_count = 2; });
  const runtime::ZeroConfig& zero = tuned.zero;
  if (zero.optimizer_host_fraction + zero.params_host_fraction + zero.grads_host_fraction > 0) {
    variant("no host fractions", [](runtime::ZeroConfig& z, auto&) {
      z.optimizer_host_fraction = z.params_host_fraction = z.grads_host_fraction = 0;
    });
  }
  variant("1 MiB x 16 x 1 ring", [](auto&, runtime::NvmeTierConfig& n) {
    n.block_size = 1 << 20;
    n.queue_depth = 16;
    n.rings = 1;
  });
  return out;
}

// " (0.5 on host)" for a kind a host fraction splits.
std::string on_host(double fraction) {
  return fraction > 0 ? fmt::format(" ({} on host)", fraction) : std::string();
}

// The validation's own store directories, so a training store in the paths is never touched.
runtime::Config in_scratch(runtime::Config config) {
  for (std::string& path : config.tiers.nvme.paths) {
    path = (std::filesystem::path(path) / "strata-tune-validate").string();
    std::filesystem::create_directories(path);
  }
  config.tiers.device.kind = runtime::DeviceKind::kHost;
  return config;
}

}  // namespace

void validate_choice(const runtime::Config& given, const runtime::Config& tuned,
                     const runtime::tune::MachineProfile& profile, std::uint64_t params,
                     std::uint64_t model_unit_params) {
  // Units of the model's size: the budgets were fitted to its largest unit (pipeline buffers,
  // gathered units), so other units could make the tuned config not fit, or fit too easily.
  const std::uint64_t unit_params =
      std::max<std::uint64_t>(1, std::min<std::uint64_t>(params, model_unit_params));
  std::vector<std::uint64_t> units;
  for (std::uint64_t done = 0; done < params; done += unit_params) {
    units.push_back(std::min(unit_params, params - done));
  }
  std::unique_ptr<runtime::comm::Communicator> comm = runtime::comm::make_communicator();
  std::cout << fmt::format(
      "validation: the optimizer step over {} parameters ({} units) on the host device, median of "
      "{} real steps, against the predicted optimizer phase\n",
      params, units.size(), kSteps);
  std::cout << fmt::format("  {:<30} {:>9} {:>9} {:>9} {:>7}  {}\n", "config", "predicted",
                           "measured", "ratio", "fits",
                           "placement (params/grads/optimizer), sub-group, buffers");
  for (const HandConfig& hand : grid(given, tuned)) {
    const runtime::Config config = in_scratch(hand.config);
    const runtime::tune::StepPrediction prediction = runtime::tune::predict_step(
        config, runtime::PlanInputs(params, 1, units), profile);
    const std::string placement = fmt::format(
        "{}{}/{}{}/{}{}, {}, {}", runtime::to_string(config.zero.params),
        on_host(config.zero.params_host_fraction), runtime::to_string(config.zero.grads),
        on_host(config.zero.grads_host_fraction), runtime::to_string(config.zero.optimizer),
        on_host(config.zero.optimizer_host_fraction), config.zero.sub_group_size,
        config.zero.buffer_count);
    if (!prediction.plan.fits()) {
      std::cout << fmt::format("  {:<30} {:>9} {:>9} {:>9} {:>7}  {}\n", hand.name, "-", "-", "-",
                               "no", placement);
      continue;
    }
    // What earlier configs (and the measurements) left dirty is flushed first: otherwise the
    // first config's fsyncs pay for it (the tuned one, measured first, was 2x slower than the
    // same config measured later in the same run).
    ::sync();
    tiers::DeviceOptions device_options;
    device_options.kind = tiers::DeviceKind::kHost;
    device_options.budget_bytes = config.tiers.device.budget_bytes;
    std::unique_ptr<tiers::Device> device = tiers::make_device(device_options);
    const Timings timings = run_steps(config, *device, *comm, params, unit_params, kSteps,
                                      runtime::EngineOptions{.overwrite = true});
    const double measured = median(timings.step_s);
    std::cout << fmt::format("  {:<30} {:>8.3f}s {:>8.3f}s {:>9.2f} {:>7}  {}\n", hand.name,
                             prediction.optimizer_s, measured, measured / prediction.optimizer_s,
                             "yes", placement);
  }
  for (const std::string& path : in_scratch(tuned).tiers.nvme.paths) {
    std::filesystem::remove_all(path);
  }
}

}  // namespace strata::cli
