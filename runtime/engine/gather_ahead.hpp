// The bookkeeping of gathers started ahead of use (gather.cpp). Not a public header.
//
// A gather starts ahead of its use when its unit is prefetched: with one rank on the staged path
// its copy and cast are queued on the streams (queue_gather), with several ranks its all-gather
// starts at the load (start_pending_gather). GatherAhead owns what that needs beyond each unit's
// GatheredCopy: the communicator keys of the all-gathers started ahead, the GatherSender that
// sends their own blocks from another thread, the pinned slots the staged path receives them in,
// and the count of gathers started before their unit was asked for (StepStats::
// gathers_queued_ahead). When to start one stays EngineState's (it depends on the homes, the step
// and the deferred updates). Owned by the Engine's thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "base/assert.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/gather_sender.hpp"
#include "tiers/pinned_pool.hpp"

namespace strata::runtime::detail {

class GatherAhead {
 public:
  // finalize, several ranks (Communicator::reserve_pending_keys): unit u's all-gather started
  // ahead is tagged key_base + u. Unset (or nullopt: the communicator's keys are used up): every
  // all-gather runs at wait_load.
  void set_key_base(std::optional<std::uint32_t> key_base) {
    STRATA_ASSERT(!key_base_, "the keys of gathers started ahead reserved twice");
    key_base_ = key_base;
  }
  bool across_ranks() const { return key_base_.has_value(); }
  std::uint32_t key_of(UnitId unit) const {
    STRATA_ASSERT(key_base_.has_value(), "a key for a gather started ahead without the keys");
    return *key_base_ + static_cast<std::uint32_t>(unit);
  }

  // finalize: the sender of the own blocks read from NVMe or copied d2h (gather_sender.hpp);
  // absent when the communicator cannot send from another thread, or no such shard exists.
  void start_sender() {
    STRATA_ASSERT(key_base_.has_value() && !sender_, "a GatherSender without keys, or twice");
    sender_ = std::make_unique<GatherSender>();
  }
  bool has_sender() const { return sender_ != nullptr; }
  GatherSender& sender() {
    STRATA_ASSERT(sender_ != nullptr, "no GatherSender");
    return *sender_;
  }
  // The Engine's end: runs what was submitted, then stops the thread.
  void stop_sender() { sender_.reset(); }

  // finalize, the staged path with collectives on the host (BufferPlan::gather_slots > 0).
  void allocate_slots(tiers::PinnedPool& pool, std::size_t count, std::uint64_t slot_bytes) {
    STRATA_ASSERT(!slots_ && count > 0, "gather slots allocated twice, or none");
    slots_ = pool.allocate_slab(count, slot_bytes);
  }
  // A free slot, or none (every slot claimed: the gather runs at use).
  std::optional<tiers::PinnedLease> try_claim_slot() {
    STRATA_ASSERT(slots_.has_value(), "a gather slot claimed without the slots");
    return slots_->try_acquire();
  }

  // gather() around its acquire: a gather started for another unit meanwhile is a prefetch's.
  void begin_acquire(UnitId unit) {
    STRATA_ASSERT(!acquiring_, "gather() re-entered");
    acquiring_ = unit;
  }
  void end_acquire() { acquiring_.reset(); }
  // A gather of `unit` started (queued, or all-gathered) now; counted when it is ahead of use.
  void count_started(UnitId unit) {
    if (acquiring_ != unit) ++started_ahead_;
  }
  // Gathers started ahead since the last call (StepStats::gathers_queued_ahead).
  std::uint64_t take_started_count() { return std::exchange(started_ahead_, 0); }

 private:
  std::optional<std::uint32_t> key_base_;
  std::unique_ptr<GatherSender> sender_;
  std::optional<tiers::PinnedSlab> slots_;
  std::optional<UnitId> acquiring_;  // the unit gather() is acquiring
  std::uint64_t started_ahead_ = 0;  // since the last step
};

}  // namespace strata::runtime::detail
