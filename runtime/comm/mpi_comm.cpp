#include "runtime/comm/mpi_comm.hpp"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "base/assert.hpp"

namespace strata::runtime::comm {
namespace {

using Clock = std::chrono::steady_clock;

// How long a timed-out rank waits for each peer's arrival record. A peer whose MPI library is not
// progressing (stuck outside MPI, over a transport that needs target progress) is reported as
// missing when this runs out; on one machine the window is shared memory and answers at once.
constexpr auto kProbeLimit = std::chrono::milliseconds(1000);
// wait(): polls without sleeping for this long, then sleeps between polls, doubling from
// kBackoffMin to kBackoffMax. The spin covers a transfer in progress (a 64 MiB exchange on one
// machine takes ~10-20 ms); kBackoffMax bounds the latency a backed-off wait adds.
constexpr auto kSpinBeforeBackoff = std::chrono::milliseconds(50);
constexpr auto kBackoffMin = std::chrono::microseconds(10);
constexpr auto kBackoffMax = std::chrono::milliseconds(1);

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text, static_cast<std::size_t>(length));
}

// Owns MPI's lifetime when strata initialised it: MPI_Finalize runs at normal process exit.
class MpiLifetime {
 public:
  MpiLifetime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized != 0) return;  // the application owns MPI
    // MULTIPLE lets an Engine's sender thread post the sends of gathers started ahead of use
    // (PendingAllGather::send_own); SERIALIZED is enough for everything else.
    int provided = 0;
    const int result = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (result != MPI_SUCCESS) {
      throw MpiError(-1, Collective::kSetup, "MPI_Init_thread", result, mpi_error_text(result));
    }
    if (provided < MPI_THREAD_SERIALIZED) {
      throw CommError(-1, Collective::kSetup,
                      fmt::format("MPI_Init_thread provided thread level {}, strata needs "
                                  "MPI_THREAD_SERIALIZED ({})",
                                  provided, MPI_THREAD_SERIALIZED));
    }
    owned_ = true;
    // Open MPI 4.1 reports errors of nonblocking collectives found in MPI_Test through
    // MPI_COMM_WORLD's handler, not the request's communicator: without this, a truncated
    // broadcast kills the job instead of raising MpiError. Applications that own MPI keep theirs.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  ~MpiLifetime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && finalized == 0) MPI_Finalize();
  }
  MpiLifetime(const MpiLifetime&) = delete;
  MpiLifetime& operator=(const MpiLifetime&) = delete;

 private:
  bool owned_ = false;
};

MPI_Datatype mpi_type_of(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
      return MPI_FLOAT;
    case DType::kBf16:
    case DType::kFp16:
      return MPI_UINT16_T;  // moved as bits; MPI never reduces them
    case DType::kUint8:
      return MPI_UINT8_T;
    case DType::kUint64:
      return MPI_UINT64_T;
  }
  return MPI_DATATYPE_NULL;
}

// The arrival record of a rank: (sequence number << 8) | collective.
std::uint64_t arrival_record(std::uint64_t sequence, Collective collective) {
  return (sequence << 8) | static_cast<std::uint64_t>(collective);
}

}  // namespace

void ensure_mpi_initialized() {
  // Constructed once, thread-safely; destroyed (MPI_Finalize) at exit after every MpiComm that
  // was created after it, since those finish construction later.
  static MpiLifetime lifetime;
}

void abort_all(std::string_view reason, int exit_code) noexcept {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int rank = 0;
  if (initialized != 0 && finalized == 0) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "strata: rank %d aborting the job: %.*s\n", rank,
               static_cast<int>(reason.size()), reason.data());
  std::fflush(stderr);
  std::fflush(stdout);
  if (initialized != 0 && finalized == 0) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

struct MpiComm::State {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm ahead = MPI_COMM_NULL;  // gathers started ahead of use (start_all_gather)
  std::uint32_t tag_ub = 0;        // MPI_TAG_UB of `ahead`: the largest key
  MPI_Win arrivals = MPI_WIN_NULL;
  std::uint64_t* own_arrival = nullptr;  // this rank's slot in the window (shared with its peers)
  std::vector<MPI_Request> requests;     // of the collective in flight (at most 2 per peer)
  std::size_t point_to_point = 0;  // requests[0, point_to_point) are Irecv/Isend (cancellable)
  bool buffers_in_flight = false;  // the requests use caller memory (all but the barrier)
  std::vector<MPI_Status> statuses;
  Clock::time_point deadline;
  std::vector<std::byte> scratch;  // grows to the largest reduction seen, then is reused
  // exchange(): per peer, the block sent to it and the block received from it (elements).
  std::vector<std::size_t> send_counts, send_offsets, recv_counts, recv_offsets;
};

