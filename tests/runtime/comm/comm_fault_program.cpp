// Fault scenarios for MpiComm, run by CTest under mpirun (see tests/runtime/comm/CMakeLists.txt):
//   timeout  rank 1 skips an all_reduce: the others must get CommTimeoutError naming all_reduce and
//            rank 1 within the timeout, and the communicator must refuse further use. Verdicts are
//            combined over MPI_COMM_WORLD; exit 0 iff every rank saw what it should.
//   throw    rank 1 throws mid-step and its top-level handler calls abort_all(): every rank must
//   end
//            (mpirun exits non-zero) although ranks 0, 2, ... wait in a collective rank 1 never
//            joins.
//   mismatch rank 1 calls barrier where the others call all_reduce: every rank must time out with
//   an
//            error that names the other side's collective (called in different orders).
//   mpi-error  the ranks broadcast different lengths (root 100 elements, the others 10): the
//            receivers must get an MpiError naming broadcast and carrying MPI's error text.
//   hang     rank 1 stops without an error (sleeps outside MPI): the others time out and
//   abort_all(),
//            so the job ends non-zero instead of hanging.
//   withdraw rank 1 skips an all_gather: the others time out with no request left posted, free
//            and reuse their buffers, and a collective on a new communicator then succeeds.
//   pending  the others start a gather ahead of use (start_all_gather) that rank 1 never starts:
//            their wait() must throw CommTimeoutError naming all_gather and rank 1 within the
//            timeout, with no request left on the buffer, which is then freed.
//   backoff  rank 1 enters a barrier and an all_reduce 1.5 s late: the waiting ranks' CPU time
//            stays under a quarter of the wall time (the wait sleeps instead of spinning).
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/mpi_comm.hpp"

namespace {

using namespace strata::runtime::comm;
using Clock = std::chrono::steady_clock;

constexpr auto kTimeout = std::chrono::milliseconds(2000);

int fail(int rank, const std::string& message) {
  std::fprintf(stderr, "[rank %d] FAILED: %s\n", rank, message.c_str());
  return 1;
}

// Returns this rank's failure count (0 or 1).
int run_timeout(MpiComm& comm) {
  if (comm.rank() == 1) return 0;  // skips the all_reduce below
  std::uint64_t value = 1;
  const auto start = Clock::now();
  try {
    comm.all_reduce(std::span<std::uint64_t>(&value, 1), ReduceOp::kSum);
    return fail(comm.rank(), "all_reduce completed although rank 1 never joined");
  } catch (const CommTimeoutError& error) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const std::string text = error.what();
    std::fprintf(stderr, "[rank %d] got the expected error after %.2f s: %s\n", comm.rank(),
                 elapsed, text.c_str());
    if (error.collective() != Collective::kAllReduce) return fail(comm.rank(), "wrong collective");
    if (error.missing_ranks() != std::vector<int>{1})
      return fail(comm.rank(), "wrong missing ranks");
    if (text.find("all_reduce") == std::string::npos ||
        text.find("rank(s) 1 did not arrive") == std::string::npos) {
      return fail(comm.rank(), "message does not name all_reduce and rank 1");
    }
    if (elapsed < 1.9 || elapsed > 2.0 + 3.0) return fail(comm.rank(), "timeout not honoured");
  }
  try {
    comm.barrier();
    return fail(comm.rank(), "a poisoned communicator accepted another collective");
  } catch (const CommTimeoutError&) {
    return fail(comm.rank(), "poisoned communicator waited instead of refusing");
  } catch (const CommError& error) {
    if (std::strstr(error.what(), "unusable") == nullptr) return fail(comm.rank(), error.what());
  }
  return 0;
}

