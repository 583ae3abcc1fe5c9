// The staged path's gradient moves in flight (reduce_grads.cpp, queue_grad_move): a unit's padded
// fp32 gradient copied d2h into one of two pinned slots, its host part (reduce-scatter, store,
// norm) run at the next reduce_grads or whenever the gradients are needed. Not a public header.
//
// GradMoves owns the slots and the bookkeeping: at most two moves in flight, one per slot, the
// slots used in turn, finished in call order. The streams, events and the host part stay with
// EngineState. Owned by the Engine's thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "base/assert.hpp"
#include "runtime/engine/engine.hpp"
#include "tiers/pinned_pool.hpp"

namespace strata::runtime::detail {

class GradMoves {
 public:
  static constexpr std::size_t kSlots = 2;

  struct Move {
    UnitId unit = 0;
    std::size_t slot = 0;  // slot(slot), DeviceLanes::grad_moved[slot]
    bool accumulate = false;
    bool last = false;
  };

  // finalize (BufferPlan::grad_move_slot_bytes > 0): the two slots.
  void allocate(tiers::PinnedPool& pool, std::uint64_t slot_bytes) {
    STRATA_ASSERT(!enabled() && slot_bytes > 0, "gradient move slots allocated twice");
    for (tiers::PinnedBuffer& slot : slots_) slot = pool.allocate(slot_bytes);
  }
  // Whether gradients are moved this way at all (the plan gave the slots).
  bool enabled() const { return static_cast<bool>(slots_[0]); }

  // The slot the next move copies into, and whether a move is still in flight.
  std::size_t next_slot() const { return next_; }
  bool empty() const { return count_ == 0; }
  std::size_t in_flight() const { return count_; }
  std::byte* slot(std::size_t index) const {
    STRATA_ASSERT(index < kSlots && slots_[index], "a gradient move slot that does not exist");
    return slots_[index].data();
  }

  // A move into next_slot() queued on the streams; that slot must be free.
  void push(const Move& move) {
    STRATA_ASSERT(move.slot == next_ && count_ < kSlots, "a gradient slot still in use");
    moves_[(head_ + count_) % kSlots] = move;
    ++count_;
    next_ = 1 - move.slot;
    ++queued_;
  }
  // The oldest move in flight, taken off (one that fails is reported once, not retried).
  Move pop_oldest() {
    STRATA_ASSERT(count_ > 0, "no gradient move in flight");
    const Move move = moves_[head_];
    head_ = (head_ + 1) % kSlots;
    --count_;
    return move;
  }
  // Every move in flight, oldest first, forgotten (discard_grad_moves: nothing is stored).
  template <typename Visit>
  void drop_all(Visit&& visit) {
    for (std::size_t i = 0; i < count_; ++i) visit(moves_[(head_ + i) % kSlots]);
    head_ = 0;
    count_ = 0;
  }
  // Moves queued since the last call (StepStats::grad_moves_queued).
  std::uint64_t take_queued_count() { return std::exchange(queued_, 0); }

 private:
  std::array<tiers::PinnedBuffer, kSlots> slots_;
  // The moves in flight, oldest at head_: a ring as deep as the slots.
  std::array<Move, kSlots> moves_{};
  std::size_t head_ = 0;
  std::size_t count_ = 0;
  std::size_t next_ = 0;      // the slot the next move uses
  std::uint64_t queued_ = 0;  // since the last step
};

}  // namespace strata::runtime::detail