MpiComm::MpiComm(const CommOptions& options)
    : options_(options), state_(std::make_unique<State>()) {
  ensure_mpi_initialized();
  uncaught_at_construction_ = std::uncaught_exceptions();
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  int thread_level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&thread_level);
  thread_multiple_ = thread_level == MPI_THREAD_MULTIPLE;
  check(MPI_Comm_dup(MPI_COMM_WORLD, &state_->comm), Collective::kSetup, "MPI_Comm_dup");
  check(MPI_Comm_set_errhandler(state_->comm, MPI_ERRORS_RETURN), Collective::kSetup,
        "MPI_Comm_set_errhandler");
  check(MPI_Comm_size(state_->comm, &size_), Collective::kSetup, "MPI_Comm_size");
  check(MPI_Comm_dup(MPI_COMM_WORLD, &state_->ahead), Collective::kSetup, "MPI_Comm_dup");
  check(MPI_Comm_set_errhandler(state_->ahead, MPI_ERRORS_RETURN), Collective::kSetup,
        "MPI_Comm_set_errhandler");
  void* tag_ub = nullptr;
  int has_tag_ub = 0;
  check(MPI_Comm_get_attr(state_->ahead, MPI_TAG_UB, &tag_ub, &has_tag_ub), Collective::kSetup,
        "MPI_Comm_get_attr");
  // MPI guarantees at least 32767.
  state_->tag_ub =
      has_tag_ub != 0 ? static_cast<std::uint32_t>(*static_cast<int*>(tag_ub)) : 32767;
  check(MPI_Win_allocate(sizeof(std::uint64_t), sizeof(std::uint64_t), MPI_INFO_NULL, state_->comm,
                         &state_->own_arrival, &state_->arrivals),
        Collective::kSetup, "MPI_Win_allocate");
  check(MPI_Win_set_errhandler(state_->arrivals, MPI_ERRORS_RETURN), Collective::kSetup,
        "MPI_Win_set_errhandler");
  *state_->own_arrival = arrival_record(0, Collective::kSetup);
  // One passive-target epoch for the communicator's whole life: timed-out ranks read their peers'
  // records at any moment without their cooperation.
  check(MPI_Win_lock_all(MPI_MODE_NOCHECK, state_->arrivals), Collective::kSetup,
        "MPI_Win_lock_all");
  check(MPI_Barrier(state_->comm), Collective::kSetup, "MPI_Barrier");
  const auto ranks = static_cast<std::size_t>(size_);
  state_->requests.reserve(2 * ranks);
  state_->statuses.resize(2 * ranks);
  state_->send_counts.resize(ranks);
  state_->send_offsets.resize(ranks);
  state_->recv_counts.resize(ranks);
  state_->recv_offsets.resize(ranks);
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  // Freeing the window is collective: after an error, or while an exception unwinds this rank
  // alone, the peers may never join, so the handles are left to MPI_Abort / process exit instead.
  const bool unwinding = std::uncaught_exceptions() > uncaught_at_construction_;
  if (finalized != 0 || poisoned() || unwinding) return;
  if (state_->arrivals != MPI_WIN_NULL) {
    MPI_Win_unlock_all(state_->arrivals);
    MPI_Win_free(&state_->arrivals);
  }
  if (state_->ahead != MPI_COMM_NULL) MPI_Comm_free(&state_->ahead);
  if (state_->comm != MPI_COMM_NULL) MPI_Comm_free(&state_->comm);
}

std::size_t MpiComm::pending_requests() const {
  return static_cast<std::size_t>(
      std::count_if(state_->requests.begin(), state_->requests.end(),
                    [](MPI_Request request) { return request != MPI_REQUEST_NULL; }));
}

void MpiComm::check(int mpi_result, Collective collective, std::string_view call) {
  if (mpi_result == MPI_SUCCESS) return;
  MpiError error(rank_, collective, call, mpi_result, mpi_error_text(mpi_result));
  if (first_error_.empty()) first_error_ = error.what();
  throw error;
}

