// A unit's gathered copy on the device and the states its gather passes through. Not a public
// header. See [Note: the gather's states] in docs/design.md ("The gather as a state machine").
//
// Two enums name where a gather stands: GatherState, what the gather itself has done (its
// buffers, the all-gather, the device copy and cast), and OwnShard, where this rank's own shard
// comes from while the unit loads. Each changes only through the transition functions below, each
// of which asserts the state it leaves, the data that state implies and the state it enters; the
// other fields are the data the states carry (buffers, reads, leases, events, the collective).
//
// Threading: the Engine's thread owns a GatheredCopy. A deferred update's worker touches only
// the own-shard hand-over (hand_over_group: own, fresh_groups_due) and reads the own-block send
// of a gather started at the load (sends_after_update, pending), of a unit whose update the
// owner does not touch until it has waited for it (deferred_update.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "base/assert.hpp"
#include "runtime/comm/communicator.hpp"
#include "tiers/device/device.hpp"
#include "tiers/nvme_store.hpp"
#include "tiers/pinned_pool.hpp"

namespace strata::runtime::detail {

// What the gather has done (gather.cpp).
//
//   kEvicted --begin_load--> kLoading --begin_all_gather--> kAllGathering
//                             |    |                             |
//                             |    |                     finish_all_gather
//                             |    |                             v
//                             |    +--queue_copy--+         kGathered --mark_ready--+
//                             |                   v              |                  |
//                             |                kQueued <--queue_copy                |
//                             |                   |                                 |
//                             |             finish_queued                           |
//                             |                   v                                 |
//                             +--mark_ready--> kReady <-----------------------------+
//
//   any state --evict--> kEvicted (the caller has waited for everything in flight)
enum class GatherState : std::uint8_t {
  // Not resident: no device buffers, nothing in flight.
  kEvicted,
  // The device buffers allocated (start_load); the own shard in its home, being read or due from
  // an update (OwnShard). The gather itself runs at wait_load, unless it starts ahead: queued on
  // the streams (one rank, staged), or all-gathered (several ranks) once the shard is final.
  kLoading,
  // An all-gather started ahead of use is in flight (`pending`): the peers' blocks arrive in the
  // gathered buffer (in place) or the pinned slot (`gather_lease`, staged). The own block was sent
  // at the start, or another thread sends it (own_send: the GatherSender's job `send_job`, or the
  // deferred update's worker).
  kAllGathering,
  // That all-gather complete (every block in the buffer or the slot); the h2d copy (staged) and
  // the cast to fp32 still to come. Passed through within one call, or left standing by a stream
  // error, after which wait_load gathers at use again.
  kGathered,
  // The h2d copy (staged) and the cast are queued on the device streams (events `copied`,
  // `ready`), nobody has waited for them: the streams still read and write the buffers.
  kQueued,
  // full32 holds the unit's parameters: what gather() hands out.
  kReady,
};

// Where this rank's own shard comes from while the unit loads (meaningful from kLoading on).
enum class OwnShard : std::uint8_t {
  // In its home in memory (host, device): copied (or sent) from there when the gather runs.
  kInHome,
  // NVMe reads into the pinned staging or its place in the gather's buffer (`reads`), issued;
  // they are waited for (and their errors reported) at wait_load, or at evict.
  kReading,
  // The step's update (running now, or deferred to this load) hands the new parameters over
  // sub-group by sub-group into `fresh_dest`, where the reads would have landed;
  // `fresh_groups_due` are still to come.
  kFromUpdate,
  // Landed where the reads or the update put it: reads waited for, or every sub-group handed over.
  kLanded,
};

// How the own block of a gather started ahead is sent: now (in memory), by the GatherSender once
// the NVMe reads are in (kAfterReads) or its d2h copy is done (staged device home, kAfterCopy),
// or by the deferred update's worker once the update is done (kAfterUpdate).
enum class OwnSend : std::uint8_t { kNow, kAfterReads, kAfterCopy, kAfterUpdate };

// The full copy of a unit gathered on the device for compute.
class GatheredCopy {
 public:
  GatherState state() const { return state_; }
  OwnShard own() const { return own_; }
  // The own shard is still to come from the step's update (hand_over_group).
  bool awaiting_update() const {
    STRATA_ASSERT((own_ == OwnShard::kFromUpdate) == (fresh_groups_due_ > 0),
                  "own shard from the update without sub-groups due");
    return own_ == OwnShard::kFromUpdate;
  }
  std::byte* fresh_dest() const { return fresh_dest_; }
  // An all-gather started ahead whose own block the deferred update's worker sends.
  bool sends_after_update() const { return own_send_ == OwnSend::kAfterUpdate; }

