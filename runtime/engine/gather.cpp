// Units gathered on the device for compute. The ResidencyManager (tiers/residency.hpp) decides
// which units are resident and what to prefetch; this is its client: start_load allocates the
// unit's device buffers and starts the NVMe reads of this rank's parameter shard, wait_load
// finishes the gather (own shard in place, all-gather over the ranks, cast to fp32), evict frees.
// On the staged path with one rank the copy and cast are queued on the device streams as soon as
// the shard is in memory (queue_gather), and wait_load waits for them. With several ranks a
// prefetched unit starts its all-gather at start_load (start_pending_gather), or once the running
// step has updated it; each gather() tests those in flight (advance_gathers_ahead) and, on the
// staged path, queues the copy and cast of those complete.
// A GatheredUnit handle counts as a use (live_handles); step() refuses to run while one is alive.
// With a compute fence (Engine::set_compute_fence) a release takes a ticket, and evict waits on it
// before the buffers go: the compute reading them may outlive the handle.
// Where each unit's gather stands is its GatheredCopy's state (gathered_copy.hpp; the transitions
// and which function here performs each: docs/design.md, "The gather as a state machine").
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "base/assert.hpp"
#include "base/units.hpp"
#include "cpu_adam/cast.hpp"
#include "runtime/engine/engine_state.hpp"

