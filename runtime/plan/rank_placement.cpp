#include "runtime/plan/rank_placement.hpp"

#include <charconv>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#if defined(STRATA_HAVE_NCCL)
#include "runtime/comm/nccl_comm.hpp"
#endif

namespace strata::runtime {
namespace {

DeviceKind select_device_kind(DeviceKind requested, std::uint32_t cuda_device_count) {
  switch (requested) {
    case DeviceKind::kHost:
      return DeviceKind::kHost;
    case DeviceKind::kCuda:
      if (cuda_device_count == 0) {
        throw PlacementError(
            "[tiers.device] kind = \"cuda\" but no CUDA device is visible (a build without CUDA, "
            "no GPU, or CUDA_VISIBLE_DEVICES hides them all)");
      }
      return DeviceKind::kCuda;
    case DeviceKind::kAuto:
      return cuda_device_count > 0 ? DeviceKind::kCuda : DeviceKind::kHost;
  }
  return DeviceKind::kHost;
}

std::uint32_t select_device_index(const DeviceTierConfig& device, DeviceKind kind,
                                  const PlacementEnvironment& environment) {
  if (kind != DeviceKind::kCuda) return 0;
  const std::uint32_t count = environment.cuda_device_count;
  if (device.index != kLocalRankDevice) {
    const auto index = static_cast<std::uint32_t>(device.index);
    if (index >= count) {
      throw PlacementError(fmt::format(
          "[tiers.device] index = {} but only {} GPU(s) are visible (ordinals 0 to {})", index,
          count, count - 1));
    }
    return index;
  }
  const std::uint32_t local_rank = environment.local_rank.value_or(0);
  if (local_rank >= count) {
    throw PlacementError(fmt::format(
        "local rank {} (OMPI_COMM_WORLD_LOCAL_RANK) but only {} GPU(s) are visible: start at most "
        "{} rank(s) per node, or set [tiers.device] index to share a GPU",
        local_rank, count, count));
  }
  return local_rank;
}

CommChoice select_comm(CommBackend backend, DeviceKind kind,
                       const PlacementEnvironment& environment) {
  switch (backend) {
    case CommBackend::kMpi:
      return CommChoice::kHost;
    case CommBackend::kNccl:
      if (!environment.build_has_nccl) {
        throw PlacementError(
            "[comm] backend = \"nccl\" requested but this build has no NCCL (configure with CUDA "
            "and NCCL found, or use backend = \"mpi\")");
      }
      if (kind != DeviceKind::kCuda) {
        throw PlacementError(
            "[comm] backend = \"nccl\" needs a CUDA device, but the device is the host device");
      }
      return CommChoice::kNccl;
    case CommBackend::kAuto:
      return environment.build_has_nccl && kind == DeviceKind::kCuda && environment.ranks > 1
                 ? CommChoice::kNccl
                 : CommChoice::kHost;
  }
  return CommChoice::kHost;
}

}  // namespace

std::string_view to_string(CommChoice choice) {
  return choice == CommChoice::kNccl ? "nccl" : "mpi";
}

RankPlacement select_rank_placement(const Config& config, const PlacementEnvironment& environment) {
  RankPlacement placement;
  placement.device_kind = select_device_kind(config.tiers.device.kind,
                                             environment.cuda_device_count);
  placement.device_index =
      select_device_index(config.tiers.device, placement.device_kind, environment);
  placement.comm = select_comm(config.comm.backend, placement.device_kind, environment);
  return placement;
}

std::optional<std::uint32_t> parse_local_rank(const char* value) {
  if (value == nullptr) return std::nullopt;
  const char* end = value + std::strlen(value);
  std::uint32_t rank = 0;
  const auto [stop, error] = std::from_chars(value, end, rank);
  if (error != std::errc() || stop != end || value == end || rank > 65535) {
    throw PlacementError(fmt::format(
        "OMPI_COMM_WORLD_LOCAL_RANK = \"{}\" is not a local rank (a whole number 0 to 65535)",
        value));
  }
  return rank;
}

PlacementEnvironment detect_placement_environment(std::uint32_t ranks) {
  PlacementEnvironment environment;
#if defined(STRATA_HAVE_NCCL)
  environment.build_has_nccl = true;
#endif
  environment.local_rank = parse_local_rank(std::getenv("OMPI_COMM_WORLD_LOCAL_RANK"));
  environment.cuda_device_count = static_cast<std::uint32_t>(tiers::cuda_device_count());
  environment.ranks = ranks;
  return environment;
}

tiers::DeviceOptions placed_device_options(const RankPlacement& placement, const Config& config) {
  tiers::DeviceOptions options;
  options.kind = placement.device_kind;
  options.index = static_cast<int>(placement.device_index);
  options.budget_bytes = config.tiers.device.budget_bytes;
  return options;
}

std::unique_ptr<comm::Communicator> make_placed_device_comm(const RankPlacement& placement,
                                                            comm::Communicator& host_comm) {
  if (placement.comm != CommChoice::kNccl) return nullptr;
#if defined(STRATA_HAVE_NCCL)
  comm::NcclCommOptions options;
  options.device = static_cast<int>(placement.device_index);
  return std::make_unique<comm::NcclComm>(host_comm, options);
#else
  (void)host_comm;
  throw PlacementError("NcclComm was chosen but this build has no NCCL");
#endif
}

}  // namespace strata::runtime
