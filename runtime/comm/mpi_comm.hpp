// MpiComm: collectives between processes started by mpirun (one machine or several), over Open MPI.
//
// - MPI is initialised on first use with MPI_Init_thread(MPI_THREAD_SERIALIZED) and finalised when
//   the process exits normally (static destruction). SERIALIZED means: any thread may call a
//   collective, but never two at once, and no other thread may use MPI meanwhile unless the
//   application serialises those calls too. If the application initialised MPI itself, its thread
//   level is kept.
// - The communicator duplicates MPI_COMM_WORLD (its own matching space) with MPI_ERRORS_RETURN, so
//   every MPI failure becomes an MpiError naming the rank, the collective and MPI_Error_string.
// - Every collective is nonblocking: all-gather, reduce-scatter and all-reduce post one MPI_Irecv
//   from and one MPI_Isend to every peer at once (exchange()), broadcast and barrier are MPI_Ibcast
//   and MPI_Ibarrier. The requests are polled with MPI_Testall, yielding the core between polls
//   for the first 50 ms, then sleeping between polls with exponential backoff up to 1 ms (a rank
//   waiting for a slow peer does not spin a core), until the deadline (CommOptions::timeout). On
//   timeout it reads, through a one-sided MPI window, which collective each rank has reached,
//   withdraws its requests (cancels them, waits up to 1 s for them to complete) and throws
//   CommTimeoutError naming the missing ranks: no request stays posted on the caller's buffers.
//   When MPI cannot withdraw one (Open MPI cannot cancel a rendezvous send the late rank never
//   matched, nor a broadcast), it calls abort_all() with that error instead of returning.
// - Reductions never use MPI's reduction operators: reduce_scatter receives block r of every rank
//   and reduces the N blocks locally in rank order; all_reduce does the same on N chunks, then
//   all-gathers the reduced chunks. Hence fp32 accumulation, one rounding, rank order: bitwise
//   deterministic, and each rank sends exactly the ring algorithm's bytes (see CollectiveStats).
// - Gathers started ahead of use (start_all_gather, PendingAllGather) run on a second duplicate of
//   MPI_COMM_WORLD, so their messages never match a blocking collective's: the receives and the
//   own block's sends are posted at the start, and the tag is the caller's key
//   (the Engine's reserved key base + unit id), so gathers of different keys complete in any
//   order. MPI orders messages of one tag between two ranks (non-overtaking), which matches the
//   gathers of one key in the order they started. Their progress happens inside MPI calls
//   (test(), wait(), the other collectives). A gather started with OwnBlock::kLater posts only the
//   receives; send_own() posts the sends, from another thread when MPI runs at
//   MPI_THREAD_MULTIPLE (what strata asks for when it initialises MPI; it accepts
//   MPI_THREAD_SERIALIZED, and then sends_from_any_thread() is false).
// - After any error the communicator is poisoned (later calls throw) and its destructor frees
// nothing
//   collective; the intended reaction is abort_all(), which ends every rank of the job.
// - Counts are limited to INT_MAX elements per call (MPI's int counts); larger calls throw
// CommError.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "runtime/comm/communicator.hpp"

namespace strata::runtime::comm {

// Initialises MPI if no one has (MPI_THREAD_SERIALIZED) and arranges MPI_Finalize at exit.
void ensure_mpi_initialized();

// Ends the whole job now: prints "strata: rank R aborting the job: <reason>" to stderr and calls
// MPI_Abort(MPI_COMM_WORLD, exit_code), which makes mpirun kill every rank and exit with exit_code.
// Without MPI (a LocalComm run) it prints the same line and _Exit(exit_code)s. Safe to call from a
// catch block on any rank; it never returns.
[[noreturn]] void abort_all(std::string_view reason, int exit_code = 1) noexcept;

class MpiComm final : public Communicator {
 public:
  // Collective over MPI_COMM_WORLD: every rank constructs its MpiComm at the same point.
  explicit MpiComm(const CommOptions& options = {});
  ~MpiComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend_name() const override { return "mpi"; }
  bool poisoned() const { return !first_error_.empty(); }
  // Requests of this communicator still posted in MPI: 0 between collectives, and after a timeout
  // (which withdraws them before it throws), but for a timed-out barrier's, which uses no memory.
  std::size_t pending_requests() const;
  bool has_pending_all_gathers() const override { return true; }
  bool sends_from_any_thread() const override { return thread_multiple_; }
  std::uint32_t max_pending_key() const override;

 protected:
  void do_all_gather(ConstBuffer send, MutableBuffer recv) override;
  void do_reduce_scatter(ConstBuffer send, MutableBuffer recv, ReduceOp op) override;
  void do_all_reduce(MutableBuffer data, ReduceOp op) override;
  void do_broadcast(MutableBuffer data, int root) override;
  void do_barrier() override;
  std::unique_ptr<PendingAllGather> do_start_all_gather(MutableBuffer recv, std::size_t count,
                                                         std::uint32_t key, OwnBlock own) override;

 private:
  friend class MpiPendingAllGather;

  struct State;  // MPI handles, the arrival window, scratch (keeps <mpi.h> out of this header)

  void begin(Collective collective);
  // Sends block p of send_base to every peer p and receives block p of recv_base from it (the
  // per-peer counts and offsets in State), all messages in flight at once; the own block is copied.
  void exchange(Collective collective, int phase, DType dtype, const std::byte* send_base,
                std::byte* recv_base);
  void wait(Collective collective);
  // After a timeout: cancels what MPI can cancel and waits (bounded) for every request of the
  // collective to complete. True when none is left posted.
  bool withdraw_requests();
  [[noreturn]] void fail_timeout(Collective collective);
  void check(int mpi_result, Collective collective, std::string_view call);
  void check_count(std::size_t count, Collective collective);

  CommOptions options_;
  bool thread_multiple_ = false;  // MPI_Query_thread: MPI_THREAD_MULTIPLE
  int rank_ = 0;
  int size_ = 1;
  std::uint64_t sequence_ = 0;  // collectives entered so far (the current one included)
  std::string first_error_;
  std::unique_ptr<State> state_;
  int uncaught_at_construction_ = 0;
};

}  // namespace strata::runtime::comm