// Called before begin(): every rank refuses the same call alike, and the communicator stays usable.
void MpiComm::check_count(std::size_t count, Collective collective) {
  if (count <= static_cast<std::size_t>(INT_MAX)) return;
  throw CommError(rank_, collective,
                  fmt::format("{} elements exceed MPI's int count limit ({}); split the buffer",
                              count, INT_MAX));
}

void MpiComm::begin(Collective collective) {
  if (poisoned()) {
    throw CommError(rank_, collective,
                    "communicator unusable after an earlier error (" + first_error_ + ")");
  }
  ++sequence_;
  // Publish the arrival: a plain store to our window slot plus MPI_Win_sync is the unified memory
  // model's way to make it visible to peers' MPI_Get.
  std::atomic_ref<std::uint64_t>(*state_->own_arrival)
      .store(arrival_record(sequence_, collective), std::memory_order_release);
  MPI_Win_sync(state_->arrivals);
  state_->deadline = Clock::now() + options_.timeout;
}

void MpiComm::wait(Collective collective) {
  // Poll MPI_Testall, yielding the core, for the first kSpinBeforeBackoff: Open MPI advances a
  // large transfer only inside MPI calls (its shared-memory pipeline moves a fragment or so per
  // call), so sleeping between polls of a transfer in progress caps its bandwidth (a 1 ms backoff
  // made 4 MiB all-gathers 3-4x slower than MPI_Allgather). A wait longer than that is a rank
  // waiting for a slower peer: the polls then back off exponentially to kBackoffMax, so a waiting
  // rank leaves its core to the work beside it (CPU Adam) instead of spinning.
  auto& requests = state_->requests;
  const int count = static_cast<int>(requests.size());
  const Clock::time_point spin_until = Clock::now() + kSpinBeforeBackoff;
  Clock::duration backoff = kBackoffMin;
  for (;;) {
    int done = 0;
    const int result = MPI_Testall(count, requests.data(), &done, state_->statuses.data());
    if (result == MPI_ERR_IN_STATUS) {
      for (int i = 0; i < count; ++i) {
        const int code = state_->statuses[static_cast<std::size_t>(i)].MPI_ERROR;
        if (code != MPI_SUCCESS && code != MPI_ERR_PENDING) check(code, collective, "MPI_Testall");
      }
    }
    check(result, collective, "MPI_Testall");
    if (done != 0) {
      requests.clear();
      return;
    }
    const Clock::time_point now = Clock::now();
    if (now >= state_->deadline) fail_timeout(collective);
    if (now < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, state_->deadline - now));
      backoff = std::min<Clock::duration>(2 * backoff, kBackoffMax);
    }
  }
}

bool MpiComm::withdraw_requests() {
  // Receives are cancelled (Open MPI always can); sends are cancelled too, which completes an
  // eager send at once, but Open MPI 4.1 cannot cancel a rendezvous send its receiver has not
  // matched; collectives (Ibcast, Ibarrier) cannot be cancelled at all (MPI-3.1 5.12). Then every
  // request gets up to kProbeLimit to complete (cancelled or done), polled with backoff.
  auto& requests = state_->requests;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (requests[i] != MPI_REQUEST_NULL && i < state_->point_to_point) MPI_Cancel(&requests[i]);
  }
  const Clock::time_point drain_deadline =
      Clock::now() + std::min<Clock::duration>(kProbeLimit, options_.timeout);
  Clock::duration backoff = kBackoffMin;
  for (;;) {
    bool pending = false;
    for (MPI_Request& request : requests) {
      int done = 0;
      if (request != MPI_REQUEST_NULL) MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      pending = pending || request != MPI_REQUEST_NULL;
    }
    if (!pending) {
      requests.clear();
      return true;
    }
    if (Clock::now() >= drain_deadline) return false;
    std::this_thread::sleep_for(backoff);
    backoff = std::min<Clock::duration>(2 * backoff, kBackoffMax);
  }
}

