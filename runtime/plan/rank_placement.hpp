// Rank placement: which device a rank opens and which Communicator carries its collectives,
// decided by one pure function so every rule is tested without a GPU or mpirun.
//
// Device: [tiers.device] kind "host" gives the host device; "cuda" needs a visible GPU; "auto"
//   takes CUDA when a GPU is visible. The CUDA ordinal is [tiers.device] index when set (an
//   explicit override, the same on every rank), else the rank's local rank on its node
//   (OMPI_COMM_WORLD_LOCAL_RANK, 0 without mpirun). An ordinal past the visible GPUs is an error,
//   never wrapped around: two ranks silently sharing a GPU halve its memory budget.
// Communicator: [comm] backend "mpi" gives the host communicator (LocalComm or MpiComm); "nccl"
//   needs a build with NCCL and a CUDA device; "auto" takes NCCL when the build has it, the
//   device is CUDA and there is more than one rank (one rank calls no collective worth a NCCL
//   communicator).
// Errors: PlacementError naming the key, the value and what is missing.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "runtime/comm/communicator.hpp"
#include "runtime/config/config.hpp"
#include "tiers/device/device.hpp"

namespace strata::runtime {

class PlacementError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a rank finds around it; detect_placement_environment() fills it from the real process.
struct PlacementEnvironment {
  bool build_has_nccl = false;
  std::optional<std::uint32_t> local_rank;  // OMPI_COMM_WORLD_LOCAL_RANK; empty without mpirun
  std::uint32_t cuda_device_count = 0;      // GPUs visible to this process (0: none or no CUDA)
  std::uint32_t ranks = 1;                  // ranks in the job
};

enum class CommChoice { kHost, kNccl };  // kHost: LocalComm for one rank, MpiComm under mpirun
std::string_view to_string(CommChoice choice);

struct RankPlacement {
  DeviceKind device_kind = DeviceKind::kHost;  // kHost or kCuda, never kAuto
  std::uint32_t device_index = 0;              // CUDA ordinal; 0 for the host device
  CommChoice comm = CommChoice::kHost;

  bool operator==(const RankPlacement&) const = default;
};

// The pure decision: reads config.tiers.device (kind, index) and config.comm.backend. Throws
// PlacementError.
RankPlacement select_rank_placement(const Config& config, const PlacementEnvironment& environment);

// Parses OMPI_COMM_WORLD_LOCAL_RANK: empty for nullptr, the value for a decimal integer in
// [0, 65535], PlacementError (quoting the value) otherwise.
std::optional<std::uint32_t> parse_local_rank(const char* value);

// The real process's environment: STRATA_HAVE_NCCL, OMPI_COMM_WORLD_LOCAL_RANK, the CUDA device
// count (tiers::cuda_device_count()) and `ranks`.
PlacementEnvironment detect_placement_environment(std::uint32_t ranks);

// The DeviceOptions that open the placed device (kind, ordinal, [tiers.device] budget).
tiers::DeviceOptions placed_device_options(const RankPlacement& placement, const Config& config);

// For CommChoice::kNccl, a NcclComm on the placed GPU bootstrapped over `host_comm` (collective
// over its ranks); nullptr for kHost, where `host_comm` carries the collectives itself. NcclComm
// keeps no reference to `host_comm` after construction.
std::unique_ptr<comm::Communicator> make_placed_device_comm(const RankPlacement& placement,
                                                            comm::Communicator& host_comm);

}  // namespace strata::runtime
