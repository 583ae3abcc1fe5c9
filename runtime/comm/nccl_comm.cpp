#include "runtime/comm/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <span>
#include <thread>

#include <fmt/format.h>

#include "base/assert.hpp"

namespace strata::runtime::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kScratchBytes = 64;

ncclDataType_t nccl_type_of(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
      return ncclFloat32;
    case DType::kBf16:
      return ncclBfloat16;
    case DType::kFp16:
      return ncclFloat16;
    case DType::kUint8:
      return ncclUint8;
    case DType::kUint64:
      return ncclUint64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

int local_rank_from_environment() {
  const char* local_rank = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  return local_rank != nullptr ? std::atoi(local_rank) : 0;
}

// NCCL progresses on the device without host calls, so waiting can sleep; the cap bounds the
// latency a finished collective waits to be noticed.
void sleep_backoff(std::chrono::microseconds& sleep) {
  std::this_thread::sleep_for(sleep);
  sleep = std::min(sleep * 2, std::chrono::microseconds(100));
}

}  // namespace

bool cuda_device_available(std::string* reason) {
  int count = 0;
  const cudaError_t result = cudaGetDeviceCount(&count);
  if (result != cudaSuccess) {
    if (reason != nullptr) {
      *reason = fmt::format("cudaGetDeviceCount failed: {}", cudaGetErrorString(result));
    }
    return false;
  }
  if (count == 0 && reason != nullptr) *reason = "no CUDA device is visible";
  return count > 0;
}

NcclComm::NcclComm(Communicator& bootstrap, const NcclCommOptions& options)
    : options_(options),
      rank_(bootstrap.rank()),
      size_(bootstrap.size()),
      uncaught_at_construction_(std::uncaught_exceptions()) {
  try {
    set_up(bootstrap);
  } catch (...) {
    release();  // a throwing constructor runs no destructor
    throw;
  }
}

void NcclComm::set_up(Communicator& bootstrap) {
  constexpr auto kSetup = Collective::kSetup;
  int device_count = 0;
  check_cuda(cudaGetDeviceCount(&device_count), kSetup, "cudaGetDeviceCount");
  if (device_count == 0) throw CommError(rank_, kSetup, "no CUDA device is visible");
  device_ = options_.device >= 0 ? options_.device : local_rank_from_environment() % device_count;
  check_cuda(cudaSetDevice(device_), kSetup, "cudaSetDevice");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), kSetup,
             "cudaStreamCreateWithFlags");
  stream_ = stream;
  check_cuda(cudaMalloc(&device_scratch_, kScratchBytes), kSetup, "cudaMalloc");

  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank_ == 0) check_nccl(ncclGetUniqueId(&id), kSetup, "ncclGetUniqueId");
  bootstrap.broadcast(std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(&id), sizeof(id)), 0);

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; wait_nccl_ready() bounds the wait
  ncclComm_t nccl = nullptr;
  check_nccl(ncclCommInitRankConfig(&nccl, size_, id, rank_, &config), kSetup,
             "ncclCommInitRankConfig");
  nccl_ = nccl;
  wait_nccl_ready(kSetup, "ncclCommInitRankConfig");
}

NcclComm::~NcclComm() {
  release();
}

void NcclComm::release() noexcept {
  cudaSetDevice(device_);
  if (nccl_ != nullptr) {
    // A healthy communicator is finalized (flushing issued work) within the timeout, then
    // destroyed; a poisoned one, or one destroyed while an exception unwinds this rank alone, is
    // aborted, which never waits for peers.
    const bool unwinding = std::uncaught_exceptions() > uncaught_at_construction_;
    bool finalized = false;
    const ncclResult_t finalize =
        (poisoned() || unwinding) ? ncclInvalidUsage : ncclCommFinalize(nccl_);
    if (finalize == ncclSuccess || finalize == ncclInProgress) {
      const auto deadline = Clock::now() + options_.timeout;
      auto sleep = std::chrono::microseconds(1);
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(nccl_, &state) == ncclSuccess && state == ncclInProgress &&
             Clock::now() < deadline) {
        sleep_backoff(sleep);
      }
      finalized = state == ncclSuccess;
    }
    if (finalized) {
      ncclCommDestroy(nccl_);
    } else {
      ncclCommAbort(nccl_);
    }
  }
  if (device_scratch_ != nullptr) cudaFree(device_scratch_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  nccl_ = nullptr;
  device_scratch_ = nullptr;
  stream_ = nullptr;
}

void NcclComm::check_cuda(int cuda_result, Collective collective, const char* call) {
  if (cuda_result == cudaSuccess) return;
  const auto error = static_cast<cudaError_t>(cuda_result);
  DeviceCommError failure(rank_, collective, call, cuda_result,
                          fmt::format("{} (device {})", cudaGetErrorString(error), device_));
  if (first_error_.empty()) first_error_ = failure.what();
  throw failure;
}

void NcclComm::check_nccl(int nccl_result, Collective collective, const char* call) {
  const auto result = static_cast<ncclResult_t>(nccl_result);
  if (result == ncclSuccess || result == ncclInProgress) return;
  const char* last = nccl_ != nullptr ? ncclGetLastError(nccl_) : nullptr;
  DeviceCommError failure(
      rank_, collective, call, nccl_result,
      fmt::format("{}{}{}", ncclGetErrorString(result),
                  last != nullptr && last[0] != '\0' ? ": " : "", last != nullptr ? last : ""));
  if (first_error_.empty()) first_error_ = failure.what();
  if (nccl_ != nullptr) ncclCommAbort(nccl_);
  nccl_ = nullptr;
  throw failure;
}