void MpiComm::fail_timeout(Collective collective) {
  const auto ranks = static_cast<std::size_t>(size_);
  std::vector<std::uint64_t> records(ranks, 0);
  std::vector<MPI_Request> probes(ranks, MPI_REQUEST_NULL);
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    MPI_Rget(&records[static_cast<std::size_t>(peer)], 1, MPI_UINT64_T, peer, 0, 1, MPI_UINT64_T,
             state_->arrivals, &probes[static_cast<std::size_t>(peer)]);
  }
  const auto probe_deadline =
      Clock::now() + std::min<Clock::duration>(kProbeLimit, options_.timeout);
  std::vector<bool> answered(ranks, false);
  answered[static_cast<std::size_t>(rank_)] = true;
  for (bool pending = true; pending && Clock::now() < probe_deadline;) {
    pending = false;
    for (std::size_t peer = 0; peer < ranks; ++peer) {
      if (answered[peer]) continue;
      int done = 0;
      if (probes[peer] != MPI_REQUEST_NULL) MPI_Test(&probes[peer], &done, MPI_STATUS_IGNORE);
      answered[peer] = done != 0;
      pending = pending || !answered[peer];
    }
    if (pending) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }

  std::vector<int> missing;
  std::string detail = fmt::format("this rank is in {} #{}", to_string(collective), sequence_);
  for (std::size_t peer = 0; peer < ranks; ++peer) {
    if (peer == static_cast<std::size_t>(rank_)) continue;
    if (!answered[peer]) {
      missing.push_back(static_cast<int>(peer));
      detail += fmt::format("; rank {} did not answer (not progressing MPI)", peer);
      continue;
    }
    const std::uint64_t sequence = records[peer] >> 8;
    const auto reached = static_cast<Collective>(records[peer] & 0xff);
    // Arrived: at this collective, or already past it (its part completed before ours did).
    if (sequence > sequence_ || (sequence == sequence_ && reached == collective)) continue;
    missing.push_back(static_cast<int>(peer));
    if (sequence == 0) {
      detail += fmt::format("; rank {} has not entered any collective", peer);
    } else if (sequence < sequence_) {
      detail += fmt::format("; rank {} last entered {} #{}", peer, to_string(reached), sequence);
    } else {
      detail +=
          fmt::format("; rank {} is in {} #{} (the ranks called collectives in different orders)",
                      peer, to_string(reached), sequence);
    }
  }
  CommTimeoutError error(rank_, collective, std::chrono::duration<double>(options_.timeout).count(),
                         std::move(missing), detail);
  first_error_ = error.what();
  // The caller frees its buffers once this returns: no request may still be posted on them. (A
  // barrier's request uses no memory: it stays, and the poisoned communicator never waits on it.)
  if (state_->buffers_in_flight && !withdraw_requests()) {
    abort_all(fmt::format("{} (and MPI cannot withdraw a request on the caller's buffers: a send "
                          "the late rank has not matched, or a broadcast; ending the job rather "
                          "than let MPI use memory the caller frees)",
                          error.what()),
              3);
  }
  throw error;
}

void MpiComm::exchange(Collective collective, int phase, DType dtype, const std::byte* send_base,
                       std::byte* recv_base) {
  const std::size_t element = dtype_bytes(dtype);
  const MPI_Datatype type = mpi_type_of(dtype);
  const int tag = static_cast<int>(collective) * 2 + phase;
  auto& requests = state_->requests;
  STRATA_ASSERT(requests.empty());
  state_->buffers_in_flight = true;
  // Receives first, so eager messages land in place instead of in MPI's unexpected queue; peers in
  // a rotated order so that not every rank sends to rank 0 first.
  for (int step = 1; step < size_; ++step) {
    const int peer = (rank_ - step + size_) % size_;
    const auto index = static_cast<std::size_t>(peer);
    if (state_->recv_counts[index] == 0) continue;
    requests.push_back(MPI_REQUEST_NULL);
    check(MPI_Irecv(recv_base + state_->recv_offsets[index] * element,
                    static_cast<int>(state_->recv_counts[index]), type, peer, tag, state_->comm,
                    &requests.back()),
          collective, "MPI_Irecv");
  }
  for (int step = 1; step < size_; ++step) {
    const int peer = (rank_ + step) % size_;
    const auto index = static_cast<std::size_t>(peer);
    if (state_->send_counts[index] == 0) continue;
    requests.push_back(MPI_REQUEST_NULL);
    check(MPI_Isend(send_base + state_->send_offsets[index] * element,
                    static_cast<int>(state_->send_counts[index]), type, peer, tag, state_->comm,
                    &requests.back()),
          collective, "MPI_Isend");
  }
  const auto own = static_cast<std::size_t>(rank_);
  const std::byte* own_source = send_base + state_->send_offsets[own] * element;
  std::byte* own_target = recv_base + state_->recv_offsets[own] * element;
  if (state_->send_counts[own] != 0 && own_source != own_target) {
    std::memmove(own_target, own_source, state_->send_counts[own] * element);
  }
  state_->point_to_point = requests.size();
  wait(collective);
}