  // Transitions of GatherState -------------------------------------------------------------------
  // kEvicted -> kLoading: start_load with the unit's device buffers (full16 absent for fp32).
  void begin_load(tiers::DeviceBuffer full32_buffer, tiers::DeviceBuffer full16_buffer) {
    STRATA_ASSERT(state_ == GatherState::kEvicted && !full32, "load of a unit already loaded");
    STRATA_ASSERT(reads.empty() && !pending && send_job == 0 && own_ == OwnShard::kInHome,
                  "an evicted unit with its load's state left over");
    full32 = std::move(full32_buffer);
    full16 = std::move(full16_buffer);
    state_ = GatherState::kLoading;
    STRATA_ASSERT(full32, "a load without its fp32 buffer");
  }
  // kLoading -> kAllGathering: the all-gather started ahead, its own block sent as `send`
  // (kAfterReads, kAfterCopy: the GatherSender's job `job`, else 0).
  void begin_all_gather(std::unique_ptr<comm::PendingAllGather> gather, OwnSend send,
                        std::uint64_t job) {
    STRATA_ASSERT(state_ == GatherState::kLoading && !pending, "all-gather started twice");
    STRATA_ASSERT(gather != nullptr, "an all-gather started ahead without its collective");
    STRATA_ASSERT((job != 0) == (send == OwnSend::kAfterReads || send == OwnSend::kAfterCopy),
                  "a GatherSender job exactly when the sender sends the own block");
    pending = std::move(gather);
    own_send_ = send;
    send_job = job;
    state_ = GatherState::kAllGathering;
  }
  // kAllGathering -> kGathered: every block is in (the caller waited for `pending` or tested it
  // complete, and for the GatherSender's job); the collective goes.
  void finish_all_gather() {
    STRATA_ASSERT(state_ == GatherState::kAllGathering && pending, "no all-gather in flight");
    STRATA_ASSERT(send_job == 0, "all-gather finished before its own block's sender job");
    pending.reset();
    own_send_ = OwnSend::kNow;
    state_ = GatherState::kGathered;
  }
  // kLoading (one rank) or kGathered (several) -> kQueued: the copy and cast are on the streams,
  // ordered by `copied` and `ready`.
  void queue_copy() {
    STRATA_ASSERT(state_ == GatherState::kLoading || state_ == GatherState::kGathered,
                  "gather queued twice, or while an all-gather is in flight");
    STRATA_ASSERT(copied && ready, "a queued gather without its events");
    state_ = GatherState::kQueued;
  }
  // kQueued -> kReady: `ready` waited for (the cast, which waited for the copy, is done).
  void finish_queued() {
    STRATA_ASSERT(state_ == GatherState::kQueued, "waiting for a gather not queued");
    state_ = GatherState::kReady;
    release_staging();
  }
  // kLoading or kGathered -> kReady: the gather finished at use (all-gather, copy, cast waited).
  void mark_ready() {
    STRATA_ASSERT(state_ == GatherState::kLoading || state_ == GatherState::kGathered,
                  "gather finished from a state with work in flight");
    STRATA_ASSERT(reads.empty() && !pending, "gather finished with its reads or collective out");
    state_ = GatherState::kReady;
  }
  // Any state -> kEvicted: the caller waited for everything in flight (reads, the streams, the
  // collective and its own-block sender, an update writing into the buffers); the rest goes.
  void evict() {
    STRATA_ASSERT(reads.empty() && send_job == 0, "evicting a unit with reads or a send in flight");
    STRATA_ASSERT(state_ != GatherState::kQueued, "evicting a unit the streams still read");
    pending.reset();
    own_send_ = OwnSend::kNow;
    gather_lease.reset();
    fresh_groups_due_ = 0;
    fresh_dest_ = nullptr;
    own_ = OwnShard::kInHome;
    release_param_staging();
    full16.reset();
    full32.reset();
    state_ = GatherState::kEvicted;
  }

