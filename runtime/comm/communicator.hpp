// Communicator: the collectives strata's ZeRO-3 engine needs (all-gather of parameter shards,
// reduce-scatter of gradients, all-reduce of norms and overflow flags, broadcast, barrier), over
// three backends: LocalComm (one rank), MpiComm (processes started by mpirun) and NcclComm (device
// buffers, CUDA builds only). make_communicator() picks LocalComm or MpiComm from the environment.
//
// Contracts (docs/comm.md has the details):
// - Threading: a Communicator is owned by one thread at a time; its collectives must not run
//   concurrently with each other. Every rank calls the same collectives in the same order with
//   matching sizes and types (as MPI requires).
// - Completion: host backends (Local, Mpi) complete a collective before returning. NcclComm
// enqueues
//   it on its stream; synchronize() waits (and applies the timeout). Code that must run on every
//   backend calls synchronize() before it reads results.
// - Determinism: floating reductions accumulate in fp32 in rank order and round to nearest even
// once
//   (LocalComm, MpiComm): bitwise identical results for given inputs and rank count. NcclComm uses
//   NCCL's reductions (deterministic run to run for a fixed topology, not rank-ordered).
// - Errors: backend failures throw CommError subclasses naming the rank and the collective; a
//   collective not completed within the timeout throws CommTimeoutError naming the missing ranks.
//   After any CommError the communicator is poisoned: every later call throws. The job is expected
//   to end with abort_all() (see mpi_comm.hpp).
// - Argument mismatches (wrong sizes, types, root out of range) are programmer errors:
// STRATA_ASSERT.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>

#include "runtime/comm/comm_error.hpp"
#include "runtime/comm/reduction.hpp"

namespace strata::runtime::comm {

// A typed view of a buffer in the backend's memory (host for Local/Mpi, device for Nccl).
struct ConstBuffer {
  const void* data = nullptr;
  std::size_t count = 0;  // elements
  DType dtype = DType::kUint8;

  std::size_t bytes() const { return count * dtype_bytes(dtype); }
  template <CommElement T>
  static ConstBuffer of(std::span<const T> elements) {
    return {elements.data(), elements.size(), dtype_v<T>};
  }
};

struct MutableBuffer {
  void* data = nullptr;
  std::size_t count = 0;  // elements
  DType dtype = DType::kUint8;

  std::size_t bytes() const { return count * dtype_bytes(dtype); }
  ConstBuffer as_const() const { return {data, count, dtype}; }
  template <CommElement T>
  static MutableBuffer of(std::span<T> elements) {
    return {elements.data(), elements.size(), dtype_v<T>};
  }
};

// Per-collective counters of one rank. payload_bytes is the size of the whole logical buffer (the
// gathered buffer for all_gather, the unreduced input for reduce_scatter, the buffer for all_reduce
// and broadcast): summed over a step it is what the memory plan calls 2 psi / 3 psi. sent_bytes is
// what this rank puts on the wire in the bandwidth-optimal (ring) schedule, which MpiComm's own
// algorithms match exactly: all_gather (N-1) x send, reduce_scatter (N-1) x recv, all_reduce
// 2 x (count - own chunk), broadcast the buffer on the root only, barrier 0.
struct CollectiveStats {
  std::uint64_t calls = 0;
  std::uint64_t payload_bytes = 0;
  std::uint64_t sent_bytes = 0;
};

struct CommStats {
  std::array<CollectiveStats, kCountedCollectives> by_collective{};

  const CollectiveStats& operator[](Collective collective) const;
  std::uint64_t total_sent_bytes() const;
  std::uint64_t total_payload_bytes() const;
};

// Elements [begin, begin + count) of `total` that `rank` reduces in MpiComm's all_reduce: the first
// total % size ranks get one element more.
struct Chunk {
  std::size_t begin = 0;
  std::size_t count = 0;
};
Chunk chunk_of(std::size_t total, int size, int rank);

// Which memory a backend's collectives read and write: host memory (LocalComm, MpiComm) or the
// device's memory (NcclComm). A caller holding data in the other kind stages it through a copy
// (the Engine: d2h into pinned host buffers, the collective on the host, h2d back).
enum class BufferMemory : std::uint8_t { kHost, kDevice };

// An all-gather started ahead of use (the Engine's gathers of prefetched units, docs/comm.md
// "Gathers started ahead"): at the start the receives of the peers' blocks are posted and, with
// OwnBlock::kNow, this rank's own block, already in its place in the receive buffer, is sent to
// every peer; with OwnBlock::kLater send_own() sends it once it is there. wait() returns when every
// block has arrived and the own block has left (a kLater gather must have sent it first). Gathers
// of different keys complete in any order, whatever order the ranks start them in; gathers of the
// same key must start in the same order on every rank (each is matched with the peers' in that
// order). A PendingAllGather must be waited for before its buffer is freed; destroying one that has
// not completed withdraws its requests (after an error) or ends the job (abort_all) when MPI
// cannot.
class PendingAllGather {
 public:
  virtual ~PendingAllGather() = default;
  PendingAllGather(const PendingAllGather&) = delete;
  PendingAllGather& operator=(const PendingAllGather&) = delete;

