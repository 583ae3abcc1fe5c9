// The optimizer during the backward (runtime/engine/speculation.hpp): reduce_grads hands each unit whose
// gradient is complete to the UpdateWorker, which runs it through the same pipeline step() uses,
// with clip coefficient 1; step() confirms or undoes each one once the global norm is known.
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "base/assert.hpp"
#include "cpu_adam/grad_norm.hpp"
#include "runtime/engine/engine_state.hpp"

namespace strata::runtime::detail {

// UpdateWorker ---------------------------------------------------------------------------------

UpdateWorker::UpdateWorker(std::function<void(std::span<const SpeculatedUnitId>)> run)
    : run_(std::move(run)), thread_([this] { loop(); }) {}

UpdateWorker::~UpdateWorker() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  thread_.join();
}

void UpdateWorker::submit(SpeculatedUnitId unit) {
  {
    const std::lock_guard lock(mutex_);
    queue_.push_back(unit);
    ++submitted_;
  }
  work_.notify_all();
}

void UpdateWorker::submit(std::span<const SpeculatedUnitId> units) {
  if (units.empty()) return;
  {
    const std::lock_guard lock(mutex_);
    queue_.insert(queue_.end(), units.begin(), units.end());
    submitted_ += units.size();
  }
  work_.notify_all();
}

void UpdateWorker::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return completed_ == submitted_; });
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

void UpdateWorker::loop() {
  std::vector<SpeculatedUnitId> batch;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      batch.assign(queue_.begin(), queue_.end());
      queue_.clear();
    }
    std::exception_ptr failure;
    try {
      run_(batch);
    } catch (...) {
      failure = std::current_exception();
    }
    {
      const std::lock_guard lock(mutex_);
      if (failure && !failure_) failure_ = failure;
      completed_ += batch.size();
    }
    idle_.notify_all();
  }
}

// The Engine's side ----------------------------------------------------------------------------
namespace {

bool on_nvme(const UnitState& unit, Kind kind) {
  return unit.has(kind) && unit.home(kind).residence() == Residence::kNvme;
}
bool in_memory(const UnitState& unit, Kind kind) {
  return unit.has(kind) && unit.home(kind).residence() == Residence::kAddressable;
}

// Calls fn(kind, group, offset, bytes) for each in-memory piece an update of `unit` changes, at
// its offset in the unit's kept copy.
template <typename Fn>
void for_each_kept_piece(const UnitState& unit, Fn&& fn) {
  std::uint64_t offset = 0;
  for (std::size_t group = 0; group < unit.groups.size(); ++group) {
    for (Kind kind : kUpdateWriteKinds) {
      if (!in_memory(unit, kind)) continue;
      const std::uint64_t bytes = unit.home(kind).bytes(unit.groups[group].numel);
      fn(kind, group, offset, bytes);
      offset += bytes;
    }
  }
}

}  // namespace

void EngineState::start_speculation() {
  speculated_.resize(units_.size());
  if (!(config_.zero.overlap_optimizer || config_.zero.defer_update)) return;
  // On the staged path the worker stages device-homed state on streams of its own: lanes_ belong
  // to the owner thread, which gathers and moves gradients on them meanwhile.
  if (lanes_) update_lanes_ = std::make_unique<DeviceLanes>(*device_);
  worker_ = std::make_unique<UpdateWorker>(
      [this](std::span<const SpeculatedUnitId> units) { run_on_worker(units); });
  if (!config_.zero.overlap_optimizer) return;  // [zero] defer_update alone: no undo copies
  if (plan_.undo_bytes > 0) undo_copies_ = host_pool_->allocate(plan_.undo_bytes);
  std::uint64_t offset = 0;
  for (std::size_t u = units_.size(); u-- > 0;) {  // the plan's order: last units first
    const std::uint64_t bytes = plan_.undo_unit_bytes[u];
    if (bytes == 0) continue;
    STRATA_ASSERT(bytes == kept_bytes(units_[u]), "undo copy size differs from the plan");
    speculated_[u].kept = undo_copies_.data() + offset;
    offset += round_up(bytes, kDirectIoAlignment);
  }
}

std::uint64_t EngineState::kept_bytes(const UnitState& unit) const {
  std::uint64_t total = 0;
  for_each_kept_piece(unit, [&](Kind, std::size_t, std::uint64_t, std::uint64_t bytes) {
    total += bytes;
  });
  return total;
}

bool EngineState::may_speculate(const UnitState& unit) {
  // The global norm is at least this rank's: once this rank's passes the threshold (or is not
  // finite), the step clips (or skips), and nothing more is speculated.
  const double sum = norm_.sum_of_squares();
  const double clip = config_.optimizer.grad_clip;
  if (!std::isfinite(sum) ||
      (clip > 0 && cpu_adam::clip_coefficient(std::sqrt(sum) / progress_.loss_scale, clip) < 1.0)) {
    speculation_stopped_ = true;
    return false;
  }
  // State the CPU cannot address is neither kept for an undo nor summed into this rank's norm so
  // far (a gradient homed there is summed on the device): such a unit waits for step().
  for (const auto& kinds : {kUpdateReadKinds, kUpdateWriteKinds}) {
    for (Kind kind : kinds) {
      if (unit.has(kind) && unit.home(kind).residence() == Residence::kStagedDevice) return false;
    }
  }
  // An uncommitted write (set_master, import) would be lost with the speculated one.
  const std::lock_guard lock(store_mutex_);
  for (Kind kind : kUpdateWriteKinds) {
    if (!on_nvme(unit, kind)) continue;
    for (tiers::ExtentId extent : unit.home(kind).extents) {
      if (store_->has_pending(extent)) return false;
    }
  }
  return true;
}

