// ComputeFence: how a caller waits for compute that returned before it was done. A model whose
// unit calls only queue their work (the CUDA decoder's asynchronous calls) hands one out; the
// Engine holds a ticket for each gathered unit released while its compute may still read it and
// waits on that ticket before it frees the unit's buffers, and the training passes wait on one
// before they read a unit's gradient. See [Note: asynchronous unit calls] in docs/design.md.
//
// Tickets count calls: mark() names everything submitted so far, and waiting for a ticket waits for
// that work and everything before it (one in-order queue). Ticket 0 is done from the start.
// Threading: one owner thread, the one that submits the compute.
#pragma once

#include <cstdint>

namespace strata::tiers {

class ComputeFence {
 public:
  virtual ~ComputeFence() = default;
  // A ticket for the compute submitted so far.
  virtual std::uint64_t mark() = 0;
  // Returns once the compute `ticket` names is done; throws that compute's error (a CUDA fault).
  virtual void wait(std::uint64_t ticket) = 0;
};

// The fence of compute that is done when its call returns (the host models): every ticket is done.
// Runs the asynchronous schedule over synchronous calls, e.g. to test that the schedule alone
// leaves every bit as it was.
class ImmediateFence final : public ComputeFence {
 public:
  std::uint64_t mark() override { return ++marks_; }
  void wait(std::uint64_t ticket) override { waited_ = ticket > waited_ ? ticket : waited_; }
  std::uint64_t marks() const { return marks_; }
  std::uint64_t highest_waited() const { return waited_; }

 private:
  std::uint64_t marks_ = 0;
  std::uint64_t waited_ = 0;
};

}  // namespace strata::tiers
