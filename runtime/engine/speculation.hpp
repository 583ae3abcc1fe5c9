// The optimizer during the backward: as soon as reduce_grads completes a unit's gradient, that
// unit's update (NVMe reads of master and moments, Adam, writes) runs on a worker thread while
// the backward goes on with earlier units (Fuyou's synchronous overlap; ZeRO-Offload's goal
// without its one-step-stale weights).
//
// Speculation. Two things the update needs are known only after the last gradient: the global
// norm's clip coefficient and whether anything overflowed (fp16, or a bad gradient). A unit is
// updated early with coefficient 1 while this rank's running norm cannot yet exceed grad_clip
// (the global norm is at least this rank's); the first gradient that crosses it, or is not
// finite, stops speculation for the step, and a step after a clipped or skipped one does not
// speculate (it would most likely be undone). step() then confirms the speculated units when the
// global coefficient is exactly 1 and the hyper-parameters are those the update used, or undoes
// them exactly and updates them again:
//   - state on NVMe: the update wrote the slot beside the committed one; NvmeStore::discard drops
//     it, so the committed bytes are the newest again (units whose state already holds
//     uncommitted writes, e.g. set_master, are not speculated);
//   - state in memory (host, or device memory the CPU addresses): a copy kept before the update,
//     within half the host budget's spare room (units that do not fit are left to step()).
// Either way the parameters are bitwise what the serial step gives. On the staged device path (a
// CUDA device) the worker stages on streams of its own (update_lanes_), and a unit with state
// homed in device memory is not speculated (its undo would need a device copy): there, with
// parameters on the GPU, [zero] defer_update is what takes the CPU's update off the step.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <thread>

#include "cpu_adam/optimizer.hpp"

namespace strata::runtime::detail {

using SpeculatedUnitId = std::uint32_t;

struct SpeculatedUnit {
  enum class State : std::uint8_t {
    kNone,     // not updated this step
    kStarted,  // handed to the worker (it may be running or done)
  };
  State state = State::kNone;
  cpu_adam::Hyperparams hyper;   // what the update used
  double loss_scale = 1;         // what the update unscaled by
  // Where the in-memory state from before the update is kept: the unit's part of the planned undo
  // copies (BufferPlan::undo_unit_bytes); null when the plan found it no room.
  std::byte* kept = nullptr;
};

// What step() found after the last gradient: a speculated unit stands only if it agrees.
struct SpeculationCheck {
  cpu_adam::Hyperparams hyper;      // the step's global hyper-parameters
  cpu_adam::GradScaling scaling;    // the step's loss scale and clip coefficient
};

// One thread running the units submitted to it, in submission order, a batch at a time.
class UpdateWorker {
 public:
  explicit UpdateWorker(std::function<void(std::span<const SpeculatedUnitId>)> run);
  ~UpdateWorker();  // finishes what was submitted, then stops
  UpdateWorker(const UpdateWorker&) = delete;
  UpdateWorker& operator=(const UpdateWorker&) = delete;

  void submit(SpeculatedUnitId unit);
  // All of `units` at once: an idle worker runs them as one batch (one optimizer pipeline).
  void submit(std::span<const SpeculatedUnitId> units);
  // Blocks until everything submitted has run; rethrows the first failure since the last call.
  void wait_idle();

 private:
  void loop();

  std::function<void(std::span<const SpeculatedUnitId>)> run_;
  std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable idle_;
  std::deque<SpeculatedUnitId> queue_;
  std::uint64_t submitted_ = 0;
  std::uint64_t completed_ = 0;
  bool stopping_ = false;
  std::exception_ptr failure_;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace strata::runtime::detail