void NcclComm::wait_nccl_ready(Collective collective, const char* call) {
  const auto deadline = Clock::now() + options_.timeout;
  auto sleep = std::chrono::microseconds(1);
  for (;;) {
    ncclResult_t state = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(nccl_, &state), collective, "ncclCommGetAsyncError");
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) check_nccl(state, collective, call);
    if (Clock::now() >= deadline) {
      fail_timeout(collective, fmt::format("{} still in progress", call));
    }
    sleep_backoff(sleep);
  }
}

void NcclComm::fail_timeout(Collective collective, const std::string& detail) {
  CommTimeoutError error(rank_, collective, std::chrono::duration<double>(options_.timeout).count(),
                         {},
                         detail +
                             "; NCCL cannot tell which rank is missing; the NCCL "
                             "communicator was aborted");
  first_error_ = error.what();
  if (nccl_ != nullptr) ncclCommAbort(nccl_);
  nccl_ = nullptr;
  throw error;
}

void NcclComm::begin(Collective collective) {
  if (poisoned()) {
    throw CommError(rank_, collective,
                    "communicator unusable after an earlier error (" + first_error_ + ")");
  }
  check_cuda(cudaSetDevice(device_), collective, "cudaSetDevice");
  last_issued_ = collective;
}

void NcclComm::synchronize() {
  if (poisoned()) {
    throw CommError(rank_, last_issued_,
                    "communicator unusable after an earlier error (" + first_error_ + ")");
  }
  check_cuda(cudaSetDevice(device_), last_issued_, "cudaSetDevice");
  const auto deadline = Clock::now() + options_.timeout;
  auto sleep = std::chrono::microseconds(1);
  for (;;) {
    const cudaError_t status = cudaStreamQuery(stream_);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) check_cuda(status, last_issued_, "cudaStreamQuery");
    ncclResult_t state = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(nccl_, &state), last_issued_, "ncclCommGetAsyncError");
    if (state != ncclSuccess && state != ncclInProgress) {
      check_nccl(state, last_issued_, "asynchronous NCCL operation");
    }
    if (Clock::now() >= deadline) {
      fail_timeout(last_issued_, "the stream did not drain (synchronize)");
    }
    sleep_backoff(sleep);
  }
}

void NcclComm::do_all_gather(ConstBuffer send, MutableBuffer recv) {
  constexpr auto kKind = Collective::kAllGather;
  begin(kKind);
  check_nccl(
      ncclAllGather(send.data, recv.data, send.count, nccl_type_of(send.dtype), nccl_, stream_),
      kKind, "ncclAllGather");
  wait_nccl_ready(kKind, "ncclAllGather");
}

void NcclComm::do_reduce_scatter(ConstBuffer send, MutableBuffer recv, ReduceOp op) {
  constexpr auto kKind = Collective::kReduceScatter;
  begin(kKind);
  check_nccl(ncclReduceScatter(send.data, recv.data, recv.count, nccl_type_of(send.dtype),
                               nccl_op_of(op), nccl_, stream_),
             kKind, "ncclReduceScatter");
  wait_nccl_ready(kKind, "ncclReduceScatter");
}

void NcclComm::do_all_reduce(MutableBuffer data, ReduceOp op) {
  constexpr auto kKind = Collective::kAllReduce;
  begin(kKind);
  check_nccl(ncclAllReduce(data.data, data.data, data.count, nccl_type_of(data.dtype),
                           nccl_op_of(op), nccl_, stream_),
             kKind, "ncclAllReduce");
  wait_nccl_ready(kKind, "ncclAllReduce");
}

void NcclComm::do_broadcast(MutableBuffer data, int root) {
  constexpr auto kKind = Collective::kBroadcast;
  begin(kKind);
  check_nccl(ncclBroadcast(data.data, data.data, data.count, nccl_type_of(data.dtype), root, nccl_,
                           stream_),
             kKind, "ncclBroadcast");
  wait_nccl_ready(kKind, "ncclBroadcast");
}

void NcclComm::do_barrier() {
  // NCCL has no barrier: a one-byte all-reduce that every rank must join, waited for on the host.
  constexpr auto kKind = Collective::kBarrier;
  begin(kKind);
  check_nccl(ncclAllReduce(device_scratch_, device_scratch_, 1, ncclUint8, ncclMax, nccl_, stream_),
             kKind, "ncclAllReduce");
  wait_nccl_ready(kKind, "ncclAllReduce");
  synchronize();
}

template <typename T>
T NcclComm::reduce_scalar(T value, ReduceOp op) {
  begin(Collective::kAllReduce);
  check_cuda(cudaMemcpyAsync(device_scratch_, &value, sizeof(T), cudaMemcpyHostToDevice, stream_),
             Collective::kAllReduce, "cudaMemcpyAsync");
  Communicator::all_reduce(std::span<T>(static_cast<T*>(device_scratch_), 1), op);
  check_cuda(cudaMemcpyAsync(&value, device_scratch_, sizeof(T), cudaMemcpyDeviceToHost, stream_),
             Collective::kAllReduce, "cudaMemcpyAsync");
  synchronize();
  return value;
}

std::uint64_t NcclComm::all_reduce_u64(std::uint64_t value, ReduceOp op) {
  return reduce_scalar(value, op);
}

float NcclComm::all_reduce_f32(float value, ReduceOp op) {
  return reduce_scalar(value, op);
}

}  // namespace strata::runtime::comm
