// Errors raised by the communicators. Every one names the rank that raised it and the collective it
// was in; the backends add their own error text (MPI_Error_string, ncclGetErrorString, ...).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace strata::runtime::comm {

enum class Collective : std::uint8_t {
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kBarrier,
  kSetup,  // communicator creation and bootstrap (not counted in the statistics)
};
inline constexpr std::size_t kCountedCollectives = 5;  // kAllGather..kBarrier
std::string_view to_string(Collective collective);

class CommError : public std::runtime_error {
 public:
  // what(): "strata comm: rank R, <collective>: <detail>"
  CommError(int rank, Collective collective, const std::string& detail);
  int rank() const noexcept { return rank_; }
  Collective collective() const noexcept { return collective_; }

 private:
  int rank_;
  Collective collective_;
};

// An MPI call failed; mpi_code() is the MPI error code, what() includes MPI_Error_string.
class MpiError : public CommError {
 public:
  MpiError(int rank, Collective collective, std::string_view mpi_call, int mpi_code,
           std::string_view mpi_text);
  int mpi_code() const noexcept { return mpi_code_; }

 private:
  int mpi_code_;
};

// A CUDA or NCCL call failed; library_code() is the cudaError_t / ncclResult_t value.
class DeviceCommError : public CommError {
 public:
  DeviceCommError(int rank, Collective collective, std::string_view call, int library_code,
                  std::string_view library_text);
  int library_code() const noexcept { return library_code_; }

 private:
  int library_code_;
};

// A collective did not complete before its deadline. missing_ranks() are the ranks that had not
// joined it (empty when every rank joined and the transfer itself was too slow, or when the backend
// cannot tell). The communicator that raised it is unusable afterwards (see docs/comm.md).
class CommTimeoutError : public CommError {
 public:
  CommTimeoutError(int rank, Collective collective, double timeout_seconds,
                   std::vector<int> missing_ranks, const std::string& detail);
  const std::vector<int>& missing_ranks() const noexcept { return missing_ranks_; }
  double timeout_seconds() const noexcept { return timeout_seconds_; }

 private:
  double timeout_seconds_;
  std::vector<int> missing_ranks_;
};

}  // namespace strata::runtime::comm
