// ResidencyManager: which units are resident in a budgeted tier (gathered parameters on the
// device, staged shards in host memory), what to load ahead, and what to evict.
//
// The first iteration records the order in which units are acquired; end_iteration() freezes it
// as the schedule, and later iterations replay it. With a schedule, every acquire starts loads of
// the next `prefetch_depth` units (within the byte budget and the in-flight limit), and when the
// budget is full the manager evicts the resident unit whose next use lies furthest ahead (Belady's
// rule, exact here because the schedule is known). Dirty units are written back before eviction.
// If an iteration departs from the schedule, the manager records that iteration anew.
//
// The manager decides; a ResidencyClient does the work (allocations, copies, I/O), so the same
// policy runs over the real device and NVMe store and over the test's simulated slow storage.
//
// Threading: one owner thread calls everything. Client loads may complete on other threads; the
// manager only polls and waits through the client.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace strata::tiers {

using UnitId = std::uint32_t;

// A load has an asynchronous part (start_load: e.g. an NVMe read) and a finishing part (wait_load:
// e.g. the all-gather and cast that make the gathered unit). The manager calls wait_load exactly
// once per load, from acquire(), so finishing work runs in schedule order on the owner thread; with
// ResidencyOptions::rank_independent the same units on every rank, as collectives require.
class ResidencyClient {
 public:
  virtual ~ResidencyClient() = default;
  // Allocates the unit's resident buffer and starts its asynchronous part; returns at once.
  virtual void start_load(UnitId unit) = 0;
  // Whether the asynchronous part has completed. No side effects.
  virtual bool load_complete(UnitId unit) = 0;
  // Blocks until the asynchronous part has completed, then finishes the load; rethrows failures.
  virtual void wait_load(UnitId unit) = 0;
  // Writes a dirty unit back to its home; returns when that is durable enough to evict.
  virtual void write_back(UnitId unit) = 0;
  // Frees the unit's resident buffer. A load that was never finished (a prefetch evicted before
  // use) may still be in flight: the client waits for its asynchronous part first.
  virtual void evict(UnitId unit) = 0;
};

struct ResidencyOptions {
  std::uint64_t budget_bytes = 0;    // resident + loading bytes never exceed this
  std::uint32_t prefetch_depth = 2;  // units loaded ahead of the one acquired
  std::uint64_t max_inflight_bytes = std::numeric_limits<std::uint64_t>::max();
  // Decide (prefetch, evict) without asking which loads have completed: a started load counts as
  // in flight until acquire finishes it. The units finished (wait_load) then follow from the
  // acquires alone, the same on every rank, which the Engine's all-gathers in wait_load need:
  // otherwise one rank's faster disk can change what it evicts, and a later acquire gathers on
  // that rank only. Costs prefetches only where max_inflight_bytes binds.
  bool rank_independent = false;
};

struct ResidencyStats {
  std::uint64_t acquires = 0;
  std::uint64_t ready_hits = 0;  // already resident and loaded when acquired
  std::uint64_t waits = 0;  // acquire had to block on a load (prefetched too late or not at all)
  std::uint64_t demand_loads = 0;  // acquire found the unit absent and started its load itself
  std::uint64_t prefetches = 0;
  std::uint64_t evictions = 0;
  std::uint64_t write_backs = 0;
  std::uint64_t schedule_rerecords = 0;
  std::uint64_t resident_bytes = 0;
  std::uint64_t high_water_bytes = 0;
};

// Nothing can be evicted to make room: every resident unit is in use or persistent.
class ResidencyBudgetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ResidencyManager {
 public:
  ResidencyManager(ResidencyClient& client, const ResidencyOptions& options,
                   std::vector<std::uint64_t> unit_bytes, std::string tier_name = "device");
  ResidencyManager(const ResidencyManager&) = delete;
  ResidencyManager& operator=(const ResidencyManager&) = delete;

  // Keeps `unit` resident for good once loaded (small units: fewer tiny transfers). Its bytes count
  // against the budget.
  void set_persistent(UnitId unit);
  // Returns when `unit` is resident and loaded; it stays resident until release(). Acquiring a
  // unit already in use nests (released as often as acquired).
  void acquire(UnitId unit);
  // `dirty`: the resident copy changed and must be written back before it is evicted.
  void release(UnitId unit, bool dirty = false);
  // Closes an iteration: the first closes the recording and starts replaying it.
  void end_iteration();
  // Writes back every dirty unit and evicts everything not in use (e.g. before a checkpoint).
  void flush();
  // Evicts every unit not in use, persistent ones included, without writing back: their home
  // copies changed (after an optimizer step), so the resident copies are stale.
  void invalidate();

  bool has_schedule() const { return !schedule_.empty() && !recording_; }
  const std::vector<UnitId>& schedule() const { return schedule_; }
  bool is_resident(UnitId unit) const { return units_[unit].state != State::kAbsent; }
  const ResidencyStats& stats() const { return stats_; }
  std::uint64_t budget_bytes() const { return options_.budget_bytes; }

 private:
  // kLoading: started, not finished (its asynchronous part may have completed); kLoaded: finished.
  enum class State : std::uint8_t { kAbsent, kLoading, kLoaded };
  struct Unit {
    std::uint64_t bytes = 0;
    State state = State::kAbsent;
    std::uint32_t users = 0;
    bool dirty = false;
    bool persistent = false;
    std::uint64_t last_use = 0;  // for least-recently-used choice when the schedule is unknown
  };

  void start_load(UnitId unit);
  // Makes room for `bytes`; evicts only units whose next use is later than `needed_at` (a position
  // in the replay), or any evictable unit when needed_at is nullopt. False if it cannot.
  bool make_room(std::uint64_t bytes, std::optional<std::uint64_t> needed_at);
  void evict(UnitId unit);
  // Distance (in acquires) from the current replay position to the unit's next use.
  std::uint64_t next_use_distance(UnitId unit) const;
  void prefetch_ahead();
  std::uint64_t inflight_bytes() const;
  bool load_done(UnitId unit) const;

  ResidencyClient* client_;
  ResidencyOptions options_;
  std::string tier_name_;
  std::vector<Unit> units_;
  std::vector<UnitId> recorded_;
  std::vector<UnitId> schedule_;
  bool recording_ = true;
  std::uint64_t cursor_ = 0;
  std::uint64_t use_clock_ = 0;
  // True when `a` (next use in a_distance) is a better victim than `b`.
  bool better_victim(UnitId a, std::uint64_t a_distance, UnitId b, std::uint64_t b_distance)
      const;  // replay position: index of the next expected acquire
  std::vector<std::vector<std::uint64_t>> uses_;  // per unit: its positions in schedule_
  ResidencyStats stats_;
};

}  // namespace strata::tiers
