// The optimizer step: the contracts checked, the global gradient norm and overflow check (from
// values accumulated as the gradients arrived), then every (unit, sub-group) through the CPU
// optimizer. State homed on NVMe streams through `buffer_count` pinned buffers: the reads of the
// next sub-groups, Adam on this one and the writes of the previous ones overlap. Device-homed
// state on the staged path goes through two pinned slots (device_lanes.cpp). One commit of the
// NVMe store ends the step.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <utility>

#include <fmt/format.h>

#include "base/assert.hpp"
#include "cpu_adam/cast.hpp"
#include "cpu_adam/compressed_step.hpp"
#include "cpu_adam/optimizer.hpp"
#include "runtime/engine/engine_state.hpp"
#include "runtime/config/lr_schedule.hpp"
#include "runtime/config/unit_hyperparams.hpp"

namespace strata::runtime::detail {
namespace {

constexpr auto& kReadKinds = kUpdateReadKinds;
constexpr auto& kWriteKinds = kUpdateWriteKinds;

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

cpu_adam::Hyperparams hyperparams_of(const OptimizerConfig& optimizer, double lr,
                                     std::uint64_t step) {
  cpu_adam::Hyperparams hyper;
  hyper.algorithm = algorithm_of(optimizer.type);
  hyper.lr = lr;
  hyper.beta1 = optimizer.beta1;
  hyper.beta2 = optimizer.beta2;
  hyper.eps = optimizer.eps;
  hyper.weight_decay = optimizer.weight_decay;
  hyper.bias_correction = optimizer.bias_correction ? cpu_adam::BiasCorrection::kOn
                                                    : cpu_adam::BiasCorrection::kOff;
  hyper.step = static_cast<std::int64_t>(step);
  return hyper;
}

// Elements [begin, begin + numel) of every span in `spans`.
cpu_adam::ParamSpans slice(const cpu_adam::ParamSpans& spans, std::uint64_t begin,
                           std::uint64_t numel) {
  cpu_adam::ParamSpans part;
  part.master = spans.master.subspan(begin, numel);
  if (!spans.exp_avg.empty()) part.exp_avg = spans.exp_avg.subspan(begin, numel);
  if (!spans.exp_avg_sq.empty()) part.exp_avg_sq = spans.exp_avg_sq.subspan(begin, numel);
  const DType grad_dtype = spans.grad.dtype;
  part.grad = cpu_adam::ConstTypedSpan(
      static_cast<const std::byte*>(spans.grad.data) + begin * dtype_bytes(grad_dtype),
      numel, grad_dtype);
  if (spans.param_out.present()) {
    const DType out_dtype = spans.param_out.dtype;
    part.param_out = cpu_adam::TypedSpan(
        static_cast<std::byte*>(spans.param_out.data) + begin * dtype_bytes(out_dtype),
        numel, out_dtype);
  }
  return part;
}

}  // namespace

// Where the step started: its statistics are differences from these.
struct EngineState::StepMarks {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double io_wait_s = 0;
  std::uint64_t read_bytes = 0;
  std::uint64_t written_bytes = 0;
};

// Every (unit, sub-group) of the step in order, and the NVMe I/O of each through its pipeline
// buffer (item i uses buffer i % buffer_count, and device staging slot i % 2).
class EngineState::OptimizerPipeline {
 public:
  // Every sub-group of `units`, in order.
  OptimizerPipeline(EngineState& engine, std::span<const UnitId> units) : engine_(engine) {
    for (UnitId u : units) {
      for (std::size_t g = 0; g < engine.units_[u].groups.size(); ++g) items_.push_back({u, g});
    }
    buffers_ = engine.pipeline_buffers_.size();
    reads_.resize(items_.size());
    read_issued_.resize(items_.size());
    pre_read_.resize(items_.size());
    writes_.resize(std::max<std::size_t>(buffers_, 1));
  }
  OptimizerPipeline(const OptimizerPipeline&) = delete;
  OptimizerPipeline& operator=(const OptimizerPipeline&) = delete;
  // A step that failed (an I/O error, a checksum mismatch) leaves reads and writes in flight into
  // the pipeline buffers: they must land, and be hashed, before anything frees those buffers.
  ~OptimizerPipeline() {
    for (auto& item_reads : reads_) {
      for (tiers::StoreRead& read : item_reads) {
        try {
          read.wait();
        } catch (...) {  // the step's failure is already on its way
        }
      }
    }
    for (auto& buffer_writes : writes_) {
      for (io::Ticket& ticket : buffer_writes) ticket.wait();
    }
  }
  std::size_t size() const { return items_.size(); }
  // Reads run ahead of the update by this many items: one buffer computes, one drains.
  std::size_t lookahead() const { return buffers_ >= 2 ? buffers_ - 2 : 0; }
  UnitState& unit(std::size_t i) const { return engine_.units_[items_[i].unit]; }
  UnitId unit_id(std::size_t i) const { return items_[i].unit; }
  std::size_t group(std::size_t i) const { return items_[i].group; }

