// The optimizer step: global gradient norm and overflow check first (from values accumulated as
// the gradients arrived), then every (unit, sub-group) through the CPU optimizer. State homed on
// NVMe streams through `buffer_count` pinned buffers: the reads of the next sub-groups, Adam on
// this one and the writes of the previous ones overlap. One commit of the NVMe store ends the step.
#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "base/assert.hpp"
#include "cpu_adam/cast.hpp"
#include "cpu_adam/optimizer.hpp"
#include "runtime/engine_state.hpp"
#include "runtime/lr_schedule.hpp"

namespace strata::runtime::detail {
namespace {

cpu_adam::Algorithm algorithm_of(OptimizerType type) {
  switch (type) {
    case OptimizerType::kAdamW:
      return cpu_adam::Algorithm::kAdamW;
    case OptimizerType::kAdam:
      return cpu_adam::Algorithm::kAdam;
    case OptimizerType::kAdagrad:
      return cpu_adam::Algorithm::kAdagrad;
    case OptimizerType::kLion:
      return cpu_adam::Algorithm::kLion;
  }
  return cpu_adam::Algorithm::kAdamW;
}

// Elements [begin, begin + numel) of every span in `spans`.
cpu_adam::ParamSpans slice(const cpu_adam::ParamSpans& spans, std::uint64_t begin,
                           std::uint64_t numel) {
  cpu_adam::ParamSpans part;
  part.master = spans.master.subspan(begin, numel);
  if (!spans.exp_avg.empty()) part.exp_avg = spans.exp_avg.subspan(begin, numel);
  if (!spans.exp_avg_sq.empty()) part.exp_avg_sq = spans.exp_avg_sq.subspan(begin, numel);
  const cpu_adam::Dtype grad_dtype = spans.grad.dtype;
  part.grad = cpu_adam::ConstTypedSpan(
      static_cast<const std::byte*>(spans.grad.data) + begin * cpu_adam::dtype_bytes(grad_dtype),
      numel, grad_dtype);
  if (spans.param_out.present()) {
    const cpu_adam::Dtype out_dtype = spans.param_out.dtype;
    part.param_out = cpu_adam::TypedSpan(
        static_cast<std::byte*>(spans.param_out.data) + begin * cpu_adam::dtype_bytes(out_dtype),
        numel, out_dtype);
  }
  return part;
}

struct WorkItem {
  UnitId unit;
  std::size_t group;
};

}  // namespace

void EngineState::optimizer_step(StepStats& stats) {
  const auto step_start = std::chrono::steady_clock::now();
  const double io_wait_at_start = io_wait_s;
  const std::uint64_t read_at_start = store ? store->bytes_read() : 0;
  const std::uint64_t written_at_start = store ? store->bytes_written() : 0;
  residency->end_iteration();  // the gathers so far are one iteration of the schedule

  // 1. Global norm: this rank's sum of squares, then every rank's, added in rank order.
  double sum_of_squares = norm.sum_of_squares();
  if (ranks > 1) {
    std::vector<double> all(ranks);
    all_gather_host(
        comm::ConstBuffer{&sum_of_squares, sizeof(double), comm::DataType::kUint8},
        comm::MutableBuffer{all.data(), sizeof(double) * ranks, comm::DataType::kUint8});
    sum_of_squares = 0;
    for (double value : all) sum_of_squares += value;
  }
  norm.reset();
  // The schedule is a function of the step alone, so a resumed run continues it.
  stats.lr = scheduled_lr(config.optimizer, step_count + 1);
  const bool non_finite = !std::isfinite(sum_of_squares);
  const double grad_norm = std::sqrt(sum_of_squares) / loss_scale;
  stats.grad_norm = grad_norm;
  const bool fp16 =
      config.precision.params == DType::kFp16 || config.precision.grads == DType::kFp16;

  for (UnitState& unit : units) unit.grad_calls = 0;
  if (non_finite) {
    // fp16 overflow (or a bad gradient): skip the update, lower the scale.
    stats.skipped = true;
    if (fp16 && config.precision.dynamic_loss_scale) {
      loss_scale = std::max(loss_scale / 2, config.precision.min_loss_scale);
    }
    clean_steps = 0;
    stats.step = step_count;
    stats.loss_scale = loss_scale;
    stats.step_s = seconds_since(step_start);
    return;
  }
  const double clip = config.optimizer.grad_clip > 0
                          ? cpu_adam::clip_coefficient(grad_norm, config.optimizer.grad_clip)
                          : 1.0;

  cpu_adam::Hyperparams hyper;
  hyper.algorithm = algorithm_of(config.optimizer.type);
  hyper.lr = stats.lr;
  hyper.beta1 = config.optimizer.beta1;
  hyper.beta2 = config.optimizer.beta2;
  hyper.eps = config.optimizer.eps;
  hyper.weight_decay = config.optimizer.weight_decay;
  hyper.bias_correction = config.optimizer.bias_correction ? cpu_adam::BiasCorrection::kOn
                                                           : cpu_adam::BiasCorrection::kOff;
  hyper.step = static_cast<std::int64_t>(step_count + 1);
  cpu_adam::GradScaling scaling;
  scaling.loss_scale = loss_scale;
  scaling.clip_coef = clip;
  cpu_adam::validate(hyper, scaling);

  // The gradient-staging writes of the backward pass must land before the optimizer reads them.
  for (auto& writes : grad_buffer_writes) {
    for (io::Ticket& ticket : writes) wait_timed(ticket);
    writes.clear();
  }

  std::vector<WorkItem> items;
  for (UnitId u = 0; u < units.size(); ++u) {
    for (std::size_t g = 0; g < units[u].groups.size(); ++g) items.push_back({u, g});
  }
  const std::size_t buffers = pipeline_buffers.size();
  std::vector<std::vector<tiers::StoreRead>> reads(items.size());
  std::vector<std::vector<io::Ticket>> writes(std::max<std::size_t>(buffers, 1));
  const std::array<Kind, 4> read_kinds = {Kind::kMaster, Kind::kExpAvg, Kind::kExpAvgSq,
                                          Kind::kGrad};
  const std::array<Kind, 4> write_kinds = {Kind::kMaster, Kind::kExpAvg, Kind::kExpAvgSq,
                                           Kind::kParam16};

  // Where `kind` of item i lives during its update: in memory, in the device staging (device
  // memory the CPU does not address: stage_in / stage_out), or in its pipeline buffer.
  const auto location = [&](std::size_t i, Kind kind) -> std::byte* {
    UnitState& unit = units[items[i].unit];
    ShardHome& home = unit.home(kind);
    const SubGroup& sub = unit.groups[items[i].group];
    if (home.memory != nullptr) return home.at(sub.begin);
    if (home.staged_on_device()) return device_staging_at(kind, i % 2);
    return pipeline_buffers[i % buffers].data() + pipeline_offsets[static_cast<std::size_t>(kind)];
  };
  const auto issue_reads = [&](std::size_t i) {
    if (buffers == 0) return;
    // The buffer's previous item must be written out before it is refilled.
    for (io::Ticket& ticket : writes[i % buffers]) wait_timed(ticket);
    writes[i % buffers].clear();
    UnitState& unit = units[items[i].unit];
    const SubGroup& sub = unit.groups[items[i].group];
    for (Kind kind : read_kinds) {
      if (!unit.has(kind) || unit.home(kind).tier != Tier::kNvme) continue;
      ShardHome& home = unit.home(kind);
      reads[i].push_back(
          store->read(home.extents[items[i].group],
                      std::span(location(i, kind), sub.numel * home.element_bytes())));
    }
  };

  double adam_s = 0;
  std::size_t next_read = 0;
  const std::size_t lookahead = buffers >= 2 ? buffers - 2 : 0;  // one buffer computes, one drains
  for (std::size_t i = 0; i < items.size(); ++i) {
    while (next_read < items.size() && next_read <= i + lookahead) issue_reads(next_read++);
    for (tiers::StoreRead& read : reads[i]) wait_timed(read);
    reads[i].clear();

    UnitState& unit = units[items[i].unit];
    // Device-homed state: this sub-group's d2h was issued a sub-group ago; the next one's starts
    // now, into the other slot, and overlaps Adam on this one.
    if (i == 0) stage_in(unit, items[i].group, 0, read_kinds);
    wait_staged_in(i % 2);
    if (i + 1 < items.size()) {
      stage_in(units[items[i + 1].unit], items[i + 1].group, (i + 1) % 2, read_kinds);
    }
    const SubGroup& sub = unit.groups[items[i].group];
    cpu_adam::ParamSpans spans;
    spans.master = {reinterpret_cast<float*>(location(i, Kind::kMaster)), sub.numel};
    if (unit.has(Kind::kExpAvg)) {
      spans.exp_avg = {reinterpret_cast<float*>(location(i, Kind::kExpAvg)), sub.numel};
    }
    if (unit.has(Kind::kExpAvgSq)) {
      spans.exp_avg_sq = {reinterpret_cast<float*>(location(i, Kind::kExpAvgSq)), sub.numel};
    }
    spans.grad =
        cpu_adam::ConstTypedSpan(location(i, Kind::kGrad), sub.numel, unit.home(Kind::kGrad).dtype);
    std::byte* param_out = location(i, Kind::kParam16);
    if (param_dtype != cpu_adam::Dtype::kFp32) {
      spans.param_out = cpu_adam::TypedSpan(param_out, sub.numel, param_dtype);
    }
    const auto adam_start = std::chrono::steady_clock::now();
    Tracer::Scope scope(options.tracer, TraceTrack::kOptimizer,
                        fmt::format("adam {} [{}]", unit.spec.name, items[i].group));
    if (options.optimizer_compute == EngineOptions::OptimizerCompute::kRun) {
      if (hyper.weight_decay == 0) {
        cpu_adam::step(hyper, spans, scaling, *arena);
      } else {
        // Weight decay per tensor: one call per run of tensors that agree on it. The update is
        // element-wise, so cutting the sub-group changes no bits.
        for_each_decay_run(unit.spec, unit.layout, unit.layout.shard_begin(rank) + sub.begin,
                           sub.numel, [&](const DecayRun& run) {
                             cpu_adam::Hyperparams run_hyper = hyper;
                             if (!run.weight_decay) run_hyper.weight_decay = 0;
                             cpu_adam::step(run_hyper, slice(spans, run.begin, run.numel), scaling,
                                            *arena);
                           });
      }
    }
    if (param_dtype == cpu_adam::Dtype::kFp32) {
      std::memcpy(param_out, spans.master.data(), sub.numel * sizeof(float));
    }
    adam_s += seconds_since(adam_start);
    stage_out(unit, items[i].group, i % 2, write_kinds);

    if (buffers == 0) continue;
    for (Kind kind : write_kinds) {
      if (!unit.has(kind) || unit.home(kind).tier != Tier::kNvme) continue;
      ShardHome& home = unit.home(kind);
      writes[i % buffers].push_back(store->write(
          home.extents[items[i].group],
          std::span<const std::byte>(location(i, kind), sub.numel * home.element_bytes())));
    }
  }
  for (auto& buffer_writes : writes) {
    for (io::Ticket& ticket : buffer_writes) wait_timed(ticket);
  }
  finish_staging();

  ++step_count;
  if (store) store->commit(step_count);
  // The gathered copies hold the old parameters.
  residency->invalidate();
  if (fp16 && config.precision.dynamic_loss_scale &&
      ++clean_steps >= config.precision.loss_scale_window) {
    loss_scale *= 2;
    clean_steps = 0;
  }

  stats.step = step_count;
  stats.loss_scale = loss_scale;
  stats.adam_s = adam_s;
  stats.io_wait_s = io_wait_s - io_wait_at_start;
  io_wait_s = 0;
  if (store) {
    stats.nvme.read_bytes = store->bytes_read() - nvme_read_mark;
    stats.nvme.written_bytes = store->bytes_written() - nvme_written_mark;
    stats.nvme_in_step.read_bytes = store->bytes_read() - read_at_start;
    stats.nvme_in_step.written_bytes = store->bytes_written() - written_at_start;
    nvme_read_mark = store->bytes_read();
    nvme_written_mark = store->bytes_written();
  }
  stats.comm_bytes = comm->stats().total_payload_bytes();
  comm->reset_stats();
  stats.step_s = seconds_since(step_start);
}

}  // namespace strata::runtime::detail
