#include "runtime/cli/tune_calibrate.hpp"

#include <algorithm>
#include <exception>
#include <filesystem>

#include <fmt/format.h>
#include <unistd.h>

#include "runtime/cli/step_runner.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/tune/cost_model.hpp"

namespace strata::cli {
namespace {

// One unit of 4 Mi parameters (48 MiB of fp32 optimizer state: past the caches, a second or two
// per configuration on a slow disk), cut into 4 and into 32 sub-groups.
constexpr std::uint64_t kParams = std::uint64_t{1} << 22;
constexpr std::uint64_t kFewGroups = 4;
constexpr std::uint64_t kManyGroups = 32;
constexpr std::uint32_t kSteps = 2;

struct Sample {
  double measured_s = 0;
  double predicted_s = 0;
  std::uint64_t sub_groups = 0;
};

Sample sample(runtime::Config config, std::uint64_t groups,
              const runtime::tune::MachineProfile& profile) {
  config.zero.sub_group_size = kParams / groups;
  const runtime::tune::StepPrediction prediction =
      runtime::tune::predict_step(config, runtime::PlanInputs(kParams, 1, {kParams}), profile);
  ::sync();  // what the measurements left dirty is not this sample's to flush
  tiers::DeviceOptions device_options;
  device_options.kind = tiers::DeviceKind::kHost;
  device_options.budget_bytes = config.tiers.device.budget_bytes;
  std::unique_ptr<tiers::Device> device = tiers::make_device(device_options);
  std::unique_ptr<runtime::comm::Communicator> comm = runtime::comm::make_communicator();
  const Timings timings = run_steps(config, *device, *comm, kParams, kParams, kSteps,
                                    runtime::EngineOptions{.overwrite = true});
  return {median(timings.step_s), prediction.optimizer_s, prediction.sub_groups};
}

}  // namespace

double calibrate_sub_group_overhead(const runtime::Config& given,
                                    runtime::tune::MachineProfile& profile, std::ostream& log) {
  profile.sub_group_overhead_s = 0;
  if (given.tiers.nvme.paths.empty() || profile.io.empty()) return 0;
  // The optimizer streamed from NVMe, everything else on the (host) device, in scratch folders
  // of the validation's kind, so a training store in the paths is never touched.
  runtime::Config config = given;
  config.tiers.device.kind = runtime::DeviceKind::kHost;
  config.tiers.device.budget_bytes = std::max<std::uint64_t>(config.tiers.device.budget_bytes,
                                                             std::uint64_t{1} << 30);
  config.tiers.host.budget_bytes = std::max<std::uint64_t>(config.tiers.host.budget_bytes,
                                                           std::uint64_t{1} << 30);
  config.zero.params = config.zero.grads = runtime::Tier::kDevice;
  config.zero.optimizer = runtime::Tier::kNvme;
  config.zero.params_host_fraction = config.zero.grads_host_fraction = 0;
  config.zero.optimizer_host_fraction = 0;
  config.zero.buffer_count = std::max<std::uint32_t>(config.zero.buffer_count, 3);
  for (std::string& path : config.tiers.nvme.paths) {
    path = (std::filesystem::path(path) / "strata-tune-calibrate").string();
    std::filesystem::create_directories(path);
  }
  Sample few, many;
  try {
    few = sample(config, kFewGroups, profile);
    many = sample(config, kManyGroups, profile);
  } catch (const std::exception& error) {
    // A drive too small or too full for 4 Mi parameters' state: the model goes without the term.
    for (const std::string& path : config.tiers.nvme.paths) std::filesystem::remove_all(path);
    log << "calibration: skipped (" << error.what() << "): no per-sub-group cost in the model\n";
    return 0;
  }
  for (const std::string& path : config.tiers.nvme.paths) std::filesystem::remove_all(path);
  // What the model misses at each size; the part that grows with the sub-groups is theirs.
  const double residual_few = few.measured_s - few.predicted_s;
  const double residual_many = many.measured_s - many.predicted_s;
  const double per_group =
      std::max(0.0, (residual_many - residual_few) /
                        static_cast<double>(many.sub_groups - few.sub_groups));
  log << fmt::format(
      "calibration: optimizer step over {} parameters in {} sub-groups {:.3f} s (predicted "
      "{:.3f} s), in {} sub-groups {:.3f} s (predicted {:.3f} s): {:.2f} ms per sub-group\n",
      kParams, few.sub_groups, few.measured_s, few.predicted_s, many.sub_groups,
      many.measured_s, many.predicted_s, per_group * 1e3);
  profile.sub_group_overhead_s = per_group;
  return per_group;
}

}  // namespace strata::cli