namespace strata::runtime::detail {

const float* EngineState::gather(UnitId id) {
  STRATA_ASSERT(finalized_, "gather before finalize");
  unit(id);  // throws std::out_of_range naming an unknown id
  advance_gathers_ahead();
  ahead_.begin_acquire(id);  // a load start_load begins for another unit now is a prefetch
  try {
    residency_->acquire(id);
  } catch (...) {
    ahead_.end_acquire();
    throw;
  }
  ahead_.end_acquire();
  GatheredCopy& gathered = units_[id].gathered;
  STRATA_ASSERT(gathered.state() == GatherState::kReady, "a unit handed out before its gather");
  ++gathered.live_handles;
  return reinterpret_cast<const float*>(gathered.full32.data());
}

const std::uint16_t* EngineState::gathered_bf16(UnitId id) const {
  if (param_dtype() != DType::kBf16) return nullptr;
  const GatheredCopy& gathered = units_[id].gathered;
  STRATA_ASSERT(gathered.state() == GatherState::kReady && gathered.live_handles > 0 &&
                    gathered.full16,
                "the bf16 parameters of a unit not gathered");
  return reinterpret_cast<const std::uint16_t*>(gathered.full16.data());
}

void EngineState::release(UnitId id) {
  GatheredCopy& gathered = units_[id].gathered;
  STRATA_ASSERT(gathered.live_handles > 0, "release of a unit not gathered");
  --gathered.live_handles;
  if (compute_fence_ != nullptr) gathered.compute_ticket = compute_fence_->mark();
  residency_->release(id);
}

void EngineState::set_compute_fence(tiers::ComputeFence* fence) {
  // Another fence's tickets mean nothing to this one; the caller has waited for that compute.
  for (UnitState& unit : units_) unit.gathered.compute_ticket = 0;
  compute_fence_ = fence;
}

void EngineState::start_load(tiers::UnitId id) {
  // A unit gathered again after its update started during the backward (a prefetch of the next
  // iteration, or a model that uses it twice) must see the parameters from before the update.
  cancel_speculation(id);
  UnitState& unit = units_[id];
  GatheredCopy& gathered = unit.gathered;
  STRATA_ASSERT(gathered.state() == GatherState::kEvicted, "a load started for a loaded unit");
  const std::uint64_t padded = unit.layout.padded_numel;
  const DType param_dtype = this->param_dtype();
  tiers::DeviceBuffer full32 = device_->allocate(unit.fp32_views.numel * 4);
  tiers::DeviceBuffer full16;
  if (param_dtype != DType::kFp32) full16 = device_->allocate(padded * dtype_bytes(param_dtype));
  gathered.begin_load(std::move(full32), std::move(full16));
  const bool deferred = deferred_pending(id);
  if (unit.home(Kind::kParam).residence() != Residence::kNvme) {
    if (deferred) {
      if (sends_after_update(id)) start_pending_gather(unit, OwnSend::kAfterUpdate);
      start_deferred(id);  // updates the home in place; wait_load waits for it
    } else if (may_queue_gather(id)) {
      queue_gather(unit);  // the shard is in memory and final: its copy and cast go on now
    } else if (may_start_pending_gather(id) && claim_gather_slot(unit) && !update_due(id)) {
      start_gather_of_final_shard(unit);  // in memory and final: its all-gather starts now
    }  // (one the step has yet to update starts once it is: start_gather_once_updated)
    return;
  }
  // Its gather can start ahead once the reads are in (sent by the GatherSender) or once the
  // running step has handed its new parameters over: claimed first, so that on the staged path
  // the reads or the parameters land in the gather's slot.
  const bool due = update_due(id);
  const bool ahead = !deferred && (due || ahead_.has_sender()) && may_start_pending_gather(id) &&
                     claim_gather_slot(unit);
  std::byte* shard = own_shard_destination(unit);
  // The step updates this unit after this load starts (in step(), or deferred to now): its new
  // parameters come from the update (hand_fresh_params), not from a read of what it replaces.
  if (deferred || due) {
    gathered.await_update(unit.groups.size(), shard);
    if (deferred) {  // [zero] defer_update: the update runs now
      if (sends_after_update(id)) start_pending_gather(unit, OwnSend::kAfterUpdate);
      start_deferred(id);
    }
    return;
  }
  read_param_shard(unit, shard);
  if (ahead) start_pending_gather(unit, OwnSend::kAfterReads);
}

// Read this rank's shard straight into its place in the gathered buffer when the CPU addresses
// device memory (the host device's memory is 4 KiB aligned; the shard offset is a multiple of
// 4 KiB), else into pinned staging that finish_gather copies to the device.
std::byte* EngineState::own_shard_destination(UnitState& unit) {
  GatheredCopy& gathered = unit.gathered;
  const ShardHome& param = unit.home(Kind::kParam);
  STRATA_ASSERT(gathered.state() == GatherState::kLoading && !gathered.param_staging(),
                "a destination for the own shard of a unit not loading, or twice");
  if (device_addressable_ || gathered.gather_lease) {
    return gather_target(gathered) + unit.layout.shard_begin(rank_) * param.element_bytes();
  }
  if (std::optional<tiers::PinnedLease> lease = param_read_slab_->try_acquire()) {
    gathered.param_lease = std::move(*lease);
  } else {
    gathered.param_buffer = host_pool_->allocate(
        round_up(unit.layout.shard_numel * param.element_bytes(), kDirectIoAlignment));
  }
  STRATA_ASSERT(gathered.param_staging() != nullptr, "no staging for the own shard's reads");
  return gathered.param_staging();
}

void EngineState::read_param_shard(UnitState& unit, std::byte* shard) {
  const ShardHome& param = unit.home(Kind::kParam);
  STRATA_ASSERT(param.residence() == Residence::kNvme && shard != nullptr,
                "parameter reads of a shard not on NVMe, or into nowhere");
  unit.gathered.begin_reads();
  {
    const std::lock_guard lock(store_mutex_);
    for (std::size_t g = 0; g < unit.groups.size(); ++g) {
      const SubGroup& sub = unit.groups[g];
      unit.gathered.reads.push_back(store_->read(
          param.extents[g],
          std::span(shard + sub.begin * param.element_bytes(), sub.numel * param.element_bytes())));
    }
  }
  STRATA_ASSERT(unit.gathered.reads.size() == unit.groups.size(), "one read per sub-group");
}

void EngineState::hand_fresh_params(UnitId id, std::size_t group, const std::byte* params) {
  UnitState& unit = units_[id];
  GatheredCopy& gathered = unit.gathered;
  // (On the update worker's thread for a deferred update: only the own-shard hand-over is read.)
  if (params == nullptr || !gathered.awaiting_update()) return;
  STRATA_ASSERT(group < unit.groups.size(), "a hand-over of a sub-group the unit does not have");
  const std::uint64_t element_bytes = unit.home(Kind::kParam).element_bytes();
  const SubGroup& sub = unit.groups[group];
  std::memcpy(gathered.fresh_dest() + sub.begin * element_bytes, params, sub.numel * element_bytes);
  fresh_param_bytes_ += sub.numel * element_bytes;
  gathered.hand_over_group();
}

bool EngineState::load_complete(tiers::UnitId id) {
  UnitState& unit = units_[id];
  if (deferred_pending(id) || unit.gathered.awaiting_update()) return false;
  for (const tiers::StoreRead& read : unit.gathered.reads) {
    if (!read.poll()) return false;
  }
  // Its NVMe reads (or the step's hand-over) are in: the copy and cast can go on the streams.
  // (A read that fails its checksum is still reported by wait_load before the unit is used.)
  if (may_queue_gather(id)) queue_gather(unit);
  if (unit.gathered.send_job != 0 && !ahead_.sender().done(unit.gathered.send_job)) return false;
  if (unit.gathered.state() == GatherState::kAllGathering) return unit.gathered.pending->test();
  return true;
}

void EngineState::wait_load(tiers::UnitId id) {
  UnitState& unit = units_[id];
  GatheredCopy& gathered = unit.gathered;
  STRATA_ASSERT(gathered.state() != GatherState::kEvicted, "waiting for a load that did not start");
  if (gathered.state() == GatherState::kReady) {
    // Waited for before, and the commit of the step's deferred updates threw: only that again.
    commit_if_deferred_done();
    return;
  }
  if (deferred_pending(id)) wait_deferred(id);
  if (gathered.awaiting_update()) {
    // The step that was to hand the parameters over failed before it did: read what the store
    // holds, as any gather after a failed step does.
    read_param_shard(unit, gathered.fresh_dest());
  }
  if (gathered.own() == OwnShard::kReading) {
    for (tiers::StoreRead& read : gathered.reads) wait_timed(read);
    gathered.finish_reads();
  }
  {
    Tracer::Scope scope(options_.tracer, TraceTrack::kCopies, "gather " + unit.spec.name);
    switch (gathered.state()) {
      case GatherState::kAllGathering:
        finish_pending_gather(unit);
        break;
      case GatherState::kQueued:  // (queue_gather, or queue_gathered_copy)
        wait_queued_gather(unit);
        break;
      default:  // kLoading, or kGathered left by a stream error: the gather runs at use
        if (gathers_ahead()) {
          queue_gather(unit);
          wait_queued_gather(unit);
        } else {
          finish_gather(unit);
          gathered.mark_ready();
        }
    }
  }
  STRATA_ASSERT(gathered.state() == GatherState::kReady, "a load waited for and not ready");
  commit_if_deferred_done();
}

void EngineState::write_back(tiers::UnitId) {
  STRATA_ASSERT(false, "gathered parameters are never dirty");
}

void EngineState::evict(tiers::UnitId id) {
  GatheredCopy& gathered = units_[id].gathered;
  STRATA_ASSERT(gathered.live_handles == 0, "evicting a unit in use");
  if (deferred_pending(id) && (gathered.fresh_dest() != nullptr || gathered.sends_after_update())) {
    // Its update is writing into the buffers about to go, or is to send from them.
    try {
      wait_deferred(id);
    } catch (...) {  // reported again by complete_deferred, which refuses to commit
    }
  }
  for (tiers::StoreRead& read : gathered.reads) {
    try {
      read.wait();
    } catch (...) {  // an unused prefetch failed: the next load reads again and reports it
    }
  }
  gathered.reads.clear();
  if (gathered.state() == GatherState::kQueued) {
    wait_queued_gather(units_[id]);  // the streams still read and write it
  }
  if (gathered.state() == GatherState::kAllGathering) {
    // Unused (every rank evicts it here: rank-independent decisions), but its transfers read
    // and write the buffer about to go. Every rank sent its shard when it started the gather, or
    // its sender does once the shard's reads (waited above) are in.
    finish_send_job(gathered);
    try {
      gathered.pending->wait();
    } catch (...) {  // withdrawn; the communicator is poisoned and reports it at its next call
    }
  }
  if (gathered.compute_ticket != 0) {
    // The model's compute that read the buffers may still run ([Note: asynchronous unit calls]).
    STRATA_ASSERT(compute_fence_ != nullptr, "a compute ticket without its fence");
    compute_fence_->wait(gathered.compute_ticket);
    gathered.compute_ticket = 0;
  }
  gathered.evict();
  STRATA_ASSERT(!gathered.full32 && !gathered.pending, "an evicted unit keeps its buffers");
}

void EngineState::finish_gather(UnitState& unit) {
  STRATA_ASSERT(unit.gathered.state() == GatherState::kLoading ||
                    unit.gathered.state() == GatherState::kGathered,
                "a gather at use of a unit with its gather under way");
  if (device_addressable_) {
    finish_gather_in_place(unit);
  } else {
    finish_gather_staged(unit);
  }
}

// Device memory the CPU addresses: own shard copied into its place (NVMe reads landed there
// already), all-gathered in place, cast to fp32 on the CPU.
void EngineState::finish_gather_in_place(UnitState& unit) {
  STRATA_ASSERT(device_addressable_, "an in-place gather on the staged path");
  const UnitLayout& layout = unit.layout;
  const DType wire = param_dtype();
  const std::byte* own = place_own_shard(unit);
  if (ranks_ > 1) {
    const std::uint64_t shard_bytes = layout.shard_numel * dtype_bytes(wire);
    std::memcpy(gather_send_scratch_.data(), own, shard_bytes);
    comm_->all_gather(comm::ConstBuffer{gather_send_scratch_.data(), layout.shard_numel, wire},
                      comm::MutableBuffer{gathered_params(unit.gathered).data(),
                                          layout.padded_numel, wire});
  }
  cast_gathered_to_fp32(unit);
}

tiers::DeviceBuffer& EngineState::gathered_params(GatheredCopy& copy) const {
  tiers::DeviceBuffer& params = param_dtype() == DType::kFp32 ? copy.full32 : copy.full16;
  STRATA_ASSERT(params, "the gathered parameters of a unit not loaded");
  return params;
}

std::byte* EngineState::gather_target(GatheredCopy& copy) const {
  std::byte* target = device_addressable_ ? gathered_params(copy).data() : copy.gather_lease.data();
  STRATA_ASSERT(target != nullptr, "a gather ahead without its buffer or slot");
  return target;
}

bool EngineState::claim_gather_slot(UnitState& unit) {
  if (device_addressable_) return true;
  STRATA_ASSERT(!unit.gathered.gather_lease, "a gather slot claimed twice");
  std::optional<tiers::PinnedLease> lease = ahead_.try_claim_slot();
  if (!lease) return false;
  unit.gathered.gather_lease = std::move(*lease);
  STRATA_ASSERT(unit.gathered.gather_lease, "a claimed slot not held");
  return true;
}

std::byte* EngineState::place_own_shard(UnitState& unit) {
  const ShardHome& param = unit.home(Kind::kParam);
  std::byte* own =
      gather_target(unit.gathered) + unit.layout.shard_begin(rank_) * param.element_bytes();
  if (param.residence() != Residence::kNvme) {
    STRATA_ASSERT(param.memory != nullptr, "an own shard in memory without its memory");
    std::memcpy(own, param.memory, unit.layout.shard_numel * param.element_bytes());
  }
  return own;
}

void EngineState::cast_gathered_to_fp32(UnitState& unit) {
  STRATA_ASSERT(device_addressable_ && unit.gathered.full32, "a CPU cast of device memory");
  const DType param_dtype = this->param_dtype();
  if (param_dtype == DType::kFp32) return;
  const std::uint64_t element_bytes = dtype_bytes(param_dtype);
  for (const Fp32ViewRun& run : unit.fp32_views.runs) {
    cpu_adam::convert(
        cpu_adam::ConstTypedSpan(unit.gathered.full16.data() + run.offset * element_bytes,
                                 run.numel, param_dtype),
        cpu_adam::TypedSpan(unit.gathered.full32.data() + run.packed_offset * 4, run.numel,
                            DType::kFp32),
        *arena_);
  }
}

// Several ranks (may_start_pending_gather): a unit whose shard is final (nothing due to update it)
// starts its all-gather at start_load, and the peers' blocks are received straight into the
// gathered buffer (in place) or the unit's pinned slot (staged path). A shard in memory the CPU
// addresses is copied to its place and sent at once; a shard read from NVMe (when the
// communicator sends from any thread: a GatherSender) is sent by the GatherSender as soon as its
// reads are in, and (idem) a staged device home's shard once its d2h copy is done; a shard a
// deferred update is producing (idem) is sent by the update worker when the update is done
// (send_after_update). Every rank starts the same gathers in the same order (rank-independent
// residency decisions), and each rank's block leaves without a later Engine call of that rank,
// so a gather waited for anywhere (wait_load, evict, the Engine's end, one rank's later than
// another's) needs nothing more from the peers' Engine calls.
// Each is its own tag (the Engine's key base + unit id): they complete in any order. A shard the
// running step has yet to update starts its gather once the step has updated it.
bool EngineState::may_start_pending_gather(UnitId id) const {
  // On the staged path a device-homed shard is copied d2h first, and the GatherSender sends it.
  return ahead_.across_ranks() &&
         (units_[id].home(Kind::kParam).residence() != Residence::kStagedDevice ||
          ahead_.has_sender());
}

// A shard in memory that nothing will update before its use: host memory (or device memory the
// CPU addresses) is copied to its place and sent now; on the staged path a device home's shard is
// copied d2h into its place in the slot (after everything queued on the h2d stream so far when
// the step has just queued its new parameters there: `after_h2d`), and the GatherSender sends it
// once that copy is done.
void EngineState::start_gather_of_final_shard(UnitState& unit, bool after_h2d) {
  STRATA_ASSERT(!update_due(static_cast<UnitId>(unit_index(unit))),
                "a gather ahead of a shard the step has yet to update");
  const ShardHome& param = unit.home(Kind::kParam);
  if (param.residence() != Residence::kStagedDevice) {
    start_pending_gather(unit);
    return;
  }
  GatheredCopy& copy = unit.gathered;
  if (!copy.own_copied) copy.own_copied.emplace(device_->create_event());
  DeviceLanes& lane = *lanes_;
  if (after_h2d) {
    lane.h2d.record(lane.h2d_done);
    lane.d2h.wait(lane.h2d_done);
  }
  lane.d2h.copy_to_host(
      gather_target(copy) + unit.layout.shard_begin(rank_) * param.element_bytes(),
      param.device_span(0, unit.layout.shard_numel));
  lane.d2h.record(*copy.own_copied);
  start_pending_gather(unit, OwnSend::kAfterCopy);
  STRATA_ASSERT(copy.state() == GatherState::kAllGathering, "the gather ahead did not start");
}

// [zero] overlap_optimizer: the step prefetches the next iteration's first units before its
// updates (optimizer_step.cpp), so a unit it has yet to update is loaded without its gather
// (start_load). Called on the step's thread once the unit's last sub-group is updated and on its
// way home: the home holds the new parameters, or the step handed them to the gathered buffer
// (NVMe home), or their h2d to the device home is queued ahead of the gather's on the same
// stream. Every rank updates the same units in the same order, so every rank starts the same
// gathers in the same order.
void EngineState::start_gather_once_updated(UnitId id) {
  if (!update_due(id)) return;
  update_due_[id] = 0;
  UnitState& unit = units_[id];
  GatheredCopy& gathered = unit.gathered;
  // Not loaded under the step (evicted since, or its parameters still to be handed over).
  if (gathered.state() == GatherState::kEvicted || gathered.awaiting_update()) return;
  STRATA_ASSERT(gathered.state() == GatherState::kLoading,
                "a unit the step had yet to update gathered before its update");
  if (may_queue_gather(id)) {
    queue_gather(unit);
  } else if (may_start_pending_gather(id) && (device_addressable_ || gathered.gather_lease)) {
    start_gather_of_final_shard(unit, /*after_h2d=*/true);  // in memory (or in place), final now
  }
}

void EngineState::start_pending_gather(UnitState& unit, OwnSend own) {
  const UnitId id = unit_index(unit);
  GatheredCopy& gathered = unit.gathered;
  STRATA_ASSERT(gathered.state() == GatherState::kLoading && ahead_.across_ranks(),
                "an all-gather started ahead for a unit not loading, or without its key");
  STRATA_ASSERT(own == OwnSend::kNow || own == OwnSend::kAfterUpdate || ahead_.has_sender(),
                "an own block for the GatherSender without one");
  if (own == OwnSend::kNow) place_own_shard(unit);
  std::unique_ptr<comm::PendingAllGather> gather = comm_->start_all_gather(
      comm::MutableBuffer{gather_target(gathered), unit.layout.padded_numel, param_dtype()},
      unit.layout.shard_numel, ahead_.key_of(id),
      own == OwnSend::kNow ? comm::Communicator::OwnBlock::kNow
                           : comm::Communicator::OwnBlock::kLater);
  std::uint64_t job = 0;  // the sender's, once it sends the own block
  if (own == OwnSend::kAfterCopy) {
    job = ahead_.sender().submit(
        [copied = &*gathered.own_copied] {
          try {
            copied->wait();
          } catch (...) {  // the stream's error: reported by its next synchronize
            return false;
          }
          return true;
        },
        *gather);
  } else if (own == OwnSend::kAfterReads) {
    job = ahead_.sender().submit(
        [reads = gathered.reads]() mutable {
          bool in = true;
          for (tiers::StoreRead& read : reads) {
            try {
              read.wait();
            } catch (...) {  // reported by wait_load's own wait on the read
              in = false;
            }
          }
          return in;
        },
        *gather);
  }
  gathered.begin_all_gather(std::move(gather), own, job);
  STRATA_ASSERT(gathered.state() == GatherState::kAllGathering, "the gather ahead did not start");
  ahead_.count_started(id);
}

// The deferred update of a unit whose gather started at its load has handed its parameters over:
// in memory the home holds them (copied to their place now), from NVMe they were written to their
// place (hand_fresh_params). The owner reads the flag only after the update is done.
bool EngineState::sends_after_update(UnitId id) {
  // Not on the staged path: there the gather receives into a pinned slot claimed at the load,
  // and a device home's shard would be sent from a d2h copy on the owner's streams; such a
  // unit's gather runs at wait_load, once its update is done.
  if (!sends_from_threads() || !device_addressable_) return false;
  // Only an update not started yet: the worker reads the flag set here after it takes the unit.
  const std::lock_guard lock(deferred_mutex_);
  return deferred_[id] == DeferredState::kDue;
}

void EngineState::send_after_update(UnitId id) {
  UnitState& unit = units_[id];
  // Every sub-group's parameters handed over (NVMe home): otherwise wait_load reads the shard
  // again, and nothing may have been sent.
  if (!unit.gathered.sends_after_update() || unit.gathered.awaiting_update()) return;
  STRATA_ASSERT(unit.gathered.pending != nullptr, "an own block to send without its gather");
  place_own_shard(unit);
  try {
    unit.gathered.pending->send_own();
  } catch (...) {  // kept by the gather: wait_load's wait throws it
  }
}

// Several ranks, at each gather() (the model's calls between units): MPI moves a message's bytes
// only inside MPI calls, so testing the gathers started ahead here lets them progress under the
// compute of the units before them rather than all at wait_load. On the staged path a gather
// whose blocks are all in has its h2d copy and cast queued on the streams now
// (queue_gathered_copy), under that compute too. Its slot stays claimed until wait_load or evict:
// slot claims must not depend on timing. A gather whose own block another thread is still to
// send (the GatherSender's job, a deferred update's worker) is only tested: its test may say
// complete before that send is posted.
void EngineState::advance_gathers_ahead() {
  if (!ahead_.across_ranks()) return;
  for (UnitState& unit : units_) {
    GatheredCopy& gathered = unit.gathered;
    if (gathered.state() != GatherState::kAllGathering) continue;
    // Until the own block is posted, a test that says complete speaks of the receives alone.
    if (gathered.sends_after_update() ||
        (gathered.send_job != 0 && !ahead_.sender().done(gathered.send_job))) {
      gathered.pending->test();
      continue;
    }
    // One test moves at most a fragment or so of each message: a few, while the peers' blocks
    // are already here, complete it in this call rather than at the next.
    bool complete = false;
    for (int tries = 0; tries < 4 && !complete; ++tries) complete = gathered.pending->test();
    if (!complete || device_addressable_) continue;  // (in place, wait_load casts it)
    finish_send_job(gathered);
    gathered.finish_all_gather();
    queue_gathered_copy(unit);
  }
}

void EngineState::finish_send_job(GatheredCopy& gathered) {
  if (gathered.send_job == 0) return;
  STRATA_ASSERT(gathered.pending != nullptr, "a sender job without its gather");
  const std::uint64_t job = std::exchange(gathered.send_job, 0);
  ahead_.sender().wait(job);
  STRATA_ASSERT(ahead_.sender().done(job), "a send job waited for and not run");
}

void EngineState::finish_pending_gather(UnitState& unit) {
  GatheredCopy& gathered = unit.gathered;
  STRATA_ASSERT(gathered.state() == GatherState::kAllGathering, "no all-gather to finish");
  finish_send_job(gathered);
  gathered.pending->wait();
  gathered.finish_all_gather();
  if (device_addressable_) {
    cast_gathered_to_fp32(unit);
  } else {
    finish_staged_copy(unit, gathered.gather_lease.data());
  }
  gathered.mark_ready();
}

// Staged, several ranks (one rank queues its gathers ahead: queue_gather): the own shard comes
// from pinned host memory (host home, or the NVMe reads' staging) or from device memory (device
// home); the collective runs on device memory (NcclComm) or on pinned host buffers; the cast to
// fp32 is a kernel on the compute stream.
void EngineState::finish_gather_staged(UnitState& unit) {
  STRATA_ASSERT(ranks_ > 1, "one rank's staged gathers go through queue_gather");
  const ShardHome& param = unit.home(Kind::kParam);
  const UnitLayout& layout = unit.layout;
  GatheredCopy& copy = unit.gathered;
  const std::uint64_t shard_bytes = layout.shard_numel * param.element_bytes();
  tiers::DeviceBuffer& full = gathered_params(copy);
  const DType wire = param_dtype();
  DeviceLanes& lane = *lanes_;
  const std::byte* host_own = param.residence() == Residence::kAddressable ? param.memory
                              : param.residence() == Residence::kNvme      ? copy.param_staging()
                                                                           : nullptr;
  if (ranks_ > 1 && !comm_on_device_) {
    // The collective runs on the host: own shard into pinned memory, all-gather into pinned
    // memory, one copy of the whole unit to the device.
    std::byte* send = shard_staging_.data();
    if (host_own != nullptr) {
      std::memcpy(send, host_own, shard_bytes);
    } else {
      copy_to_host(send, param.device_span(0, layout.shard_numel));
    }
    comm_->all_gather(comm::ConstBuffer{send, layout.shard_numel, wire},
                      comm::MutableBuffer{full_staging_.data(), layout.padded_numel, wire});
    finish_staged_copy(unit, full_staging_.data());
    return;
  }
  const tiers::DeviceSpan own =
      full.span(layout.shard_begin(rank_) * param.element_bytes(), shard_bytes);
  if (host_own != nullptr) {
    lane.h2d.copy_to_device(own, host_own);
  } else {
    lane.h2d.copy_on_device(own, param.device_span(0, layout.shard_numel));
  }
  // NcclComm: in device memory, on the communicator's stream.
  lane.h2d.copy_on_device(gather_send_scratch_.span(0, shard_bytes), own);
  lane.h2d.record(lane.h2d_done);
  lane.h2d_done.wait();
  comm_->all_gather(comm::ConstBuffer{gather_send_scratch_.data(), layout.shard_numel, wire},
                    comm::MutableBuffer{full.data(), layout.padded_numel, wire});
  comm_->synchronize();
  finish_staged_copy(unit, nullptr);
}

void EngineState::finish_staged_copy(UnitState& unit, const std::byte* host_full) {
  GatheredCopy& copy = unit.gathered;
  STRATA_ASSERT(!device_addressable_ && copy.full32, "a staged copy without streams or buffers");
  const UnitLayout& layout = unit.layout;
  const DType param_dtype = this->param_dtype();
  const std::uint64_t padded_bytes = layout.padded_numel * dtype_bytes(param_dtype);
  DeviceLanes& lane = *lanes_;
  if (host_full != nullptr) {
    lane.h2d.copy_to_device(gathered_params(copy).span(0, padded_bytes), host_full);
  }
  lane.h2d.record(lane.h2d_done);
  lane.compute.wait(lane.h2d_done);
  if (param_dtype != DType::kFp32) queue_fp32_view_casts(unit);
  lane.compute.record(lane.compute_done);
  lane.compute_done.wait();
  // The h2d copy that read them is done (compute waited for it).
  copy.release_staging();
  STRATA_ASSERT(!copy.gather_lease && copy.param_staging() == nullptr, "staging kept");
}

// Not when a step running now has yet to update the unit's home (a prefetch of the next
// iteration under the step's updates, [zero] overlap_optimizer): start_gather_once_updated queues
// it then.
bool EngineState::may_queue_gather(UnitId id) const {
  return gathers_ahead() && units_[id].gathered.state() == GatherState::kLoading && !update_due(id);
}

// The staged path with one rank, queued ahead of use: the own shard (the whole unit) to the
// device (h2d from pinned memory, or a device copy from a device home), then the cast on the
// compute stream, each unit with its own events so several can be in flight; nothing waits here.
void EngineState::queue_gather(UnitState& unit) {
  STRATA_ASSERT(gathers_ahead() && unit.gathered.state() == GatherState::kLoading,
                "gather queued twice, or not loading");
  const ShardHome& param = unit.home(Kind::kParam);
  const UnitLayout& layout = unit.layout;
  GatheredCopy& copy = unit.gathered;
  const std::uint64_t shard_bytes = layout.shard_numel * param.element_bytes();
  tiers::DeviceBuffer& full = gathered_params(copy);
  DeviceLanes& lane = *lanes_;
  const tiers::DeviceSpan own = full.span(0, shard_bytes);  // one rank: the shard is the unit
  if (param.residence() == Residence::kAddressable) {
    lane.h2d.copy_to_device(own, param.memory);
  } else if (param.residence() == Residence::kNvme) {
    lane.h2d.copy_to_device(own, copy.param_staging());
  } else {
    lane.h2d.copy_on_device(own, param.device_span(0, layout.shard_numel));
  }
  queue_cast(unit);
  STRATA_ASSERT(copy.state() == GatherState::kQueued, "a gather queued and not on the streams");
  ahead_.count_started(static_cast<UnitId>(unit_index(unit)));
}

// Several ranks on the staged path, a gather started ahead whose blocks are all in its pinned slot
// (advance_gathers_ahead): the whole unit h2d, then the cast, queued; wait_load waits for `ready`.
void EngineState::queue_gathered_copy(UnitState& unit) {
  GatheredCopy& copy = unit.gathered;
  STRATA_ASSERT(copy.state() == GatherState::kGathered && copy.gather_lease,
                "a gathered copy queued without its blocks in the pinned slot");
  const std::uint64_t padded_bytes = unit.layout.padded_numel * dtype_bytes(param_dtype());
  lanes_->h2d.copy_to_device(gathered_params(copy).span(0, padded_bytes), copy.gather_lease.data());
  queue_cast(unit);
  STRATA_ASSERT(copy.state() == GatherState::kQueued, "a gather queued and not on the streams");
}

// The end of a queued gather: once the h2d stream's copy is done (`copied`), the cast on the
// compute stream, then `ready`; the unit's events are created at its first queued gather and
// reused.
void EngineState::queue_cast(UnitState& unit) {
  GatheredCopy& copy = unit.gathered;
  if (!copy.copied) copy.copied.emplace(device_->create_event());
  if (!copy.ready) copy.ready.emplace(device_->create_event());
  const DType param_dtype = this->param_dtype();
  DeviceLanes& lane = *lanes_;
  lane.h2d.record(*copy.copied);
  lane.compute.wait(*copy.copied);
  if (param_dtype != DType::kFp32) queue_fp32_view_casts(unit);
  lane.compute.record(*copy.ready);
  copy.queue_copy();
  if (options_.tracer != nullptr) {
    const auto now = Tracer::Clock::now();
    options_.tracer->record(TraceTrack::kCopies, "queue gather " + unit.spec.name, now, now);
  }
}

// The 16 -> 32 casts of the unit's fp32 view on the compute stream (UnitState::fp32_views).
void EngineState::queue_fp32_view_casts(UnitState& unit) {
  const DType param_dtype = this->param_dtype();
  const std::uint64_t element_bytes = dtype_bytes(param_dtype);
  GatheredCopy& copy = unit.gathered;
  for (const Fp32ViewRun& run : unit.fp32_views.runs) {
    lanes_->compute.cast(copy.full32.span(run.packed_offset * 4, run.numel * 4), DType::kFp32,
                         copy.full16.span(run.offset * element_bytes, run.numel * element_bytes),
                         param_dtype);
  }
}

void EngineState::wait_queued_gather(UnitState& unit) {
  GatheredCopy& copy = unit.gathered;
  STRATA_ASSERT(copy.state() == GatherState::kQueued, "waiting for a gather not queued");
  copy.ready->wait();  // after the cast, which waited for the copy: both are done
  copy.finish_queued();
}

std::vector<float> EngineState::gather_master(UnitId id) {
  const UnitLayout& layout = unit(id).layout;
  std::vector<float> shard = read_shard_fp32(id, Kind::kMaster);
  std::vector<float> full(layout.padded_numel);
  if (ranks_ > 1) {
    all_gather_host(comm::ConstBuffer::of(std::span<const float>(shard)),
                    comm::MutableBuffer::of(std::span<float>(full)));
  } else {
    full = std::move(shard);
  }
  full.resize(layout.numel);
  STRATA_ASSERT(full.size() == layout.numel, "a gathered master of the wrong size");
  return full;
}

}  // namespace strata::runtime::detail
