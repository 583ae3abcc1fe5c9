// NcclComm (CUDA builds only, STRATA_HAVE_NCCL): the Communicator collectives on device buffers,
// issued on the communicator's own CUDA stream.
//
// - Bootstrap: collective over `bootstrap`'s ranks (an MpiComm, or a LocalComm for one rank); rank
// 0
//   creates the ncclUniqueId and broadcasts it over `bootstrap`. The NCCL communicator is created
//   non-blocking (ncclConfig_t::blocking = 0) so creation and every call can be bounded by the
//   timeout instead of hanging inside NCCL.
// - Completion: collectives are enqueued on stream() and return; buffers must not be reused or read
//   until synchronize() returns (or until work on another stream waits for stream()). synchronize()
//   polls cudaStreamQuery and ncclCommGetAsyncError; past the timeout it aborts the NCCL
//   communicator (ncclCommAbort) and throws CommTimeoutError (NCCL cannot say which rank is
//   missing). barrier() and the scalar helpers synchronize before returning.
// - Threading: one thread at a time; each call makes the communicator's device current first.
// - Determinism: NCCL's own reductions (ring/tree). Results are run-to-run deterministic for a
// fixed
//   topology, rank count and NCCL_ALGO/NCCL_PROTO, but they are not rank-ordered, bf16/fp16 sums
//   are rounded at every hop, and they are not bitwise equal to MpiComm's.
// - Errors: CUDA and NCCL failures throw DeviceCommError naming the rank, the collective, the call
//   and cudaGetErrorString / ncclGetErrorString + ncclGetLastError. After an error the communicator
//   is poisoned (later calls throw); the job is expected to abort_all().
#pragma once

#include <chrono>
#include <string>

#include "runtime/comm/communicator.hpp"

struct CUstream_st;  // cudaStream_t
struct ncclComm;     // ncclComm_t

namespace strata::runtime::comm {

struct NcclCommOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // CUDA device of this rank; -1: OMPI_COMM_WORLD_LOCAL_RANK (0 without mpirun) modulo the number
  // of visible devices.
  int device = -1;
};

// True when the CUDA runtime sees at least one device; `reason` says why not otherwise.
bool cuda_device_available(std::string* reason = nullptr);

class NcclComm final : public Communicator {
 public:
  NcclComm(Communicator& bootstrap, const NcclCommOptions& options = {});
  ~NcclComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend_name() const override { return "nccl"; }
  BufferMemory buffer_memory() const override { return BufferMemory::kDevice; }
  int device() const { return device_; }
  CUstream_st* stream() const { return stream_; }
  bool poisoned() const { return !first_error_.empty(); }

  void synchronize() override;
  std::uint64_t all_reduce_u64(std::uint64_t value, ReduceOp op) override;
  float all_reduce_f32(float value, ReduceOp op) override;

 protected:
  void do_all_gather(ConstBuffer send, MutableBuffer recv) override;
  void do_reduce_scatter(ConstBuffer send, MutableBuffer recv, ReduceOp op) override;
  void do_all_reduce(MutableBuffer data, ReduceOp op) override;
  void do_broadcast(MutableBuffer data, int root) override;
  void do_barrier() override;

 private:
  void set_up(Communicator& bootstrap);
  void release() noexcept;
  void begin(Collective collective);
  void check_cuda(int cuda_result, Collective collective, const char* call);
  void check_nccl(int nccl_result, Collective collective, const char* call);
  void wait_nccl_ready(Collective collective, const char* call);
  [[noreturn]] void fail_timeout(Collective collective, const std::string& detail);
  template <typename T>
  T reduce_scalar(T value, ReduceOp op);

  NcclCommOptions options_;
  int rank_ = 0;
  int size_ = 1;
  int device_ = 0;
  CUstream_st* stream_ = nullptr;
  ncclComm* nccl_ = nullptr;
  void* device_scratch_ = nullptr;  // 64 bytes: scalar helpers and barrier
  Collective last_issued_ = Collective::kSetup;
  std::string first_error_;
  int uncaught_at_construction_ = 0;
};

}  // namespace strata::runtime::comm