void MpiComm::do_all_gather(ConstBuffer send, MutableBuffer recv) {
  constexpr auto kKind = Collective::kAllGather;
  check_count(send.count, kKind);
  begin(kKind);
  for (std::size_t peer = 0; peer < static_cast<std::size_t>(size_); ++peer) {
    state_->send_counts[peer] = send.count;
    state_->send_offsets[peer] = 0;
    state_->recv_counts[peer] = send.count;
    state_->recv_offsets[peer] = peer * send.count;
  }
  exchange(kKind, 0, send.dtype, static_cast<const std::byte*>(send.data),
           static_cast<std::byte*>(recv.data));
}

void MpiComm::do_reduce_scatter(ConstBuffer send, MutableBuffer recv, ReduceOp op) {
  constexpr auto kKind = Collective::kReduceScatter;
  check_count(recv.count, kKind);
  begin(kKind);
  // Every rank receives block r of every rank (row p of the scratch from rank p), then reduces the
  // rows locally in rank order.
  if (state_->scratch.size() < send.bytes()) state_->scratch.resize(send.bytes());
  for (std::size_t peer = 0; peer < static_cast<std::size_t>(size_); ++peer) {
    state_->send_counts[peer] = recv.count;
    state_->send_offsets[peer] = peer * recv.count;
    state_->recv_counts[peer] = recv.count;
    state_->recv_offsets[peer] = peer * recv.count;
  }
  exchange(kKind, 0, send.dtype, static_cast<const std::byte*>(send.data), state_->scratch.data());
  if (recv.count == 0) return;
  reduce_rows(recv.dtype, op, state_->scratch.data(), recv.bytes(), static_cast<std::size_t>(size_),
              recv.count, static_cast<std::byte*>(recv.data));
}

void MpiComm::do_all_reduce(MutableBuffer data, ReduceOp op) {
  constexpr auto kKind = Collective::kAllReduce;
  const Chunk own = chunk_of(data.count, size_, rank_);
  check_count(chunk_of(data.count, size_, 0).count, kKind);  // rank 0 has the largest chunk
  begin(kKind);
  const std::size_t element = dtype_bytes(data.dtype);
  const auto ranks = static_cast<std::size_t>(size_);
  if (state_->scratch.size() < ranks * own.count * element) {
    state_->scratch.resize(ranks * own.count * element);
  }
  auto* bytes = static_cast<std::byte*>(data.data);
  // Phase 1, reduce-scatter: chunk p of every rank goes to rank p (row q of its scratch from rank
  // q), which reduces the rows in rank order into its own chunk.
  for (int peer = 0; peer < size_; ++peer) {
    const auto index = static_cast<std::size_t>(peer);
    const Chunk chunk = chunk_of(data.count, size_, peer);
    state_->send_counts[index] = chunk.count;
    state_->send_offsets[index] = chunk.begin;
    state_->recv_counts[index] = own.count;
    state_->recv_offsets[index] = index * own.count;
  }
  exchange(kKind, 0, data.dtype, bytes, state_->scratch.data());
  if (own.count != 0) {
    reduce_rows(data.dtype, op, state_->scratch.data(), own.count * element, ranks, own.count,
                bytes + own.begin * element);
  }
  // Phase 2, all-gather in place: the own reduced chunk to everyone, chunk p from rank p.
  for (int peer = 0; peer < size_; ++peer) {
    const auto index = static_cast<std::size_t>(peer);
    const Chunk chunk = chunk_of(data.count, size_, peer);
    state_->send_counts[index] = own.count;
    state_->send_offsets[index] = own.begin;
    state_->recv_counts[index] = chunk.count;
    state_->recv_offsets[index] = chunk.begin;
  }
  exchange(kKind, 1, data.dtype, bytes, bytes);
}

void MpiComm::do_broadcast(MutableBuffer data, int root) {
  constexpr auto kKind = Collective::kBroadcast;
  check_count(data.count, kKind);
  begin(kKind);
  state_->point_to_point = 0;
  state_->buffers_in_flight = true;
  state_->requests.push_back(MPI_REQUEST_NULL);
  check(MPI_Ibcast(data.data, static_cast<int>(data.count), mpi_type_of(data.dtype), root,
                   state_->comm, &state_->requests.back()),
        kKind, "MPI_Ibcast");
  wait(kKind);
}