  // Takes over the reads start_pre_reads issued for the first items (the same items, in the same
  // buffers); one that does not match (none should) is waited for and dropped. Returns how many
  // items it adopted.
  std::size_t adopt(std::vector<PreRead>& pre_reads) {
    std::size_t adopted = 0;
    for (PreRead& pre : pre_reads) {
      const std::size_t i = pre.item;
      if (i < items_.size() && items_[i].unit == pre.unit && items_[i].group == pre.group &&
          !pre_read_[i]) {
        reads_[i] = std::move(pre.reads);
        read_issued_[i] = pre.issued;
        pre_read_[i] = true;
        ++adopted;
        continue;
      }
      for (tiers::StoreRead& read : pre.reads) {
        try {
          read.wait();
        } catch (...) {  // this pipeline reads the item itself
        }
      }
    }
    pre_reads.clear();
    return adopted;
  }

  // Where `kind` of item i lives during its update.
  std::byte* location(std::size_t i, Kind kind) const {
    GroupStaging staging;
    if (engine_.device_staging_) staging.device = engine_.device_staging_at(kind, i % 2);
    if (buffers_ > 0) staging.nvme = engine_.pipeline_slot(i, kind);
    return engine_.window(unit(i), kind, group(i), staging);
  }

  // Where the update writes the parameters of item i (none when they are the master's bytes).
  std::byte* param_out(std::size_t i) const {
    return unit(i).has(Kind::kParam) ? location(i, Kind::kParam) : nullptr;
  }
  // Where item i's new parameters are once it is updated, when they go to NVMe (param_out, or
  // the master's bytes); null otherwise.
  const std::byte* updated_params(std::size_t i) const {
    const Kind kind = unit(i).params_in_master ? Kind::kMaster : Kind::kParam;
    return on_nvme(i, kind) ? location(i, kind) : nullptr;
  }

  cpu_adam::ParamSpans spans(std::size_t i) const {
    UnitState& u = unit(i);
    const std::uint64_t numel = u.groups[group(i)].numel;
    cpu_adam::ParamSpans spans;
    spans.master = {reinterpret_cast<float*>(location(i, Kind::kMaster)), numel};
    if (u.has(Kind::kExpAvg)) {
      spans.exp_avg = {reinterpret_cast<float*>(location(i, Kind::kExpAvg)), numel};
    }
    if (u.has(Kind::kExpAvgSq)) {
      spans.exp_avg_sq = {reinterpret_cast<float*>(location(i, Kind::kExpAvgSq)), numel};
    }
    spans.grad =
        cpu_adam::ConstTypedSpan(location(i, Kind::kGrad), numel, u.home(Kind::kGrad).dtype);
    const DType param_dtype = engine_.param_dtype();
    if (param_dtype != DType::kFp32) {
      spans.param_out = cpu_adam::TypedSpan(param_out(i), numel, param_dtype);
    }
    return spans;
  }

