// The step's own updates under the next forward ([zero] defer_update). step() computes the norm
// and the coefficient, confirms or undoes the speculated units (speculation.cpp) and, instead of
// updating the rest itself, marks them due with the step's hyper-parameters and coefficient. The
// next forward's gather of a due unit (start_load, a prefetch or a demand load) hands its update
// to the UpdateWorker and lands nothing from NVMe: the update copies each sub-group's new
// parameters where the parameter reads would have landed (hand_fresh_params, gather.cpp), so the
// step's parameter writes are never read back for the forward, and the update of unit k+1 runs
// while the forward computes unit k. The gather's finishing part (all-gather, cast) waits for
// that unit's update alone. The step commits once the last deferred unit is done; anything else
// that touches the state first (the next step, a gradient, a checkpoint, a state read or write,
// the Engine's end) runs what is still due and commits (complete_deferred).
//
// The arithmetic is the step's own, with the coefficient and hyper-parameters fixed at step():
// the parameters are bitwise those of the serial step.
#include <chrono>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "base/assert.hpp"
#include "runtime/engine/engine_state.hpp"

namespace strata::runtime::detail {

void EngineState::defer_updates(std::span<const UnitId> units, const cpu_adam::Hyperparams& hyper,
                                const cpu_adam::GradScaling& scaling, StepStats& stats) {
  STRATA_ASSERT(!commit_due_, "a step deferred while the last one's updates were due");
  deferred_.assign(units_.size(), DeferredState::kNone);
  deferred_hyper_.assign(units_.size(), cpu_adam::Hyperparams{});
  deferred_scaling_ = scaling;
  for (UnitId id : units) {
    deferred_hyper_[id] = unit_step_hyper(units_[id], hyper);
    deferred_[id] = DeferredState::kDue;
    stats.deferred_groups += units_[id].groups.size();
  }
  commit_due_ = true;
}

bool EngineState::deferred_pending(UnitId id) {
  if (!commit_due_ || id >= deferred_.size()) return false;
  const std::lock_guard lock(deferred_mutex_);
  return deferred_[id] != DeferredState::kNone;
}

void EngineState::start_deferred(UnitId id) {
  {
    const std::lock_guard lock(deferred_mutex_);
    if (deferred_[id] != DeferredState::kDue) return;
    deferred_[id] = DeferredState::kRunning;
  }
  if (collected_starts_) {
    collected_starts_->push_back(id);
  } else {
    worker_->submit(id);
  }
}

EngineState::CollectedStarts::CollectedStarts(EngineState& engine) : engine_(engine) {
  engine_.collected_starts_.emplace();
}

EngineState::CollectedStarts::~CollectedStarts() { engine_.submit_collected_starts(); }

void EngineState::submit_collected_starts() {
  if (!collected_starts_) return;
  const std::vector<UnitId> units = std::move(*collected_starts_);
  collected_starts_.reset();
  worker_->submit(units);
}

void EngineState::wait_deferred(UnitId id) {
  submit_collected_starts();  // what it waits for may be among them
  start_deferred(id);
  bool failed = false;
  const auto start = std::chrono::steady_clock::now();
  {
    std::unique_lock lock(deferred_mutex_);
    deferred_done_.wait(lock, [&] { return deferred_[id] != DeferredState::kRunning; });
    failed = deferred_[id] == DeferredState::kFailed;
  }
  deferred_wait_s_ += seconds_since(start);
  if (failed) {
    worker_->wait_idle();  // rethrows the update's failure, the first time
    throw std::runtime_error(fmt::format("step {}'s update of unit '{}' failed earlier",
                                         progress_.step, units_[id].spec.name));
  }
}

void EngineState::run_on_worker(std::span<const SpeculatedUnitId> units) {
  std::vector<UnitId> deferred;
  std::vector<UnitId> speculated;
  {
    const std::lock_guard lock(deferred_mutex_);
    for (UnitId id : units) {
      const bool is_deferred = id < deferred_.size() && deferred_[id] == DeferredState::kRunning;
      (is_deferred ? deferred : speculated).push_back(id);
    }
  }
  if (!deferred.empty()) run_deferred(deferred);
  if (!speculated.empty()) run_speculated(speculated);
}

void EngineState::run_deferred(std::span<const UnitId> units) {
  // A unit is done once its last sub-group is updated and its parameters handed over; its NVMe
  // writes drain with the pipeline, before the step commits (complete_deferred waits for the
  // worker first) and before any read of them (the store reads its own pending writes).
  const auto done = [&](UnitId id, DeferredState state) {
    {
      const std::lock_guard lock(deferred_mutex_);
      deferred_[id] = state;
    }
    deferred_done_.notify_all();
  };
  try {
    speculated_adam_s_ += run_pipeline(
        update_lanes_.get(), units, deferred_scaling_,
        [&](UnitId id) { return deferred_hyper_[id]; }, {},
        [&](UnitId id, std::size_t group, const std::byte* params) {
          hand_fresh_params(id, group, params);
          if (group + 1 == units_[id].groups.size()) {
            send_after_update(id);  // the gather started at the unit's load, if any
            done(id, DeferredState::kNone);
          }
        },
        &deferred_pre_reads_);
  } catch (...) {
    for (UnitId id : units) {
      const std::lock_guard lock(deferred_mutex_);
      if (deferred_[id] == DeferredState::kRunning) deferred_[id] = DeferredState::kFailed;
    }
    deferred_done_.notify_all();
    throw;
  }
}

void EngineState::complete_deferred() {
  if (!commit_due_) return;
  submit_collected_starts();
  for (UnitId id = 0; id < deferred_.size(); ++id) start_deferred(id);
  const auto start = std::chrono::steady_clock::now();
  worker_->wait_idle();  // every deferred update done and its writes drained; rethrows a failure
  deferred_wait_s_ += seconds_since(start);
  // A failure already reported (to the gather that waited for it) must not be committed: the
  // store keeps the previous step, and every later call says so.
  for (UnitId id = 0; id < deferred_.size(); ++id) {
    if (deferred_[id] == DeferredState::kFailed) {
      throw std::runtime_error(fmt::format(
          "step {}'s update of unit '{}' failed (reported when it was gathered); the step is not "
          "committed, and the NVMe store keeps step {}",
          progress_.step, units_[id].spec.name, progress_.step - 1));
    }
  }
  commit_due_ = false;
  if (store_) store_->commit(progress_.step);
}

void EngineState::commit_if_deferred_done() {
  if (!commit_due_) return;
  {
    const std::lock_guard lock(deferred_mutex_);
    for (DeferredState state : deferred_) {
      if (state != DeferredState::kNone) return;
    }
  }
  complete_deferred();  // nothing left to run: waits for the last writes, commits
}

}  // namespace strata::runtime::detail