void MpiComm::do_barrier() {
  constexpr auto kKind = Collective::kBarrier;
  begin(kKind);
  state_->point_to_point = 0;
  state_->buffers_in_flight = false;
  state_->requests.push_back(MPI_REQUEST_NULL);
  check(MPI_Ibarrier(state_->comm, &state_->requests.back()), kKind, "MPI_Ibarrier");
  wait(kKind);
}

// A gather started ahead of use: the peers' blocks' receives posted at construction, the own
// block's sends then too (OwnBlock::kNow) or by send_own(), on the communicator's `ahead`
// duplicate with the key as tag. `mutex_` orders send_own() on a sender thread against test(),
// wait() and the destructor on the Engine's thread (MPI_THREAD_MULTIPLE makes the calls legal;
// the mutex keeps them off the same request array at once).
class MpiPendingAllGather final : public PendingAllGather {
 public:
  MpiPendingAllGather(MpiComm& owner, MutableBuffer recv, std::size_t block, int tag,
                      Communicator::OwnBlock own)
      : owner_(owner), recv_(recv), block_(block), tag_(tag) {
    const auto ranks = static_cast<std::size_t>(owner_.size_);
    requests_.assign(2 * ranks, MPI_REQUEST_NULL);  // [0, ranks) receives, [ranks, 2 ranks) sends
    statuses_.resize(2 * ranks);
    const MPI_Datatype type = mpi_type_of(recv_.dtype);
    // Peers in a rotated order, receives first, as exchange() does.
    for (int step = 1; step < owner_.size_; ++step) {
      const int peer = (owner_.rank_ - step + owner_.size_) % owner_.size_;
      post(MPI_Irecv(block_at(peer), static_cast<int>(block_), type, peer, tag_,
                     owner_.state_->ahead, &requests_[static_cast<std::size_t>(peer)]),
           "MPI_Irecv");
    }
    if (own == Communicator::OwnBlock::kNow) post_sends();
  }

  ~MpiPendingAllGather() override {
    const std::lock_guard lock(mutex_);
    if (pending() == 0) return;
    // Not waited for (an error unwinds the Engine): no request may stay on the caller's buffer.
    if (!withdraw()) {
      abort_all(fmt::format("rank {}: an all-gather started ahead of use (key {}) was abandoned "
                            "and MPI cannot withdraw its requests on the buffer being freed",
                            owner_.rank_, tag_),
                3);
    }
  }

  void send_own() override {
    const std::lock_guard lock(mutex_);
    STRATA_ASSERT(!sent_, "send_own twice");
    try {
      post_sends();
    } catch (const MpiError&) {  // reported by the Engine thread's next test() or wait()
      send_error_ = std::current_exception();
      throw;
    }
  }