void EngineState::speculate(UnitId id) {
  if (!worker_ || !config_.zero.overlap_optimizer || speculation_stopped_ || last_step_clipped_) {
    return;
  }
  UnitState& unit = units_[id];
  SpeculatedUnit& spec = speculated_[id];
  if (spec.state != SpeculatedUnit::State::kNone || !may_speculate(unit)) return;
  cpu_adam::Hyperparams hyper;
  try {
    hyper = unit_step_hyper(unit, next_step_hyperparams());
    cpu_adam::validate(hyper, cpu_adam::GradScaling{progress_.loss_scale, 1.0});
  } catch (const std::invalid_argument&) {
    return;  // step() reports it
  }
  if (spec.kept == nullptr && kept_bytes(unit) > 0) return;  // no room to undo it
  spec.hyper = hyper;
  spec.loss_scale = progress_.loss_scale;
  spec.state = SpeculatedUnit::State::kStarted;
  if (options_.tracer != nullptr) {
    const auto now = std::chrono::steady_clock::now();
    options_.tracer->record(TraceTrack::kOptimizer, "speculate " + unit.spec.name, now, now);
  }
  worker_->submit(id);
}

void EngineState::run_speculated(std::span<const SpeculatedUnitId> units) {
  const std::vector<UnitId> ids(units.begin(), units.end());
  cpu_adam::GradScaling scaling;
  scaling.loss_scale = speculated_[ids.front()].loss_scale;  // the same for every unit of a step
  scaling.clip_coef = 1.0;
  speculated_adam_s_ += run_pipeline(
      update_lanes_.get(), ids, scaling, [&](UnitId unit) { return speculated_[unit].hyper; },
      [&](UnitId unit, std::size_t group) { keep_for_undo(unit, group); });
}

void EngineState::keep_for_undo(UnitId id, std::size_t group) {
  const UnitState& unit = units_[id];
  std::byte* kept = speculated_[id].kept;
  for_each_kept_piece(unit, [&](Kind kind, std::size_t piece_group, std::uint64_t offset,
                                std::uint64_t bytes) {
    if (piece_group == group) std::memcpy(kept + offset, unit.home(kind).group_at(group), bytes);
  });
}

void EngineState::undo_speculated(UnitId id) {
  UnitState& unit = units_[id];
  SpeculatedUnit& spec = speculated_[id];
  STRATA_ASSERT(spec.state == SpeculatedUnit::State::kStarted, "undo of a unit not speculated");
  for_each_kept_piece(unit, [&](Kind kind, std::size_t group, std::uint64_t offset,
                                std::uint64_t bytes) {
    std::memcpy(unit.home(kind).group_at(group), spec.kept + offset, bytes);
  });
  {
    const std::lock_guard lock(store_mutex_);
    for (Kind kind : kUpdateWriteKinds) {
      if (!on_nvme(unit, kind)) continue;
      for (tiers::ExtentId extent : unit.home(kind).extents) store_->discard(extent);
    }
  }
  spec.state = SpeculatedUnit::State::kNone;
}

double EngineState::finish_speculation() {
  if (worker_) worker_->wait_idle();
  return std::exchange(speculated_adam_s_, 0.0);
}

std::vector<UnitId> EngineState::settle_speculation(const SpeculationCheck* check,
                                                    StepStats& stats) {
  std::vector<UnitId> remaining;
  for (UnitId id = 0; id < units_.size(); ++id) {
    SpeculatedUnit& spec = speculated_[id];
    const UnitState& unit = units_[id];
    if (spec.state == SpeculatedUnit::State::kStarted) {
      stats.speculated_groups += unit.groups.size();
      const bool stands = check != nullptr && check->scaling.clip_coef == 1.0 &&
                          check->scaling.loss_scale == spec.loss_scale &&
                          unit_step_hyper(unit, check->hyper) == spec.hyper;
      if (stands) {
        stats.confirmed_groups += unit.groups.size();
        spec.state = SpeculatedUnit::State::kNone;
        continue;
      }
      undo_speculated(id);
      stats.redone_groups += unit.groups.size();
    }
    remaining.push_back(id);
  }
  speculation_stopped_ = false;
  return remaining;
}

void EngineState::cancel_speculation() {
  finish_grad_moves();  // what follows may read the gradients, or replace them
  complete_deferred();  // the last step's updates first: what follows reads or replaces them
  discard_pre_reads();  // the step reads again what it finds then (and the first buffer is lent)
  if (!worker_) return;
  worker_->wait_idle();
  for (UnitId id = 0; id < speculated_.size(); ++id) cancel_speculation(id);
}

void EngineState::cancel_speculation(UnitId id) {
  if (id >= speculated_.size() || speculated_[id].state == SpeculatedUnit::State::kNone) return;
  worker_->wait_idle();
  undo_speculated(id);
}

}  // namespace strata::runtime::detail