  // Sends the own block of a gather started with OwnBlock::kLater; once. Any thread may call it
  // while another tests or waits when the communicator's sends_from_any_thread(); it throws what
  // MPI reports, which test() and wait() then report too.
  virtual void send_own() = 0;
  // Advances the transfers; true once the gather is complete. Never blocks.
  virtual bool test() = 0;
  // Blocks until complete; throws CommTimeoutError naming the peers whose blocks have not arrived
  // after the communicator's timeout.
  virtual void wait() = 0;

 protected:
  PendingAllGather() = default;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend_name() const = 0;
  // Where the buffers of all_gather / reduce_scatter / all_reduce / broadcast must live. The
  // scalar helpers below take host values on every backend.
  virtual BufferMemory buffer_memory() const { return BufferMemory::kHost; }

  // recv.count == size() * send.count; rank r's send lands at recv[r * send.count].
  void all_gather(ConstBuffer send, MutableBuffer recv);
  // send.count == size() * recv.count; recv = op over ranks of send[rank() * recv.count ...].
  void reduce_scatter(ConstBuffer send, MutableBuffer recv, ReduceOp op);
  // In place: data = op over ranks of data.
  void all_reduce(MutableBuffer data, ReduceOp op);
  // In place: every rank's data becomes root's data.
  void broadcast(MutableBuffer data, int root);
  void barrier();
  // Waits for every collective issued so far (no-op on host backends, which complete on return).
  virtual void synchronize() {}

  // All-gathers started ahead of use (PendingAllGather): whether this backend has them (MpiComm),
  // and the largest key it takes. recv.count == size() * count; the own block is
  // recv[rank() * count ...] and must be in place when it starts. Counted as an all_gather.
  virtual bool has_pending_all_gathers() const { return false; }
  virtual std::uint32_t max_pending_key() const { return 0; }
  // `count` keys no earlier reservation on this communicator got: the first of them, or nullopt
  // once the keys up to max_pending_key() are used up. Ranks that reserve the same counts in the
  // same order get the same keys.
  std::optional<std::uint32_t> reserve_pending_keys(std::uint32_t count);
  // Whether a PendingAllGather's send_own() may run on another thread than the one calling the
  // communicator (MpiComm under MPI_THREAD_MULTIPLE).
  virtual bool sends_from_any_thread() const { return false; }
  enum class OwnBlock : std::uint8_t { kNow, kLater };
  std::unique_ptr<PendingAllGather> start_all_gather(MutableBuffer recv, std::size_t count,
                                                     std::uint32_t key,
                                                     OwnBlock own = OwnBlock::kNow);

  template <CommElement T>
  void all_gather(std::span<const T> send, std::span<T> recv) {
    all_gather(ConstBuffer::of(send), MutableBuffer::of(recv));
  }
  template <CommElement T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    reduce_scatter(ConstBuffer::of(send), MutableBuffer::of(recv), op);
  }
  template <CommElement T>
  void all_reduce(std::span<T> data, ReduceOp op) {
    all_reduce(MutableBuffer::of(data), op);
  }
  template <CommElement T>
  void broadcast(std::span<T> data, int root) {
    broadcast(MutableBuffer::of(data), root);
  }

  // Host scalars on every backend (NcclComm stages them through device memory): overflow flags,
  // step counters, norms. They complete on return.
  virtual std::uint64_t all_reduce_u64(std::uint64_t value, ReduceOp op);
  virtual float all_reduce_f32(float value, ReduceOp op);
  bool any_rank(bool flag) { return all_reduce_u64(flag ? 1 : 0, ReduceOp::kMax) != 0; }

  const CommStats& stats() const { return stats_; }
  void reset_stats() { stats_ = CommStats{}; }

 protected:
  Communicator() = default;

  // Backends implement these; arguments are already checked and the statistics counted.
  virtual void do_all_gather(ConstBuffer send, MutableBuffer recv) = 0;
  virtual void do_reduce_scatter(ConstBuffer send, MutableBuffer recv, ReduceOp op) = 0;
  virtual void do_all_reduce(MutableBuffer data, ReduceOp op) = 0;
  virtual void do_broadcast(MutableBuffer data, int root) = 0;
  virtual void do_barrier() = 0;
  virtual std::unique_ptr<PendingAllGather> do_start_all_gather(MutableBuffer recv,
                                                                 std::size_t count,
                                                                 std::uint32_t key, OwnBlock own);

 private:
  void count(Collective collective, std::uint64_t payload_bytes, std::uint64_t sent_bytes);

  CommStats stats_;
  std::uint64_t next_pending_key_ = 0;
};

struct CommOptions {
  // A collective that has not completed after this long throws CommTimeoutError.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
};

// LocalComm when this process was not started by mpirun (no OMPI_COMM_WORLD_SIZE / PMIX_RANK in the
// environment), MpiComm over MPI_COMM_WORLD otherwise (initialising MPI on first use).
std::unique_ptr<Communicator> make_communicator(const CommOptions& options = {});
bool launched_by_mpirun();

}  // namespace strata::runtime::comm