int run_pending(MpiComm& comm) {
  const std::size_t count = 8;
  auto buffer = std::make_unique<std::vector<float>>(count * static_cast<std::size_t>(comm.size()),
                                                     1.0f);
  if (comm.rank() == 1) return 0;  // never starts it: its block never comes
  auto gather = comm.start_all_gather(MutableBuffer::of(std::span<float>(*buffer)), count, 7);
  const auto start = Clock::now();
  try {
    gather->wait();
    return fail(comm.rank(), "a gather completed although rank 1 never sent its block");
  } catch (const CommTimeoutError& error) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const std::string text = error.what();
    std::fprintf(stderr, "[rank %d] got the expected error after %.2f s: %s\n", comm.rank(),
                 elapsed, text.c_str());
    if (error.collective() != Collective::kAllGather) return fail(comm.rank(), "wrong collective");
    if (error.missing_ranks() != std::vector<int>{1})
      return fail(comm.rank(), "wrong missing ranks");
    if (text.find("all_gather") == std::string::npos || text.find("rank 1") == std::string::npos)
      return fail(comm.rank(), "message does not name all_gather and rank 1");
    if (elapsed < 1.9 || elapsed > 2.0 + 3.0) return fail(comm.rank(), "timeout not honoured");
  }
  gather.reset();  // nothing left posted: destroying it neither aborts nor waits
  buffer.reset();
  return 0;
}

int run_mismatch(MpiComm& comm) {
  try {
    if (comm.rank() == 1) {
      comm.barrier();
    } else {
      std::vector<float> values(64, 1.0f);
      comm.all_reduce(std::span<float>(values), ReduceOp::kSum);
    }
    return fail(comm.rank(), "mismatched collectives completed");
  } catch (const CommTimeoutError& error) {
    std::fprintf(stderr, "[rank %d] got the expected error: %s\n", comm.rank(), error.what());
    const char* expected = comm.rank() == 1 ? "is in all_reduce #1" : "rank 1 is in barrier #1";
    if (std::strstr(error.what(), expected) == nullptr ||
        std::strstr(error.what(), "different orders") == nullptr) {
      return fail(comm.rank(), std::string("message lacks '") + expected + "'");
    }
    return 0;
  }
}

int run_mpi_error(MpiComm& comm) {
  std::vector<float> data(comm.rank() == 0 ? 100 : 10, 1.0f);
  try {
    comm.broadcast(std::span<float>(data), 0);
    if (comm.rank() == 0) return 0;  // the root may finish: it sent what it had
    return fail(comm.rank(), "a truncated broadcast succeeded");
  } catch (const MpiError& error) {
    std::fprintf(stderr, "[rank %d] got the expected error: %s\n", comm.rank(), error.what());
    if (error.collective() != Collective::kBroadcast) return fail(comm.rank(), "wrong collective");
    if (std::strstr(error.what(), "MPI error") == nullptr ||
        std::strstr(error.what(), "rank ") == nullptr) {
      return fail(comm.rank(), "message lacks the rank or MPI's error text");
    }
    return 0;
  }
}

// Regression (issue 14): a timed-out collective used to leave its Irecv/Isend posted on buffers the
// caller then freed.
int run_withdraw(MpiComm& comm) {
  const auto ranks = static_cast<std::size_t>(comm.size());
  int failures = 0;
  if (comm.rank() != 1) {  // rank 1 skips the all_gather
    auto send = std::make_unique<std::uint64_t[]>(4);
    auto recv = std::make_unique<std::uint64_t[]>(4 * ranks);
    try {
      comm.all_gather(std::span<const std::uint64_t>(send.get(), 4),
                      std::span<std::uint64_t>(recv.get(), 4 * ranks));
      failures += fail(comm.rank(), "all_gather completed although rank 1 never joined");
    } catch (const CommTimeoutError&) {
      if (comm.pending_requests() != 0) {
        failures += fail(comm.rank(), std::to_string(comm.pending_requests()) +
                                          " requests still posted after the timeout");
      }
    }
    send.reset();  // freed while MPI would still write them, had the requests stayed
    recv.reset();
  }
  // Every rank, rank 1 included, goes on with a new communicator and fresh buffers.
  MpiComm fresh(CommOptions{kTimeout});
  std::vector<std::uint64_t> mine(4, static_cast<std::uint64_t>(fresh.rank()) + 100);
  std::vector<std::uint64_t> all(4 * ranks, 0);
  fresh.all_gather(std::span<const std::uint64_t>(mine), std::span<std::uint64_t>(all));
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all[i] != i / 4 + 100) {
      failures += fail(fresh.rank(), "the all_gather after the timeout gathered wrong values");
      break;
    }
  }
  return failures;
}

