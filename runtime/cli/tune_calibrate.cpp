#include "runtime/cli/tune_calibrate.hpp"

#include <algorithm>
#include <exception>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "runtime/cli/step_runner.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/tune/cost_model.hpp"
#include "runtime/tune/validation.hpp"

namespace strata::cli {
namespace {

// One unit of 4 Mi parameters (48 MiB of fp32 optimizer state: past the caches, a second or two
// per configuration on a slow disk), cut into 4 and into 32 sub-groups.
constexpr std::uint64_t kParams = std::uint64_t{1} << 22;
constexpr std::uint64_t kFewGroups = 4;
constexpr std::uint64_t kManyGroups = 32;
constexpr std::uint32_t kCalibrationSteps = 2;

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
  std::unique_ptr<runtime::comm::Communicator> comm = runtime::comm::make_communicator();
  const Timings timings = run_steps_on_host(config, *comm, kParams, kParams, kCalibrationSteps);
  return {median(timings.step_s), prediction.optimizer_s, prediction.sub_groups};
}

}  // namespace

double calibrate_sub_group_overhead(const runtime::Config& given,
                                    runtime::tune::MachineProfile& profile, std::ostream& log) {
  profile.sub_group_overhead_s = 0;
  if (given.tiers.nvme.paths.empty() || profile.io.empty()) return 0;
  // The optimizer streamed from NVMe, everything else on the (host) device, in scratch stores.
  runtime::Config config = in_scratch_stores(given, "strata-tune-calibrate");
  config.tiers.device.budget_bytes = std::max<std::uint64_t>(config.tiers.device.budget_bytes,
                                                             std::uint64_t{1} << 30);
  config.tiers.host.budget_bytes = std::max<std::uint64_t>(config.tiers.host.budget_bytes,
                                                           std::uint64_t{1} << 30);
  config.zero.params = config.zero.grads = runtime::Tier::kDevice;
  config.zero.optimizer = runtime::Tier::kNvme;
  config.zero.params_host_fraction = config.zero.grads_host_fraction = 0;
  config.zero.optimizer_host_fraction = 0;
  config.zero.optimizer_device_fraction = 0;
  config.zero.buffer_count = std::max<std::uint32_t>(config.zero.buffer_count, 3);
  // Three rounds, the two sizes alternately (round_order), each size's median: one pair of samples
  // swung the per-sub-group figure by 2x between runs on the development VM.
  constexpr std::uint32_t kRounds = 3;
  Sample few, many;
  std::vector<double> few_s, many_s;
  try {
    for (std::uint32_t round = 0; round < kRounds; ++round) {
      for (std::size_t which : runtime::tune::round_order(2, round)) {
        Sample& taken = which == 0 ? few : many;
        taken = sample(config, which == 0 ? kFewGroups : kManyGroups, profile);
        (which == 0 ? few_s : many_s).push_back(taken.measured_s);
      }
    }
  } catch (const std::exception& error) {
    // A drive too small or too full for 4 Mi parameters' state: the model goes without the term.
    remove_scratch_stores(config);
    log << "calibration: skipped (" << error.what() << "): no per-sub-group cost in the model\n";
    return 0;
  }
  few.measured_s = median(few_s);
  many.measured_s = median(many_s);
  remove_scratch_stores(config);
  // What the model misses at each size; the part that grows with the sub-groups is theirs.
  const double residual_few = few.measured_s - few.predicted_s;
  const double residual_many = many.measured_s - many.predicted_s;
  const double per_group =
      std::max(0.0, (residual_many - residual_few) /
                        static_cast<double>(many.sub_groups - few.sub_groups));
  log << fmt::format(
      "calibration: optimizer step over {} parameters in {} sub-groups {:.3f} s (predicted "
      "{:.3f} s), in {} sub-groups {:.3f} s (predicted {:.3f} s), medians of {} rounds: {:.2f} ms "
      "per sub-group\n",
      kParams, few.sub_groups, few.measured_s, few.predicted_s, many.sub_groups,
      many.measured_s, many.predicted_s, kRounds, per_group * 1e3);
  profile.sub_group_overhead_s = per_group;
  return per_group;
}

