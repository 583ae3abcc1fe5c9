#include "runtime/tune/choose.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "runtime/config/byte_size.hpp"

namespace strata::runtime::tune {
namespace {

constexpr double kNearBest = 0.98;  // "as good as the best" for the I/O point and thread count

// The homes a kind may take: the ZeRO stage and the drives decide which (docs/config.md).
std::vector<Tier> allowed_homes(const Config& base, StateKind kind, bool nvme_measured) {
  std::vector<Tier> homes = {Tier::kDevice, Tier::kHost};
  const bool nvme_ok = nvme_measured && !base.tiers.nvme.paths.empty() &&
                       (kind == StateKind::kOptimizer ||
                        (kind == StateKind::kGrads && base.zero.stage >= 2) ||
                        (kind == StateKind::kParams && base.zero.stage >= 3));
  if (nvme_ok) homes.push_back(Tier::kNvme);
  return homes;
}

// Powers of two from 2^30 down to 2^16 elements: the sub-group sizes tried when state streams
// from NVMe (larger first, so a tie keeps fewer, larger requests).
std::vector<std::uint64_t> sub_group_candidates(const Config& config) {
  const bool streams = config.zero.params == Tier::kNvme || config.zero.grads == Tier::kNvme ||
                       config.zero.optimizer == Tier::kNvme;
  if (!streams) return {config.zero.sub_group_size};
  std::vector<std::uint64_t> out;
  for (std::uint64_t group = std::uint64_t{1} << 30; group >= (std::uint64_t{1} << 16); group /= 2) {
    out.push_back(group);
  }
  return out;
}

// A [zero] *_host_fraction for a kind homed on `home`: with the kind on NVMe, as much on the host
// as the budget allows is tried first (a tie keeps more in memory, less NVMe wear).
std::vector<double> host_fraction_candidates(Tier home) {
  if (home != Tier::kNvme) return {0.0};
  return {0.75, 0.5, 0.25, 0.0};
}

// [zero] optimizer_device_fraction: on a real device, with the optimizer off it and the parameters
// and gradients on it, as much as the device budget holds is tried first (the device's update is
// ~50x the CPU's and crosses no bus; a tie keeps more on the device).
std::vector<double> device_fraction_candidates(const Config& config, const MachineProfile& profile) {
  const bool splits = config.tiers.device.kind != DeviceKind::kHost && profile.h2d_gb_per_s &&
                      config.zero.optimizer != Tier::kDevice &&
                      config.zero.params == Tier::kDevice && config.zero.grads == Tier::kDevice;
  if (!splits) return {0.0};
  return {1.0, 0.75, 0.5, 0.25, 0.0};
}

void add_reasons(TuneChoice& choice, const MachineProfile& profile) {
  const Config& c = choice.config;
  const StepPrediction& p = choice.prediction;
  auto reason = [&](std::string key, std::string why) { choice.reasons.emplace_back(std::move(key), std::move(why)); };
  if (!profile.io.empty()) {
    const IoPoint& io = nearest_io_point(profile, c.tiers.nvme);
    const std::string point = fmt::format("measured {:.0f} MB/s mixed, {:.0f} read, {:.0f} write",
                                          io.mixed_mb_per_s, io.read_mb_per_s, io.write_mb_per_s);
    reason("tiers.nvme.block_size", point + " (best mixed point of the grid)");
    reason("tiers.nvme.queue_depth", point);
    reason("tiers.nvme.rings", point);
  }
  const AdamUpdate update = adam_update(c);
  reason("optimizer.threads",
         fmt::format("Adam {:.3g} params/s with {} threads (the fewest within 2% of the best "
                     "measured; {})",
                     adam_params_per_s(profile, c.optimizer.threads, update), c.optimizer.threads,
                     describe_adam_update(update)));
  const std::string placement = fmt::format(
      "the fastest predicted placement that fits: step {:.3f} s (forward+backward {:.3f} s, "
      "optimizer {:.3f} s)",
      p.step_s, p.forward_backward_s, p.optimizer_s);
  reason("zero.params", placement);
  reason("zero.grads", placement);
  reason("zero.optimizer", placement);
  const bool streams = p.plan.nvme_read_bytes_per_step + p.plan.nvme_write_bytes_per_step > 0;
  reason("zero.sub_group_size",
         streams ? fmt::format("{} sub-groups per step; their I/O fills {:.0f}% of the engine's "
                               "queues",
                               p.sub_groups, 100 * p.io_fill)
                 : std::string("as given: nothing streams from NVMe"));
  const std::string host_share = "the largest share the host budget keeps in memory, if faster";
  reason("zero.optimizer_host_fraction", host_share);
  reason("zero.params_host_fraction", host_share);
  reason("zero.grads_host_fraction", host_share);
  reason("zero.optimizer_device_fraction",
         c.zero.optimizer_device_fraction > 0
             ? fmt::format("the largest share the device budget holds: the device updates {:.0f}% "
                           "of the optimizer state in place, the CPU the rest",
                           100 * c.zero.optimizer_device_fraction)
             : std::string("none: the optimizer is on the device, or the device budget holds no "
                           "share, or the device is the host's"));
  reason("zero.buffer_count", "predicted no slower than fewer buffers, and fits the host budget");
  reason("zero.prefetch_depth", "predicted no slower than less prefetch, and fits the device budget");
}

// buffer_count x prefetch_depth for one placement and sub-group size; keeps the strictly faster.
void search_pipeline(Config c, const PlanInputs& inputs, const MachineProfile& profile,
                     std::optional<TuneChoice>& best, std::uint64_t& candidates,
                     std::uint64_t& fitting) {
  for (std::uint32_t buffers : {4u, 3u, 2u}) {
    for (std::uint32_t prefetch : {2u, 1u, 0u}) {
      c.zero.buffer_count = buffers;
      c.zero.prefetch_depth = prefetch;
      ++candidates;
      StepPrediction prediction = predict_step(c, inputs, profile);
      if (!prediction.plan.fits() || !std::isfinite(prediction.step_s)) continue;
      ++fitting;
      if (best && !(prediction.step_s < best->prediction.step_s)) continue;
      best = TuneChoice{c, std::move(prediction), 0, 0, {}};
    }
  }
}

// optimizer x params x grads host fractions for one placement and sub-group size.
void search_host_fractions(Config c, const PlanInputs& inputs, const MachineProfile& profile,
                           std::optional<TuneChoice>& best, std::uint64_t& candidates,
                           std::uint64_t& fitting) {
  for (double device : device_fraction_candidates(c, profile)) {
    for (double optimizer : host_fraction_candidates(c.zero.optimizer)) {
      if (device + optimizer > 1.0) continue;
      for (double params : host_fraction_candidates(c.zero.params)) {
        for (double grads : host_fraction_candidates(c.zero.grads)) {
          c.zero.optimizer_device_fraction = device;
          c.zero.optimizer_host_fraction = optimizer;
          c.zero.params_host_fraction = params;
          c.zero.grads_host_fraction = grads;
          search_pipeline(c, inputs, profile, best, candidates, fitting);
        }
      }
    }
  }
}

}  // namespace

std::optional<IoPoint> choose_io_point(const MachineProfile& profile) {
  if (profile.io.empty()) return std::nullopt;
  if (profile.engine_io_point && *profile.engine_io_point < profile.io.size()) {
    return profile.io[*profile.engine_io_point];
  }
  double best_rate = 0;
  for (const IoPoint& point : profile.io) best_rate = std::max(best_rate, point.mixed_mb_per_s);
  // Rates closer than the grid's own noise (what a confirmation moved a point by) are a tie.
  const double near_best = std::min(kNearBest, 1.0 - profile.io_noise);
  const IoPoint* chosen = nullptr;
  for (const IoPoint& point : profile.io) {
    if (point.mixed_mb_per_s < near_best * best_rate) continue;
    if (chosen == nullptr || point.in_flight_bytes() < chosen->in_flight_bytes()) chosen = &point;
  }
  return *chosen;
}

std::uint32_t choose_adam_threads(const MachineProfile& profile, const AdamUpdate& update) {
  double best_rate = 0;
  for (const AdamPoint& point : profile.adam) {
    if (point.update == update) best_rate = std::max(best_rate, point.params_per_s);
  }
  std::uint32_t chosen = 0;
  for (const AdamPoint& point : profile.adam) {
    if (point.update != update || point.params_per_s < kNearBest * best_rate) continue;
    if (chosen == 0 || point.threads < chosen) chosen = point.threads;
  }
  return chosen;
}

std::optional<TuneChoice> choose_config(const Config& base, const PlanInputs& inputs,
                                        const MachineProfile& profile) {
  Config tuned = base;
  if (const std::optional<IoPoint> io = choose_io_point(profile)) {
    tuned.tiers.nvme.block_size = io->block_bytes;
    tuned.tiers.nvme.queue_depth = io->queue_depth;
    tuned.tiers.nvme.rings = io->rings;
  }
  if (const std::uint32_t threads = choose_adam_threads(profile, adam_update(base)); threads > 0) {
    tuned.optimizer.threads = threads;
  }

  const bool nvme_measured = !profile.io.empty();
  std::optional<TuneChoice> best;
  std::uint64_t candidates = 0, fitting = 0;
  for (Tier params : allowed_homes(base, StateKind::kParams, nvme_measured)) {
    for (Tier grads : allowed_homes(base, StateKind::kGrads, nvme_measured)) {
      for (Tier optimizer : allowed_homes(base, StateKind::kOptimizer, nvme_measured)) {
        Config c = tuned;
        c.zero.params = params;
        c.zero.grads = grads;
        c.zero.optimizer = optimizer;
        for (std::uint64_t group : sub_group_candidates(c)) {
          c.zero.sub_group_size = group;
          search_host_fractions(c, inputs, profile, best, candidates, fitting);
        }
      }
    }
  }
  if (!best) return std::nullopt;
  best->candidates = candidates;
  best->fitting = fitting;
  add_reasons(*best, profile);
  return best;
}

}  // namespace strata::runtime::tune
