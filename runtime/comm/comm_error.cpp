#include "runtime/comm/comm_error.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace strata::runtime::comm {

std::string_view to_string(Collective collective) {
  switch (collective) {
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kBarrier:
      return "barrier";
    case Collective::kSetup:
      return "setup";
  }
  return "?";
}

CommError::CommError(int rank, Collective collective, const std::string& detail)
    : std::runtime_error(
          fmt::format("strata comm: rank {}, {}: {}", rank, to_string(collective), detail)),
      rank_(rank),
      collective_(collective) {}

MpiError::MpiError(int rank, Collective collective, std::string_view mpi_call, int mpi_code,
                   std::string_view mpi_text)
    : CommError(rank, collective,
                fmt::format("{} failed with MPI error {}: {}", mpi_call, mpi_code, mpi_text)),
      mpi_code_(mpi_code) {}

DeviceCommError::DeviceCommError(int rank, Collective collective, std::string_view call,
                                 int library_code, std::string_view library_text)
    : CommError(rank, collective,
                fmt::format("{} failed with code {}: {}", call, library_code, library_text)),
      library_code_(library_code) {}

CommTimeoutError::CommTimeoutError(int rank, Collective collective, double timeout_seconds,
                                   std::vector<int> missing_ranks, const std::string& detail)
    : CommError(rank, collective,
                fmt::format("timed out after {:.3g} s; {}{}", timeout_seconds,
                            missing_ranks.empty() ? std::string("no rank is known to be missing")
                                                  : fmt::format("rank(s) {} did not arrive",
                                                                fmt::join(missing_ranks, ", ")),
                            detail.empty() ? std::string() : "; " + detail)),
      timeout_seconds_(timeout_seconds),
      missing_ranks_(std::move(missing_ranks)) {}

}  // namespace strata::runtime::comm