  bool test() override {
    const std::lock_guard lock(mutex_);
    if (send_error_) {
      try {
        std::rethrow_exception(send_error_);
      } catch (const std::exception& error) {
        if (owner_.first_error_.empty()) owner_.first_error_ = error.what();
        throw;
      }
    }
    int done = 0;
    const int result = MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done,
                                   statuses_.data());
    if (result == MPI_ERR_IN_STATUS) {
      for (const MPI_Status& status : statuses_) {
        if (status.MPI_ERROR != MPI_SUCCESS && status.MPI_ERROR != MPI_ERR_PENDING) {
          post(status.MPI_ERROR, "MPI_Testall");
        }
      }
    }
    post(result, "MPI_Testall");
    return done != 0;
  }

  void wait() override {
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline = start + owner_.options_.timeout;
    const Clock::time_point spin_until = start + kSpinBeforeBackoff;
    Clock::duration backoff = kBackoffMin;
    while (!test()) {
      const Clock::time_point now = Clock::now();
      if (now >= deadline) {
        const std::lock_guard lock(mutex_);
        fail_timeout();
      }
      if (now < spin_until) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
        backoff = std::min<Clock::duration>(2 * backoff, kBackoffMax);
      }
    }
  }

 private:
  std::byte* block_at(int rank) const {
    return static_cast<std::byte*>(recv_.data) +
           static_cast<std::size_t>(rank) * block_ * dtype_bytes(recv_.dtype);
  }

  // The own block to every peer, in the rotated order. Called with mutex_ held (or from the
  // constructor, before anyone else sees this gather).
  void post_sends() {
    const auto ranks = static_cast<std::size_t>(owner_.size_);
    const MPI_Datatype type = mpi_type_of(recv_.dtype);
    sent_ = true;
    for (int step = 1; step < owner_.size_; ++step) {
      const int peer = (owner_.rank_ + step) % owner_.size_;
      const int result =
          MPI_Isend(block_at(owner_.rank_), static_cast<int>(block_), type, peer, tag_,
                    owner_.state_->ahead, &requests_[ranks + static_cast<std::size_t>(peer)]);
      if (result != MPI_SUCCESS) {
        throw MpiError(owner_.rank_, Collective::kAllGather, "MPI_Isend", result,
                       mpi_error_text(result));
      }
    }
  }

  std::size_t pending() const {
    return static_cast<std::size_t>(std::count_if(
        requests_.begin(), requests_.end(), [](MPI_Request r) { return r != MPI_REQUEST_NULL; }));
  }

  void post(int mpi_result, std::string_view call) {
    if (mpi_result == MPI_SUCCESS) return;
    MpiError error(owner_.rank_, Collective::kAllGather, call, mpi_result,
                   mpi_error_text(mpi_result));
    if (owner_.first_error_.empty()) owner_.first_error_ = error.what();
    throw error;
  }

  // Cancels every request still posted and waits (bounded) for each to complete or be
  // cancelled. True when none is left on the buffer.
  bool withdraw() {
    for (MPI_Request& request : requests_) {
      if (request != MPI_REQUEST_NULL) MPI_Cancel(&request);
    }
    const Clock::time_point deadline =
        Clock::now() + std::min<Clock::duration>(kProbeLimit, owner_.options_.timeout);
    Clock::duration backoff = kBackoffMin;
    for (;;) {
      for (MPI_Request& request : requests_) {
        int done = 0;
        if (request != MPI_REQUEST_NULL) MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      }
      if (pending() == 0) return true;
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(backoff);
      backoff = std::min<Clock::duration>(2 * backoff, kBackoffMax);
    }
  }

  [[noreturn]] void fail_timeout() {
    std::vector<int> missing;
    std::string detail =
        fmt::format("the all-gather started ahead of use with key {} (a unit's gather) is "
                    "missing the block of",
                    tag_);
    for (int peer = 0; peer < owner_.size_; ++peer) {
      // MPI_Testall completes all or none: ask each receive on its own.
      MPI_Request& receive = requests_[static_cast<std::size_t>(peer)];
      int arrived = 0;
      if (receive != MPI_REQUEST_NULL) MPI_Test(&receive, &arrived, MPI_STATUS_IGNORE);
      if (receive == MPI_REQUEST_NULL) continue;
      missing.push_back(peer);
      detail += fmt::format(" rank {}", peer);
    }
    detail += " (a rank that never gathers this unit, or gathers units in another order)";
    CommTimeoutError error(owner_.rank_, Collective::kAllGather,
                           std::chrono::duration<double>(owner_.options_.timeout).count(),
                           std::move(missing), detail);
    owner_.first_error_ = error.what();
    if (!withdraw()) {
      abort_all(fmt::format("{} (and MPI cannot withdraw a send the late rank has not matched: "
                            "ending the job rather than let MPI use memory the caller frees)",
                            error.what()),
                3);
    }
    throw error;
  }

  MpiComm& owner_;
  MutableBuffer recv_;
  std::size_t block_;
  int tag_;
  std::mutex mutex_;
  bool sent_ = false;
  std::exception_ptr send_error_;  // from send_own() on another thread
  std::vector<MPI_Request> requests_;
  std::vector<MPI_Status> statuses_;
};

std::uint32_t MpiComm::max_pending_key() const { return state_->tag_ub; }

std::unique_ptr<PendingAllGather> MpiComm::do_start_all_gather(MutableBuffer recv,
                                                               std::size_t count,
                                                               std::uint32_t key,
                                                               OwnBlock own) {
  check_count(count, Collective::kAllGather);
  if (poisoned()) {
    throw CommError(rank_, Collective::kAllGather,
                    "communicator unusable after an earlier error (" + first_error_ + ")");
  }
  return std::make_unique<MpiPendingAllGather>(*this, recv, count, static_cast<int>(key), own);
}

}  // namespace strata::runtime::comm