namespace {

// choose_io_point_on_engine's bounds: the steps' parameters, the grid points timed, the rounds.
constexpr std::uint64_t kEngineIoMaxParams = std::uint64_t{1} << 24;
constexpr std::uint64_t kEngineIoMinParams = std::uint64_t{1} << 20;
constexpr std::size_t kEngineIoMaxPoints = 4;
constexpr std::uint32_t kEngineIoRounds = 3;

double best_mixed_rate(const runtime::tune::MachineProfile& profile) {
  double best_rate = 0;
  for (const runtime::tune::IoPoint& p : profile.io)
    best_rate = std::max(best_rate, p.mixed_mb_per_s);
  return best_rate;
}

// The grid points whose mixed rate is at least half the best, fastest first, four at most.
std::vector<std::size_t> candidate_points(const runtime::tune::MachineProfile& profile,
                                          double best_rate) {
  std::vector<std::size_t> points;
  for (std::size_t i = 0; i < profile.io.size(); ++i) {
    if (profile.io[i].mixed_mb_per_s >= 0.5 * best_rate) points.push_back(i);
  }
  std::sort(points.begin(), points.end(), [&](std::size_t a, std::size_t b) {
    return profile.io[a].mixed_mb_per_s > profile.io[b].mixed_mb_per_s;
  });
  if (points.size() > kEngineIoMaxPoints) points.resize(kEngineIoMaxPoints);
  return points;
}

void use_io_point(runtime::Config& config, const runtime::tune::IoPoint& point) {
  config.tiers.nvme.block_size = point.block_bytes;
  config.tiers.nvme.queue_depth = point.queue_depth;
  config.tiers.nvme.rings = point.rings;
}

// Each point's step time over the rounds, the points in round_order; empty when the Engine
// cannot run there (the line in `log` says why). `config` works in scratch stores.
std::optional<std::vector<runtime::tune::RoundFigures>> time_points(
    runtime::Config& config, const runtime::tune::MachineProfile& profile,
    const std::vector<std::size_t>& points, std::uint64_t params, std::uint64_t unit_params,
    std::ostream& log) {
  std::vector<std::vector<double>> round_s(points.size());
  try {
    std::unique_ptr<runtime::comm::Communicator> comm = runtime::comm::make_communicator();
    for (std::uint32_t round = 0; round < kEngineIoRounds; ++round) {
      for (std::size_t position : runtime::tune::round_order(points.size(), round)) {
        use_io_point(config, profile.io[points[position]]);
        const Timings timings = run_steps_on_host(config, *comm, params, unit_params, kCalibrationSteps);
        round_s[position].push_back(median(timings.step_s));
      }
    }
  } catch (const std::exception& error) {
    remove_scratch_stores(config);
    log << "io on the engine: skipped (" << error.what() << "): the grid's choice stands\n";
    return std::nullopt;
  }
  remove_scratch_stores(config);
  std::vector<runtime::tune::RoundFigures> figures;
  for (const std::vector<double>& samples : round_s) {
    figures.push_back(runtime::tune::summarize(samples));
  }
  return figures;
}

void log_points(const runtime::tune::MachineProfile& profile,
                const std::vector<std::size_t>& points,
                const std::vector<runtime::tune::RoundFigures>& figures, std::size_t fastest,
                const runtime::tune::EngineIoFit& fit, std::uint64_t params, std::ostream& log) {
  for (std::size_t k = 0; k < points.size(); ++k) {
    const runtime::tune::IoPoint& point = profile.io[points[k]];
    log << fmt::format(
        "io on the engine: {} x {} x {} ring(s): optimizer step over {} parameters {:.3f} s "
        "(median of {} rounds, {:.3f}..{:.3f}){}\n",
        point.block_bytes, point.queue_depth, point.rings, params, figures[k].median_s,
        kEngineIoRounds, figures[k].min_s, figures[k].max_s,
        k == fastest
            ? fmt::format(": the fastest; the Engine's step moves its bytes at {:.2f}x the probe's "
                          "mixed rates{}",
                          fit.scale,
                          !fit.at_bound ? ""
                          : fit.scale < 1
                              ? " (a bound: the step is slower than even that explains; the "
                                "probe's rates are kept)"
                              : " (a bound: the other lanes alone predict a longer step; the "
                                "probe's rates are kept)")
            : std::string());
  }
}

}  // namespace

void choose_io_point_on_engine(const runtime::Config& chosen,
                               runtime::tune::MachineProfile& profile, std::uint64_t params,
                               std::uint64_t unit_params, double budget_s, std::ostream& log) {
  if (chosen.tiers.nvme.paths.empty() || profile.io.size() < 2) return;
  const double best_rate = best_mixed_rate(profile);
  const std::vector<std::size_t> points = candidate_points(profile, best_rate);
  if (points.size() < 2) return;
  // A fifth of the time budget: each sample is about five steps' worth (state initialised, two
  // I/O-only and two real steps), each moving ~24 bytes per parameter of fp32 optimizer state (a
  // compressed state moves less) at the best mixed rate.
  const double sample_steps = 5.0 * kEngineIoRounds * static_cast<double>(points.size());
  const double affordable = 0.2 * budget_s / sample_steps * best_rate * 1e6 / 24.0;
  params = std::min({params, kEngineIoMaxParams,
                     std::max(kEngineIoMinParams, static_cast<std::uint64_t>(affordable))});
  unit_params = std::max<std::uint64_t>(1, std::min(unit_params, params));
  runtime::Config config = in_scratch_stores(chosen, "strata-tune-io");
  const std::optional<std::vector<runtime::tune::RoundFigures>> figures =
      time_points(config, profile, points, params, unit_params, log);
  if (!figures) return;
  std::size_t fastest = 0;
  for (std::size_t k = 1; k < points.size(); ++k) {
    if ((*figures)[k].median_s < (*figures)[fastest].median_s) fastest = k;
  }
  // The probe's mixed rates as the Engine's step sees them: the scale at which the model predicts
  // the step just measured at the fastest point (fit_engine_io_scale).
  profile.engine_io_point = points[fastest];
  use_io_point(config, profile.io[points[fastest]]);
  const runtime::PlanInputs sample(params, 1, unit_sizes(params, unit_params));
  const runtime::tune::EngineIoFit fit =
      runtime::tune::fit_engine_io_scale(config, sample, profile, (*figures)[fastest].median_s);
  // At a bound no factor explains the step (another lane, or something the model leaves out,
  // sets it): the probe's rates stand, rather than a factor 1/8 or 8 applied to every placement.
  profile.engine_io_scale = fit.at_bound ? 1 : fit.scale;
  log_points(profile, points, *figures, fastest, fit, params, log);
}

}  // namespace strata::cli