  // Transitions of OwnShard ----------------------------------------------------------------------
  // kInHome -> kReading (a fresh load) or kFromUpdate -> kReading (the update that was to hand
  // the shard over failed before it did: the store's shard is read instead). The caller then adds
  // one read per sub-group to `reads`.
  void begin_reads() {
    STRATA_ASSERT(state_ != GatherState::kEvicted, "reads for a unit not loaded");
    STRATA_ASSERT((own_ == OwnShard::kInHome || own_ == OwnShard::kFromUpdate) && reads.empty(),
                  "the own shard read twice");
    fresh_groups_due_ = 0;
    own_ = OwnShard::kReading;
  }
  // kReading -> kLanded: every read waited for without error.
  void finish_reads() {
    STRATA_ASSERT(own_ == OwnShard::kReading, "no reads to finish");
    reads.clear();
    own_ = OwnShard::kLanded;
  }
  // kInHome -> kFromUpdate: `groups` sub-groups come from the update, into `dest`.
  void await_update(std::size_t groups, std::byte* dest) {
    STRATA_ASSERT(state_ == GatherState::kLoading && own_ == OwnShard::kInHome,
                  "the own shard awaited from an update twice");
    STRATA_ASSERT(groups > 0 && dest != nullptr, "an update hand-over of nothing, or to nowhere");
    fresh_groups_due_ = groups;
    fresh_dest_ = dest;
    own_ = OwnShard::kFromUpdate;
  }
  // One sub-group handed over (on the update's thread); kFromUpdate -> kLanded after the last.
  void hand_over_group() {
    STRATA_ASSERT(own_ == OwnShard::kFromUpdate && fresh_groups_due_ > 0,
                  "a sub-group handed over to a load not waiting for one");
    if (--fresh_groups_due_ == 0) own_ = OwnShard::kLanded;
  }

  // The pinned memory the parameter reads land in on the staged path (param_lease or
  // param_buffer), or null.
  std::byte* param_staging() const {
    return param_lease ? param_lease.data() : param_buffer.data();
  }
  void release_param_staging() {
    param_lease.reset();
    param_buffer.reset();
  }
  // The staging a finished gather no longer needs: the parameter reads' and the gather's slot.
  void release_staging() {
    release_param_staging();
    gather_lease.reset();
  }

  // The data the states carry ---------------------------------------------------------------------
  // Buffers (kLoading on).
  tiers::DeviceBuffer full16;  // padded numel in the parameter dtype (absent for fp32 params)
  // The fp32 view GatheredUnit hands out: the padded unit (fp32 parameters: the parameters
  // themselves), or with 16-bit parameters the widened tensors packed (UnitState::fp32_views).
  tiers::DeviceBuffer full32;
  // OwnShard::kReading: the NVMe parameter reads, one per sub-group.
  std::vector<tiers::StoreRead> reads;
  // Staged device memory with parameters on NVMe: pinned memory the reads land in, copied to the
  // device by the gather. A lease of the parameter read slab, or (more loads in flight than the
  // slab holds, when the schedule changes) a one-off buffer.
  tiers::PinnedLease param_lease;
  tiers::PinnedBuffer param_buffer;
  std::uint32_t live_handles = 0;  // GatheredUnit handles not yet destroyed
  // The compute fence's ticket at the last release (Engine::set_compute_fence): the compute that
  // read the buffers, waited for before they go (evict). 0: nothing to wait for.
  std::uint64_t compute_ticket = 0;
  // kQueued: the h2d copy done (`copied`), then the cast (`ready`) on the streams. Created at the
  // unit's first queued gather and reused.
  std::optional<tiers::Event> copied;
  std::optional<tiers::Event> ready;
  // Several ranks on the staged path, a device home: the own shard's d2h into the gather's slot
  // done (start_gather_of_final_shard); the GatherSender sends the block after it.
  std::optional<tiers::Event> own_copied;
  // kAllGathering: the collective, and the GatherSender's job sending its own block (0: none).
  std::unique_ptr<comm::PendingAllGather> pending;
  std::uint64_t send_job = 0;
  // The staged path, a gather started ahead: the pinned slot it receives into (GatherAhead),
  // copied h2d once all blocks are in; released once the gather is on the device, or at evict.
  tiers::PinnedLease gather_lease;

 private:
  GatherState state_ = GatherState::kEvicted;
  OwnShard own_ = OwnShard::kInHome;
  OwnSend own_send_ = OwnSend::kNow;  // kAllGathering: who sends the own block
  // OwnShard::kFromUpdate: sub-groups still to be handed over, and where they land (kept through
  // the fall-back to reads, where those land too).
  std::size_t fresh_groups_due_ = 0;
  std::byte* fresh_dest_ = nullptr;
};

}  // namespace strata::runtime::detail