  // The same item in the formats of cpu_adam/state_format.hpp ([optimizer] state_dtype,
  // master_dtype other than fp32).
  cpu_adam::CompressedSpans compressed_spans(std::size_t i) const {
    UnitState& u = unit(i);
    cpu_adam::CompressedSpans spans;
    spans.numel = u.groups[group(i)].numel;
    spans.master_dtype = u.home(Kind::kMaster).state_dtype();
    spans.master = location(i, Kind::kMaster);
    if (u.has(Kind::kCompensation)) spans.compensation = location(i, Kind::kCompensation);
    if (u.has(Kind::kExpAvg)) {
      spans.moment_dtype = u.home(Kind::kExpAvg).state_dtype();
      spans.exp_avg = location(i, Kind::kExpAvg);
    }
    if (u.has(Kind::kExpAvgSq)) {
      spans.moment_dtype = u.home(Kind::kExpAvgSq).state_dtype();
      spans.exp_avg_sq = location(i, Kind::kExpAvgSq);
    }
    spans.grad =
        cpu_adam::ConstTypedSpan(location(i, Kind::kGrad), spans.numel, u.home(Kind::kGrad).dtype);
    // Parameters in the master's home: the rounded master is the parameters, nothing to write.
    const DType param_dtype = engine_.param_dtype();
    if (param_dtype != DType::kFp32 && u.has(Kind::kParam)) {
      spans.param_out = cpu_adam::TypedSpan(param_out(i), spans.numel, param_dtype);
    }
    return spans;
  }

  void issue_reads(std::size_t i) {
    if (buffers_ == 0) return;
    // The buffer's previous item must be written out before it is refilled.
    for (io::Ticket& ticket : writes_[i % buffers_]) engine_.wait_timed(ticket);
    writes_[i % buffers_].clear();
    // An item read before step() lacks only its gradient, and its trace starts at the pre-read.
    if (!pre_read_[i]) read_issued_[i] = std::chrono::steady_clock::now();
    for (Kind kind : kReadKinds) {
      if (!on_nvme(i, kind) || (pre_read_[i] && kind != Kind::kGrad)) continue;
      const ShardHome& home = unit(i).home(kind);
      const std::lock_guard lock(engine_.store_mutex_);
      reads_[i].push_back(engine_.store_->read(
          home.extents[group(i)], std::span(location(i, kind), home.bytes(numel(i))),
          fixed_buffer(i)));
    }
  }
  // The trace shows each item's reads from issue to use ("NVMe read ..." on the I/O track), so
  // the timeline, and the test that reads it, see them in flight under Adam on earlier items.
  void wait_reads(std::size_t i) {
    if (reads_[i].empty()) return;
    for (tiers::StoreRead& read : reads_[i]) engine_.wait_timed(read);
    reads_[i].clear();
    if (Tracer* tracer = engine_.options_.tracer) {
      tracer->record(TraceTrack::kIo, fmt::format("NVMe read {} [{}]", unit(i).spec.name, group(i)),
                     read_issued_[i], std::chrono::steady_clock::now());
    }
  }
  void issue_writes(std::size_t i) {
    if (buffers_ == 0) return;
    for (Kind kind : kWriteKinds) {
      if (!on_nvme(i, kind)) continue;
      const ShardHome& home = unit(i).home(kind);
      const std::lock_guard lock(engine_.store_mutex_);
      writes_[i % buffers_].push_back(engine_.store_->write(
          home.extents[group(i)],
          std::span<const std::byte>(location(i, kind), home.bytes(numel(i))),
          fixed_buffer(i)));
    }
  }
  void drain() {
    for (auto& buffer_writes : writes_) {
      for (io::Ticket& ticket : buffer_writes) engine_.wait_timed(ticket);
    }
  }

 private:
  struct Item {
    UnitId unit;
    std::size_t group;
  };
  bool on_nvme(std::size_t i, Kind kind) const {
    return unit(i).has(kind) && unit(i).home(kind).residence() == Residence::kNvme;
  }
  std::uint64_t numel(std::size_t i) const { return unit(i).groups[group(i)].numel; }
  std::optional<std::uint32_t> fixed_buffer(std::size_t i) const {
    return engine_.pipeline_fixed_buffer(i);
  }

