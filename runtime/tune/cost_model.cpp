#include "runtime/tune/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/format.h>

#include "base/assert.hpp"
#include "cpu_adam/state_dtype.hpp"
#include "runtime/plan/partition.hpp"

namespace strata::runtime::tune {
namespace {

double log2_distance(double a, double b) {
  return std::abs(std::log2(std::max(a, 1.0)) - std::log2(std::max(b, 1.0)));
}

double seconds_for(std::uint64_t bytes, double mb_per_s) {
  if (bytes == 0) return 0;
  return mb_per_s > 0 ? static_cast<double>(bytes) / (mb_per_s * 1e6)
                      : std::numeric_limits<double>::infinity();
}

double seconds_for_elements(std::uint64_t elements, double per_s) {
  if (elements == 0) return 0;
  return per_s > 0 ? static_cast<double>(elements) / per_s : std::numeric_limits<double>::infinity();
}

// The store's checksum thread over `bytes` (0 when the profile has no XXH3 rate).
double checksum_seconds(std::uint64_t bytes, const MachineProfile& profile) {
  return profile.checksum_gb_per_s > 0 ? seconds_for(bytes, profile.checksum_gb_per_s * 1e3) : 0;
}

// Host <-> device copies exist only on a real device (the staged data path, docs/design.md): the
// host device addresses every home directly.
bool copies_cross_a_bus(const Config& config, const MachineProfile& profile) {
  return config.tiers.device.kind != DeviceKind::kHost && profile.h2d_gb_per_s.has_value() &&
         profile.d2h_gb_per_s.has_value();
}

const StateRow& row(const MemoryPlan& plan, StateKind kind) {
  for (const StateRow& state : plan.states) {
    if (state.kind == kind) return state;
  }
  STRATA_ASSERT(false && "the plan has a row per state kind");
  return plan.states.front();
}

// The mixed rate at `io`'s block size and rings with only `in_flight_bytes` outstanding: the queue
// depth they amount to, looked up in the measured points of that block size and ring count
// (interpolated in log2 of the depth); below the smallest depth measured, proportional to it.
double mixed_rate_in_flight(const MachineProfile& profile, const IoPoint& io, double in_flight_bytes) {
  const double depth = std::min<double>(
      io.queue_depth, in_flight_bytes / static_cast<double>(io.block_bytes * io.rings));
  if (depth >= io.queue_depth) return io.mixed_mb_per_s;
  const IoPoint* below = nullptr;  // the deepest measured at or below `depth`
  const IoPoint* above = &io;      // the shallowest measured above it
  const IoPoint* lowest = &io;
  for (const IoPoint& point : profile.io) {
    if (point.block_bytes != io.block_bytes || point.rings != io.rings) continue;
    if (point.queue_depth < lowest->queue_depth) lowest = &point;
    if (point.queue_depth <= depth && (below == nullptr || point.queue_depth > below->queue_depth)) {
      below = &point;
    }
    if (point.queue_depth > depth && point.queue_depth < above->queue_depth) above = &point;
  }
  if (below == nullptr) return lowest->mixed_mb_per_s * depth / lowest->queue_depth;
  const double span = std::log2(above->queue_depth) - std::log2(below->queue_depth);
  if (span <= 0) return below->mixed_mb_per_s;
  const double t = (std::log2(depth) - std::log2(below->queue_depth)) / span;
  return below->mixed_mb_per_s + t * (above->mixed_mb_per_s - below->mixed_mb_per_s);
}

// Optimizer elements per rank cut into sub-groups: how many, and the fraction of the engine's
// queues the I/O of the groups in flight fills (buffer_count - 1 of them: reads ahead and the
// write behind; one when nothing overlaps).
void plan_sub_groups(const Config& config, const MachineProfile& profile, const MemoryPlan& plan,
                     const IoPoint* io, StepPrediction& out) {
  const StateRow& optimizer = row(plan, StateKind::kOptimizer);
  const std::uint64_t shard_max =
      std::max<std::uint64_t>(1, (plan.unit_elements + plan.ranks - 1) / plan.ranks);
  const std::uint64_t group =
      std::min(sub_group_elements(config.zero.sub_group_size), shard_max);
  out.sub_groups = std::max<std::uint64_t>(1, (optimizer.elements_per_rank + group - 1) / group);
  if (io == nullptr) return;
  std::uint64_t group_bytes = 0;  // every NVMe-homed kind's share of one sub-group
  for (const StateRow& state : plan.states) {
    if (state.home == Tier::kNvme) group_bytes += group * state.bytes_per_param;
  }
  const std::uint64_t groups_in_flight = config.zero.buffer_count > 2 ? config.zero.buffer_count - 1 : 1;
  const double in_flight = static_cast<double>(group_bytes * groups_in_flight);
  out.io_fill = mixed_rate_in_flight(profile, *io, in_flight) / io->mixed_mb_per_s;
}

void predict_forward_backward(const Config& config, const MachineProfile& profile,
                              const IoPoint* io, StepPrediction& out) {
  const MemoryPlan& plan = out.plan;
  const NvmeTraffic& params = plan.traffic(StateKind::kParams);
  const NvmeTraffic& grads = plan.traffic(StateKind::kGrads);
  if (io != nullptr) {
    out.nvme_forward_backward_s =
        std::max(seconds_for(params.read_bytes, io->read_mb_per_s) +
                     seconds_for(grads.write_bytes, io->write_mb_per_s),
                 checksum_seconds(params.read_bytes + grads.write_bytes, profile));
  }
  if (copies_cross_a_bus(config, profile)) {
    const StateRow& param_row = row(plan, StateKind::kParams);
    const StateRow& grad_row = row(plan, StateKind::kGrads);
    const std::uint64_t gathers = plan.stage >= 3 ? 2 : 1;
    const std::uint64_t h2d = param_row.home != Tier::kDevice ? gathers * param_row.bytes_per_rank : 0;
    const std::uint64_t d2h = grad_row.home != Tier::kDevice ? grad_row.bytes_per_rank : 0;
    out.transfer_s = seconds_for(h2d, *profile.h2d_gb_per_s * 1e3) +
                     seconds_for(d2h, *profile.d2h_gb_per_s * 1e3);
  }
  if (profile.compute_flops > 0) {
    const double tokens = static_cast<double>(config.model.micro_batch) * config.model.seq_len *
                          config.model.grad_accumulation;
    out.compute_s = 6.0 * static_cast<double>(plan.params) * tokens / profile.compute_flops;
  }
  const double moves = out.nvme_forward_backward_s + out.transfer_s;
  out.forward_backward_s = config.zero.prefetch_depth > 0 ? std::max(out.compute_s, moves)
                                                          : out.compute_s + moves;
}

// The share of the optimizer's elements a real device updates in place (all of them when every
// kind is homed on it, else [zero] optimizer_device_fraction's units): neither the CPU nor the bus
// sees them. Their update moves ~28 bytes a parameter at the device's memory bandwidth (1e9
// parameters in ~8 ms on an H200), which the model leaves out.
double device_updated_share(const Config& config, const MachineProfile& profile,
                            const StateRow& optimizer) {
  if (!copies_cross_a_bus(config, profile) || optimizer.bytes_per_rank == 0) return 0;
  const ZeroConfig& zero = config.zero;
  if (zero.params != Tier::kDevice || zero.grads != Tier::kDevice) return 0;
  if (optimizer.home == Tier::kDevice) return 1;
  return static_cast<double>(optimizer.device_bytes_per_rank) /
         static_cast<double>(optimizer.bytes_per_rank);
}

std::uint64_t scaled(std::uint64_t value, double share) {
  return static_cast<std::uint64_t>(static_cast<double>(value) * share);
}

void predict_optimizer(const Config& config, const MachineProfile& profile, const IoPoint* io,
                       StepPrediction& out) {
  const MemoryPlan& plan = out.plan;
  const StateRow& optimizer = row(plan, StateKind::kOptimizer);
  const double on_cpu = 1.0 - device_updated_share(config, profile, optimizer);
  // The rate of the update this config runs (0, not measured: no finite prediction).
  out.adam_s = seconds_for_elements(
      scaled(optimizer.elements_per_rank, on_cpu),
      adam_params_per_s(profile, config.optimizer.threads, adam_update(config)));
  if (io != nullptr) {
    std::uint64_t bytes = 0;  // reads of optimizer state and gradients, writes of both and params
    bytes += plan.traffic(StateKind::kOptimizer).read_bytes + plan.traffic(StateKind::kOptimizer).write_bytes;
    bytes += plan.traffic(StateKind::kGrads).read_bytes;
    bytes += row(plan, StateKind::kParams).home == Tier::kNvme ? row(plan, StateKind::kParams).bytes_per_rank : 0;
    out.nvme_optimizer_s =
        seconds_for(bytes, io->mixed_mb_per_s * out.io_fill * profile.engine_io_scale);
    out.checksum_s = checksum_seconds(bytes, profile);
    const double flush = flush_mb_per_s(profile);
    if (config.tiers.nvme.fsync && flush > 0) {
      out.commit_s = seconds_for(plan.nvme_write_bytes_per_step, flush);
    }
  }
  double io_s = std::max(out.nvme_optimizer_s, out.checksum_s);
  if (copies_cross_a_bus(config, profile)) {
    // The CPU optimizer reads device-homed gradients and state through pinned staging and sends
    // device-homed results back: another lane, overlapped like the NVMe one.
    std::uint64_t d2h = 0, h2d = 0;
    for (const StateRow& state : plan.states) {
      if (state.home != Tier::kDevice) continue;
      if (state.kind != StateKind::kParams) d2h += scaled(state.bytes_per_rank, on_cpu);
      if (state.kind != StateKind::kGrads) h2d += scaled(state.bytes_per_rank, on_cpu);
    }
    io_s = std::max(io_s, seconds_for(d2h, *profile.d2h_gb_per_s * 1e3) +
                              seconds_for(h2d, *profile.h2d_gb_per_s * 1e3));
  }
  if (io_s == 0) {
    out.optimizer_s = out.adam_s;
  } else if (config.zero.buffer_count <= 2) {
    out.optimizer_s = io_s + out.adam_s;  // no read ahead: each sub-group waits for its read
  } else {
    out.optimizer_s = std::max(io_s, out.adam_s) +
                      std::min(io_s, out.adam_s) / static_cast<double>(out.sub_groups);
  }
  // Each streamed sub-group's hand-offs sit on the critical path, whichever lane is the longer.
  if (io != nullptr) {
    out.overhead_s = static_cast<double>(out.sub_groups) * profile.sub_group_overhead_s;
  }
  out.optimizer_s += out.overhead_s + out.commit_s;  // the commit: after the last write
}

}  // namespace

const IoPoint& nearest_io_point(const MachineProfile& profile, const NvmeTierConfig& nvme) {
  STRATA_ASSERT(!profile.io.empty());
  const IoPoint* best = &profile.io.front();
  double best_distance = std::numeric_limits<double>::infinity();
  for (const IoPoint& point : profile.io) {
    const double distance =
        log2_distance(static_cast<double>(point.block_bytes), static_cast<double>(nvme.block_size)) +
        log2_distance(point.queue_depth, nvme.queue_depth) + log2_distance(point.rings, nvme.rings);
    if (distance < best_distance) {
      best_distance = distance;
      best = &point;
    }
  }
  return *best;
}

double flush_mb_per_s(const MachineProfile& profile) {
  std::vector<double> rates;
  for (const IoPoint& point : profile.io) {
    if (point.flush_mb_per_s > 0) rates.push_back(point.flush_mb_per_s);
  }
  if (rates.empty()) return 0;
  std::sort(rates.begin(), rates.end());
  const std::size_t n = rates.size();
  return n % 2 == 1 ? rates[n / 2] : (rates[n / 2 - 1] + rates[n / 2]) / 2;
}

AdamUpdate adam_update(const Config& config) {
  return {config.optimizer.master_dtype, config.optimizer.state_dtype,
          config.optimizer.master_rounding == MasterRounding::kKahan &&
              config.optimizer.master_dtype == cpu_adam::StateDType::kBf16};
}

std::string describe_adam_update(const AdamUpdate& update) {
  if (!update.compressed()) return "cpu_adam::step (fp32 master and moments)";
  return fmt::format("cpu_adam::step_compressed ({} master{}, {} moments)",
                     cpu_adam::state_dtype_name(update.master_dtype),
                     update.kahan ? " + Kahan compensation" : "",
                     cpu_adam::state_dtype_name(update.state_dtype));
}

double adam_params_per_s(const MachineProfile& profile, std::uint32_t threads,
                         const AdamUpdate& update) {
  const AdamPoint* best = nullptr;
  for (const AdamPoint& point : profile.adam) {
    if (point.update != update) continue;
    const bool better =
        best == nullptr ||
        (threads == 0
             ? point.params_per_s > best->params_per_s
             : log2_distance(point.threads, threads) < log2_distance(best->threads, threads));
    if (better) best = &point;
  }
  return best != nullptr ? best->params_per_s : 0;
}

StepPrediction predict_step(const Config& config, const PlanInputs& inputs,
                            const MachineProfile& profile) {
  StepPrediction out;
  out.plan = make_memory_plan_unsuggested(config, inputs);
  const bool any_nvme = out.plan.nvme_read_bytes_per_step + out.plan.nvme_write_bytes_per_step > 0;
  const IoPoint* io = any_nvme && !profile.io.empty() ? &nearest_io_point(profile, config.tiers.nvme) : nullptr;
  if (any_nvme && io == nullptr) {
    // NVMe-homed state on a machine whose drives were not measured: it cannot be predicted.
    out.step_s = std::numeric_limits<double>::infinity();
    return out;
  }
  plan_sub_groups(config, profile, out.plan, io, out);
  predict_forward_backward(config, profile, io, out);
  predict_optimizer(config, profile, io, out);
  out.step_s = out.forward_backward_s + out.optimizer_s;
  return out;
}

EngineIoFit fit_engine_io_scale(const Config& config, const PlanInputs& inputs,
                                MachineProfile profile, double optimizer_s) {
  constexpr double kLowest = 1.0 / 8;
  constexpr double kHighest = 8;
  const auto predicted_at = [&](double scale) {
    profile.engine_io_scale = scale;
    return predict_step(config, inputs, profile).optimizer_s;
  };
  // The prediction falls as the scale rises, until another lane (checksums, Adam) is the longer.
  if (predicted_at(kLowest) <= optimizer_s) return {kLowest, true};
  if (predicted_at(kHighest) >= optimizer_s) return {kHighest, true};
  double low = kLowest;
  double high = kHighest;
  for (int i = 0; i < 60; ++i) {
    const double mid = std::sqrt(low * high);
    (predicted_at(mid) > optimizer_s ? low : high) = mid;
  }
  return {std::sqrt(low * high), false};
}

}  // namespace strata::runtime::tune
