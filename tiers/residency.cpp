#include "tiers/residency.hpp"

#include <algorithm>

#include <fmt/format.h>

#include "base/assert.hpp"

namespace strata::tiers {
namespace {
constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();
}

ResidencyManager::ResidencyManager(ResidencyClient& client, const ResidencyOptions& options,
                                   std::vector<std::uint64_t> unit_bytes, std::string tier_name)
    : client_(&client), options_(options), tier_name_(std::move(tier_name)) {
  units_.resize(unit_bytes.size());
  for (std::size_t i = 0; i < unit_bytes.size(); ++i) units_[i].bytes = unit_bytes[i];
  uses_.resize(unit_bytes.size());
}

void ResidencyManager::set_persistent(UnitId unit) {
  units_.at(unit).persistent = true;
}

void ResidencyManager::acquire(UnitId unit) {
  STRATA_ASSERT(unit < units_.size(), "unknown unit");
  ++stats_.acquires;
  if (recording_) {
    recorded_.push_back(unit);
  } else if (cursor_ < schedule_.size() && schedule_[cursor_] == unit) {
    ++cursor_;
  } else {
    // The iteration departs from the schedule: record it anew from here.
    ++stats_.schedule_rerecords;
    recorded_.assign(schedule_.begin(), schedule_.begin() + static_cast<std::ptrdiff_t>(cursor_));
    recorded_.push_back(unit);
    recording_ = true;
  }

  Unit& entry = units_[unit];
  ++entry.users;
  entry.last_use = ++use_clock_;
  bool must_wait = false;
  switch (entry.state) {
    case State::kLoaded:
      ++stats_.ready_hits;
      break;
    case State::kLoading:
      if (client_->load_complete(unit)) {
        ++stats_.ready_hits;
      } else {
        must_wait = true;
      }
      break;
    case State::kAbsent:
      if (!make_room(entry.bytes, std::nullopt)) {
        --entry.users;
        std::uint32_t pinned = 0;
        for (const Unit& other : units_)
          pinned += other.state != State::kAbsent && (other.users > 0 || other.persistent);
        throw ResidencyBudgetError(fmt::format(
            "the {} tier's budget of {} bytes cannot hold unit {} ({} bytes): {} bytes are "
            "resident in {} units that are in use or persistent",
            tier_name_, options_.budget_bytes, unit, entry.bytes, stats_.resident_bytes, pinned));
      }
      ++stats_.demand_loads;
      start_load(unit);
      must_wait = true;
      break;
  }
  // Start the next loads before blocking, so they overlap this wait.
  prefetch_ahead();
  if (must_wait) ++stats_.waits;
  if (entry.state == State::kLoading) {
    client_->wait_load(unit);
    entry.state = State::kLoaded;
  }
}

void ResidencyManager::release(UnitId unit, bool dirty) {
  Unit& entry = units_.at(unit);
  STRATA_ASSERT(entry.users > 0, "release without acquire");
  --entry.users;
  entry.dirty = entry.dirty || dirty;
}

void ResidencyManager::end_iteration() {
  if (recording_) {
    schedule_ = std::move(recorded_);
    recorded_.clear();
    recording_ = false;
    for (auto& positions : uses_) positions.clear();
    for (std::size_t position = 0; position < schedule_.size(); ++position) {
      uses_[schedule_[position]].push_back(position);
    }
  }
  cursor_ = 0;
  prefetch_ahead();  // the next iteration's first units
}

void ResidencyManager::flush() {
  for (UnitId unit = 0; unit < units_.size(); ++unit) {
    Unit& entry = units_[unit];
    if (entry.state == State::kAbsent || entry.users > 0) continue;
    if (entry.persistent && entry.state == State::kLoaded) {
      if (entry.dirty) {
        client_->write_back(unit);
        ++stats_.write_backs;
        entry.dirty = false;
      }
      continue;
    }
    evict(unit);
  }
}

void ResidencyManager::invalidate() {
  for (UnitId unit = 0; unit < units_.size(); ++unit) {
    Unit& entry = units_[unit];
    if (entry.state == State::kAbsent || entry.users > 0) continue;
    entry.dirty = false;
    evict(unit);
  }
}

void ResidencyManager::start_load(UnitId unit) {
  Unit& entry = units_[unit];
  STRATA_ASSERT(entry.state == State::kAbsent, "loading a resident unit");
  STRATA_ASSERT(stats_.resident_bytes + entry.bytes <= options_.budget_bytes, "budget overrun");
  stats_.resident_bytes += entry.bytes;
  stats_.high_water_bytes = std::max(stats_.high_water_bytes, stats_.resident_bytes);
  entry.state = State::kLoading;
  client_->start_load(unit);
}

std::uint64_t ResidencyManager::next_use_distance(UnitId unit) const {
  const std::vector<std::uint64_t>& positions = uses_[unit];
  if (recording_ || positions.empty()) return kNever;
  const auto next = std::lower_bound(positions.begin(), positions.end(), cursor_);
  if (next != positions.end()) return *next - cursor_;
  return schedule_.size() - cursor_ + positions.front();  // in the next iteration
}

bool ResidencyManager::better_victim(UnitId a, std::uint64_t a_distance, UnitId b,
                                     std::uint64_t b_distance) const {
  if (a_distance != b_distance) return a_distance > b_distance;
  return units_[a].last_use < units_[b].last_use;
}

bool ResidencyManager::make_room(std::uint64_t bytes, std::optional<std::uint64_t> needed_at) {
  if (bytes > options_.budget_bytes) return false;
  while (stats_.resident_bytes + bytes > options_.budget_bytes) {
    std::optional<UnitId> victim;
    std::uint64_t victim_distance = 0;
    // A prefetch whose I/O is still in flight is evicted only by a demand load, and only when
    // nothing else can go (it then waits for that prefetch).
    const auto pick_victim = [&](bool take_in_flight) {
      for (UnitId unit = 0; unit < units_.size(); ++unit) {
        const Unit& entry = units_[unit];
        if (entry.state == State::kAbsent || entry.users > 0 || entry.persistent) continue;
        if (!take_in_flight && entry.state == State::kLoading && !load_done(unit)) {
          continue;
        }
        const std::uint64_t distance = next_use_distance(unit);
        if (!victim || better_victim(unit, distance, *victim, victim_distance)) {
          victim = unit;
          victim_distance = distance;
        }
      }
    };
    pick_victim(false);
    if (!victim && !needed_at) pick_victim(true);
    if (!victim) return false;
    // A prefetch never evicts what is needed sooner than what it loads.
    if (needed_at && victim_distance != kNever && victim_distance <= *needed_at) return false;
    evict(*victim);
  }
  return true;
}

void ResidencyManager::evict(UnitId unit) {
  Unit& entry = units_[unit];
  STRATA_ASSERT(entry.state != State::kAbsent && entry.users == 0, "evicting a unit in use");
  if (entry.dirty && entry.state == State::kLoaded) {
    client_->write_back(unit);
    ++stats_.write_backs;
    entry.dirty = false;
  }
  client_->evict(unit);
  entry.state = State::kAbsent;
  stats_.resident_bytes -= entry.bytes;
  ++stats_.evictions;
}

// A decision's view of a started load: with rank_independent it is in flight until acquire finishes
// it, whatever its I/O did, so every rank decides the same.
bool ResidencyManager::load_done(UnitId unit) const {
  return !options_.rank_independent && client_->load_complete(unit);
}

std::uint64_t ResidencyManager::inflight_bytes() const {
  std::uint64_t bytes = 0;
  for (UnitId unit = 0; unit < units_.size(); ++unit) {
    if (units_[unit].state == State::kLoading && !load_done(unit)) {
      bytes += units_[unit].bytes;
    }
  }
  return bytes;
}

void ResidencyManager::prefetch_ahead() {
  if (!has_schedule() || options_.prefetch_depth == 0) return;
  const std::uint64_t window = std::min<std::uint64_t>(options_.prefetch_depth, schedule_.size());
  for (std::uint64_t ahead = 0; ahead < window; ++ahead) {
    const UnitId unit = schedule_[(cursor_ + ahead) % schedule_.size()];
    const Unit& entry = units_[unit];
    if (entry.state != State::kAbsent) continue;
    if (inflight_bytes() + entry.bytes > options_.max_inflight_bytes) return;
    // Keep the schedule's order: if this one cannot be loaded yet, neither are later ones.
    if (!make_room(entry.bytes, ahead)) return;
    ++stats_.prefetches;
    start_load(unit);
  }
}

}  // namespace strata::tiers