  EngineState& engine_;
  std::vector<Item> items_;
  std::size_t buffers_ = 0;
  std::vector<std::vector<tiers::StoreRead>> reads_;
  std::vector<std::chrono::steady_clock::time_point> read_issued_;
  std::vector<bool> pre_read_;  // its state reads started before step() (adopt)
  std::vector<std::vector<io::Ticket>> writes_;
};

std::byte* EngineState::pipeline_slot(std::size_t item, Kind kind) const {
  return pipeline_buffers_[item % pipeline_buffers_.size()].data() +
         plan_.pipeline_offsets[static_cast<std::size_t>(kind)];
}

// Pipeline buffer b is the engine's fixed buffer b (lend_staging_to_io), when registered.
std::optional<std::uint32_t> EngineState::pipeline_fixed_buffer(std::size_t item) const {
  if (io_engine_->options().fixed_buffers.empty()) return std::nullopt;
  return static_cast<std::uint32_t>(item % pipeline_buffers_.size());
}

void EngineState::start_pre_reads() {
  pre_reads_tried_ = true;
  if (!store_ || pipeline_buffers_.empty()) return;
  // A step that may speculate lends the pipeline buffers to the worker during the backward.
  if (worker_ && config_.zero.overlap_optimizer && !last_step_clipped_) return;
  // The pipeline's first reads: items 0 .. lookahead (buffer_count - 2), at least one.
  const std::size_t buffers = pipeline_buffers_.size();
  const std::size_t count = buffers >= 2 ? buffers - 1 : 1;
  const auto now = std::chrono::steady_clock::now();
  std::size_t item = 0;
  for (UnitId id = 0; id < units_.size() && item < count; ++id) {
    UnitState& unit = units_[id];
    if (updates_on_device(unit)) continue;  // not in the CPU's pipeline (update_remaining)
    for (std::size_t g = 0; g < unit.groups.size() && item < count; ++g, ++item) {
      PreRead pre{item, id, g, {}, now};
      for (Kind kind : kReadKinds) {
        if (kind == Kind::kGrad || !unit.has(kind) ||
            unit.home(kind).residence() != Residence::kNvme) {
          continue;
        }
        const ShardHome& home = unit.home(kind);
        const std::lock_guard lock(store_mutex_);
        pre.reads.push_back(store_->read(
            home.extents[g], std::span(pipeline_slot(item, kind), home.bytes(unit.groups[g].numel)),
            pipeline_fixed_buffer(item)));
      }
      if (!pre.reads.empty()) pre_reads_.push_back(std::move(pre));
    }
  }
}

void EngineState::drop_pre_reads(std::vector<PreRead>& pre_reads) {
  for (PreRead& pre : pre_reads) {
    for (tiers::StoreRead& read : pre.reads) {
      try {
        read.wait();
      } catch (...) {  // whoever reads the state next reads it again and reports the error
      }
    }
  }
  pre_reads.clear();
}

void EngineState::discard_pre_reads() {
  drop_pre_reads(pre_reads_);
  pre_reads_tried_ = false;  // state replaced mid-backward: the next gradient reads it afresh
}

std::uint64_t EngineState::hand_pre_reads_to_deferred() {
  // The last step's deferred pipeline took its own when complete_deferred ran it at this step's
  // start; one that failed first may have left them (the worker is idle now).
  drop_pre_reads(deferred_pre_reads_);
  const std::uint64_t count = pre_reads_.size();
  deferred_pre_reads_ = std::move(pre_reads_);
  pre_reads_.clear();
  return count;
}

void EngineState::optimizer_step(StepStats& stats) {
  STRATA_ASSERT(finalized_, "step before finalize");
  check_step_contracts();
  finish_grad_moves();  // the last gradients the backward handed over (staged path)
  complete_deferred();  // the last step's updates a forward did not gather (none, usually)
  const auto start = std::chrono::steady_clock::now();
  // The updates started during the backward (speculation.cpp) end before anything is decided
  // (and before the store's counters are read: the worker moves them until then).
  const double speculated_adam_s = finish_speculation();
  pre_reads_tried_ = false;  // the next backward decides again
  const StepMarks marks{start, io_wait_s_.load(), store_ ? store_->bytes_read() : 0,
                        store_ ? store_->bytes_written() : 0};

  const double sum_of_squares = global_sum_of_squares();
  // The schedule is a function of the step alone, so a resumed run continues it.
  stats.lr = scheduled_lr(config_.optimizer, progress_.step + 1);
  const double grad_norm = std::sqrt(sum_of_squares) / progress_.loss_scale;
  stats.grad_norm = grad_norm;
  for (UnitState& unit : units_) unit.grad_calls = 0;
  last_step_clipped_ = true;  // until the step turns out unclipped (speculation.cpp)
  if (!std::isfinite(sum_of_squares)) {
    discard_pre_reads();
    settle_speculation(nullptr, stats);  // every speculated update undone
    residency_->end_iteration();
    skip_step(stats);
    stats.step_s = seconds_since(marks.start);
    return;
  }

  const double clip = config_.optimizer.grad_clip > 0
                          ? cpu_adam::clip_coefficient(grad_norm, config_.optimizer.grad_clip)
                          : 1.0;
  const cpu_adam::Hyperparams hyper = next_step_hyperparams();
  cpu_adam::GradScaling scaling;
  scaling.loss_scale = progress_.loss_scale;
  scaling.clip_coef = clip;
  cpu_adam::validate(hyper, scaling);
  last_step_clipped_ = clip < 1.0;

  drain_backward_writes();
  const SpeculationCheck check{hyper, scaling};
  const std::vector<UnitId> remaining = settle_speculation(&check, stats);
  // Every gathered copy holds parameters from before the step. The gathers so far are one
  // iteration of the schedule, whose end prefetches the next iteration's first units: with the
  // overlap on, now, so their reads (units updated during the backward) run under the updates,
  // and a unit still to be updated takes its new parameters from the pipeline instead of reading
  // back what the step writes; serially, after the updates.
  residency_->invalidate();
  stats.adam_s = speculated_adam_s;
  update_remaining(remaining, hyper, scaling, stats);
  finish_step(stats, marks);
}

// The updates the speculation left: deferred to the next forward ([zero] defer_update), else
// run now; with [zero] overlap_optimizer the iteration's end (the next iteration's first
// prefetches) comes before them, so those reads run under the updates.
void EngineState::update_remaining(const std::vector<UnitId>& remaining,
                                   const cpu_adam::Hyperparams& hyper,
                                   const cpu_adam::GradScaling& scaling, StepStats& stats) {
  // Units the device updates in place (state homed on the GPU, [zero] optimizer_device_fraction)
  // take a few milliseconds there: first, in a pipeline of their own, never deferred. The CPU's
  // pipeline, and the state reads start_pre_reads began for it, number the other units alone.
  std::vector<UnitId> on_device;
  std::vector<UnitId> on_cpu;
  for (UnitId id : remaining) (updates_on_device(units_[id]) ? on_device : on_cpu).push_back(id);
  if (!on_device.empty()) {
    stats.adam_s += run_pipeline(lanes_.get(), on_device, scaling, [&](UnitId unit) {
      return unit_step_hyper(units_[unit], hyper);
    });
  }
  if (defers()) {
    // [zero] defer_update: the rest runs when the next forward gathers each unit
    // (deferred_update.cpp), the first of them from this prefetch on, as one batch: the pipeline
    // whose first items the backward's reads were made for (every unit is deferred after a step
    // that read ahead: it did not speculate).
    defer_updates(on_cpu, hyper, scaling, stats);
    stats.pre_read_groups = hand_pre_reads_to_deferred();
    const CollectedStarts one_batch(*this);
    residency_->end_iteration();
  } else {
    const bool hand_over = config_.zero.overlap_optimizer;
    if (hand_over) {
      update_due_.assign(units_.size(), 0);
      for (UnitId id : on_cpu) update_due_[id] = 1;
      residency_->end_iteration();
    }
    stats.adam_s += run_optimizer(on_cpu, hyper, scaling);
    stats.pre_read_groups = std::exchange(pre_read_groups_, 0);
    update_due_.clear();
    if (!hand_over) residency_->end_iteration();
  }
}

cpu_adam::Hyperparams EngineState::next_step_hyperparams() const {
  return hyperparams_of(config_.optimizer, scheduled_lr(config_.optimizer, progress_.step + 1),
                        progress_.step + 1);
}

// A unit without overrides gets `hyper` itself (validated by the step); one with them, its own
// (validated by set_unit_hyperparams, and again by cpu_adam::step).
cpu_adam::Hyperparams EngineState::unit_step_hyper(const UnitState& unit,
                                                   const cpu_adam::Hyperparams& hyper) const {
  return unit.hyper.any() ? unit_step_hyperparams(hyper, unit.hyper, config_.optimizer,
                                                  static_cast<std::uint64_t>(hyper.step))
                          : hyper;
}

// This rank's sum of squares, then every rank's, added in rank order (the same on every rank).
double EngineState::global_sum_of_squares() {
  double sum_of_squares = norm_.sum_of_squares();
  if (norm_device_sum_) {
    // Every gradient is homed on the device and was summed there (store_grad_on_device); norm_
    // saw none of them, so the device's total is this rank's, bit for bit what norm_ would hold.
    STRATA_ASSERT(sum_of_squares == 0.0, "no gradient summed on the host beside the device");
    DeviceLanes& lane = *lanes_;
    lane.compute.record(lane.compute_done);
    lane.d2h.wait(lane.compute_done);
    lane.d2h.copy_to_host(norm_readback_.data(), norm_device_sum_.span());
    lane.d2h.record(lane.d2h_done);
    lane.d2h_done.wait();
    std::memcpy(&sum_of_squares, norm_readback_.data(), sizeof(double));
    lane.compute.wait(lane.d2h_done);  // the next step's first sum after the read
    lane.compute.fill_bytes(norm_device_sum_.span(), 0);
  }
  if (ranks_ > 1) {
    std::vector<double> all(ranks_);
    all_gather_host(
        comm::ConstBuffer{&sum_of_squares, sizeof(double), DType::kUint8},
        comm::MutableBuffer{all.data(), sizeof(double) * ranks_, DType::kUint8});
    sum_of_squares = 0;
    for (double value : all) sum_of_squares += value;
  }
  norm_.reset();
  return sum_of_squares;
}

// fp16 overflow (or a bad gradient): no update, a lower loss scale.
void EngineState::skip_step(StepStats& stats) {
  stats.skipped = true;
  if (uses_fp16(config_) && config_.precision.dynamic_loss_scale) {
    progress_.loss_scale = std::max(progress_.loss_scale / 2, config_.precision.min_loss_scale);
  }
  progress_.clean_steps = 0;
  stats.gathers_queued_ahead = ahead_.take_started_count();
  stats.grad_moves_queued = grad_moves_.take_queued_count();
  stats.deferred_wait_s = std::exchange(deferred_wait_s_, 0.0);
  stats.step = progress_.step;
  stats.loss_scale = progress_.loss_scale;
}

// The gradient-staging writes of the backward pass must land before the optimizer reads them.
void EngineState::drain_backward_writes() {
  for (auto& writes : grad_buffer_writes_) {
    for (io::Ticket& ticket : writes) wait_timed(ticket);
    writes.clear();
  }
}

// Every sub-group of `units` through the pipeline; returns the seconds spent in the CPU optimizer.
double EngineState::run_optimizer(std::span<const UnitId> units,
                                  const cpu_adam::Hyperparams& hyper,
                                  const cpu_adam::GradScaling& scaling) {
  return run_pipeline(
      lanes_.get(), units, scaling,
      [&](UnitId unit) { return unit_step_hyper(units_[unit], hyper); }, {},
      [&](UnitId unit, std::size_t group, const std::byte* params) {
        hand_fresh_params(unit, group, params);
      },
      &pre_reads_, &pre_read_groups_, [&](UnitId unit) { start_gather_once_updated(unit); });
}

double EngineState::run_pipeline(DeviceLanes* lanes, std::span<const UnitId> units,
                                 const cpu_adam::GradScaling& scaling,
                                 const std::function<cpu_adam::Hyperparams(UnitId)>& hyper_of,
                                 const std::function<void(UnitId, std::size_t)>& before_update,
                                 const AfterUpdate& after_update,
                                 std::vector<PreRead>* pre_reads, std::size_t* adopted,
                                 const std::function<void(UnitId)>& unit_done) {
  OptimizerPipeline pipeline(*this, units);
  if (pre_reads != nullptr) {
    const std::size_t taken = pipeline.adopt(*pre_reads);
    if (adopted != nullptr) *adopted += taken;
  }
  const std::size_t count = pipeline.size();
  double adam_s = 0;
  std::size_t next_read = 0;
  for (std::size_t i = 0; i < count; ++i) {
    while (next_read < count && next_read <= i + pipeline.lookahead()) {
      pipeline.issue_reads(next_read++);
    }
    pipeline.wait_reads(i);
    UnitState& unit = pipeline.unit(i);
    // Device-homed state: this sub-group's d2h was issued a sub-group ago; the next one's starts
    // now, into the other slot, and overlaps Adam on this one.
    if (i == 0) stage_in(lanes, unit, pipeline.group(i), 0, kReadKinds);
    wait_staged_in(lanes, i % 2);
    if (i + 1 < count) {
      stage_in(lanes, pipeline.unit(i + 1), pipeline.group(i + 1), (i + 1) % 2, kReadKinds);
    }
    if (before_update) before_update(pipeline.unit_id(i), pipeline.group(i));
    const auto adam_start = std::chrono::steady_clock::now();
    const cpu_adam::Hyperparams unit_hyper = hyper_of(pipeline.unit_id(i));
    if (updates_on_device(unit)) {
      STRATA_ASSERT(lanes == lanes_.get(), "a device update off the Engine's thread");
      update_on_device(unit, pipeline.group(i), unit_hyper, scaling);
    } else if (compressed_state(config_)) {
      update_compressed(unit, pipeline.group(i), pipeline.compressed_spans(i),
                        pipeline.param_out(i), unit_hyper, scaling);
    } else {
      update_sub_group(unit, pipeline.group(i), pipeline.spans(i), pipeline.param_out(i),
                       unit_hyper, scaling);
    }
    adam_s += seconds_since(adam_start);
    stage_out(lanes, unit, pipeline.group(i), i % 2, kWriteKinds);
    const bool unit_updated = pipeline.group(i) + 1 == unit.groups.size();
    if (unit_updated && lanes != nullptr && lanes != lanes_.get()) {
      // The worker's streams: the unit's new device state (every sub-group's h2d, in order on
      // one stream) has arrived before whoever waits for the unit reads it on the owner's streams.
      lanes->staged_out[i % 2].wait();
    }
    if (after_update) {
      after_update(pipeline.unit_id(i), pipeline.group(i), pipeline.updated_params(i));
    }
    pipeline.issue_writes(i);
    if (unit_done && unit_updated) unit_done(pipeline.unit_id(i));
  }
  pipeline.drain();
  finish_staging(lanes);
  return adam_s;
}

void EngineState::update_sub_group(UnitState& unit, std::size_t group,
                                   const cpu_adam::ParamSpans& spans, std::byte* param_out,
                                   const cpu_adam::Hyperparams& hyper,
                                   const cpu_adam::GradScaling& scaling) {
  const SubGroup& sub = unit.groups[group];
  Tracer::Scope scope(options_.tracer, TraceTrack::kOptimizer,
                      fmt::format("adam {} [{}]", unit.spec.name, group));
  if (options_.optimizer_compute == EngineOptions::OptimizerCompute::kRun) {
    if (hyper.weight_decay == 0) {
      cpu_adam::step(hyper, spans, scaling, *arena_);
    } else {
      // Weight decay per tensor: one call per run of tensors that agree on it. The update is
      // element-wise, so cutting the sub-group changes no bits.
      for_each_decay_run(unit.spec, unit.layout, unit.layout.shard_begin(rank_) + sub.begin,
                         sub.numel, [&](const DecayRun& run) {
                           cpu_adam::Hyperparams run_hyper = hyper;
                           if (!run.weight_decay) run_hyper.weight_decay = 0;
                           cpu_adam::step(run_hyper, slice(spans, run.begin, run.numel), scaling,
                                          *arena_);
                         });
    }
  }
  if (param_dtype() == DType::kFp32) {
    std::memcpy(param_out, spans.master.data(), sub.numel * sizeof(float));
  }
}

// update_sub_group for compressed state: one fused call over the whole sub-group (int8 blocks
// must not be cut), the weight-decay runs passed along.
void EngineState::update_compressed(UnitState& unit, std::size_t group,
                                    const cpu_adam::CompressedSpans& spans, std::byte* param_out,
                                    const cpu_adam::Hyperparams& hyper,
                                    const cpu_adam::GradScaling& scaling) {
  const SubGroup& sub = unit.groups[group];
  Tracer::Scope scope(options_.tracer, TraceTrack::kOptimizer,
                      fmt::format("adam {} [{}]", unit.spec.name, group));
  const std::uint64_t first = unit.layout.shard_begin(rank_) + sub.begin;
  if (options_.optimizer_compute == EngineOptions::OptimizerCompute::kRun) {
    decay_runs_.clear();
    if (hyper.weight_decay != 0) {
      for_each_decay_run(unit.spec, unit.layout, first, sub.numel, [&](const DecayRun& run) {
        decay_runs_.push_back({run.begin, run.numel, run.weight_decay});
      });
    }
    // Each unit draws its own rounding bits; elements are numbered within the unit, so the
    // bits do not depend on the rank count or on where the state lives.
    const cpu_adam::StochasticRounding rounding{
        config_.run.seed ^ (0x9E3779B97F4A7C15ull * (unit_index(unit) + 1)), first};
    cpu_adam::step_compressed(hyper, spans, scaling, rounding, decay_runs_, *arena_);
  }
  if (param_dtype() == DType::kFp32) {
    cpu_adam::convert(cpu_adam::ConstTypedSpan(spans.master, sub.numel,
                                               unit.home(Kind::kMaster).dtype),
                      cpu_adam::TypedSpan(param_out, sub.numel, DType::kFp32), *arena_);
  }
}

// The step is taken: commit it, drop the gathered copies (they hold the old parameters), grow the
// loss scale after a window of clean steps, and report.
void EngineState::finish_step(StepStats& stats, const StepMarks& marks) {
  ++progress_.step;
  if (store_ && !commit_due_) store_->commit(progress_.step);  // else once the deferred are done
  if (uses_fp16(config_) && config_.precision.dynamic_loss_scale &&
      ++progress_.clean_steps >= config_.precision.loss_scale_window) {
    progress_.loss_scale *= 2;
    progress_.clean_steps = 0;
  }
  stats.step = progress_.step;
  stats.loss_scale = progress_.loss_scale;
  stats.io_wait_s = io_wait_s_.load() - marks.io_wait_s;
  io_wait_s_ = 0;
  if (store_) {
    // With defer_update the worker may already be running the first units' updates (the prefetch
    // above started them): the store's counters are atomic, and those bytes count in this step's
    // figures or the next's, never twice.
    stats.nvme.read_bytes = store_->bytes_read() - nvme_read_mark_;
    stats.nvme.written_bytes = store_->bytes_written() - nvme_written_mark_;
    stats.nvme_in_step.read_bytes = store_->bytes_read() - marks.read_bytes;
    stats.nvme_in_step.written_bytes = store_->bytes_written() - marks.written_bytes;
    nvme_read_mark_ = store_->bytes_read();
    nvme_written_mark_ = store_->bytes_written();
  }
  stats.fresh_param_bytes = fresh_param_bytes_.exchange(0);
  stats.gathers_queued_ahead = ahead_.take_started_count();
  stats.grad_moves_queued = grad_moves_.take_queued_count();
  stats.device_updated_groups = std::exchange(device_updated_groups_, 0);
  stats.deferred_wait_s = std::exchange(deferred_wait_s_, 0.0);
  stats.comm_bytes = comm_->stats().total_payload_bytes();
  comm_->reset_stats();
  stats.step_s = seconds_since(marks.start);
}

}  // namespace strata::runtime::detail