double thread_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

// Regression (issue 14): the wait loop spun a core (MPI_Testall + yield) for as long as it waited.
int run_backoff(MpiComm& impatient) {
  constexpr auto kLate = std::chrono::milliseconds(1500);
  impatient.barrier();
  MpiComm comm(CommOptions{std::chrono::seconds(30)});  // kLate is near kTimeout on a loaded CI
  int failures = 0;
  for (const char* collective : {"barrier", "all_reduce"}) {
    comm.barrier();
    std::vector<float> values(256, 1.0f);
    const auto wall_start = Clock::now();
    const double cpu_start = thread_cpu_seconds();
    if (comm.rank() == 1) std::this_thread::sleep_for(kLate);
    if (std::strcmp(collective, "barrier") == 0) {
      comm.barrier();
    } else {
      comm.all_reduce(std::span<float>(values), ReduceOp::kSum);
    }
    const double wall = std::chrono::duration<double>(Clock::now() - wall_start).count();
    const double cpu = thread_cpu_seconds() - cpu_start;
    if (comm.rank() == 1) continue;
    std::fprintf(stderr, "[rank %d] %s waited %.3f s wall, %.3f s CPU\n", comm.rank(), collective,
                 wall, cpu);
    if (wall < 1.0) failures += fail(comm.rank(), "the late rank did not make this rank wait");
    if (cpu > 0.25 * wall) {
      failures += fail(comm.rank(), std::string(collective) + " spun a core while waiting");
    }
  }
  return failures;
}

void run_throw(MpiComm& comm) {
  comm.barrier();
  if (comm.rank() == 1)
    throw std::runtime_error("injected failure on rank 1 in the middle of a step");
  std::vector<float> gradients(1024, 1.0f);
  comm.all_reduce(std::span<float>(gradients), ReduceOp::kSum);  // rank 1 never arrives
}

void run_hang(MpiComm& comm) {
  comm.barrier();
  if (comm.rank() == 1) {
    std::this_thread::sleep_for(
        std::chrono::seconds(60));  // stuck outside MPI; killed by the abort
  }
  comm.barrier();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  ensure_mpi_initialized();
  // Leaked on purpose in the timeout mode: after a timeout no collective frees are possible (rank 1
  // would wait in MPI_Win_free for ranks that no longer call it); MPI_Finalize cleans up.
  auto* comm = new MpiComm(CommOptions{kTimeout});
  try {
    if (mode == "timeout" || mode == "mismatch" || mode == "mpi-error" || mode == "withdraw" ||
        mode == "backoff" || mode == "pending") {
      const int failures = mode == "timeout"    ? run_timeout(*comm)
                           : mode == "mismatch" ? run_mismatch(*comm)
                           : mode == "withdraw" ? run_withdraw(*comm)
                           : mode == "backoff"  ? run_backoff(*comm)
                           : mode == "pending"  ? run_pending(*comm)
                                                : run_mpi_error(*comm);
      int total = 0;
      MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
      if (comm->rank() == 0) {
        std::fprintf(stderr, "%s scenario: %s\n", mode.c_str(), total == 0 ? "PASS" : "FAIL");
      }
      return total == 0 ? 0 : 1;
    }
    if (mode == "throw")
      run_throw(*comm);
    else if (mode == "hang")
      run_hang(*comm);
    else
      return fail(comm->rank(),
                  "usage: strata_comm_fault_program "
                  "timeout|mismatch|mpi-error|withdraw|backoff|pending|throw|hang");
  } catch (const std::exception& error) {
    abort_all(error.what(), 3);
  }
  delete comm;
  return 0;
}
