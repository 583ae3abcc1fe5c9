// Proves select_rank_placement's rules: device kind, the local rank's GPU or the explicit index,
// NCCL only where the build, the device and the rank count allow it, and a clear error otherwise.
#include "runtime/plan/rank_placement.hpp"

#include <string>

#include <gtest/gtest.h>

namespace strata::runtime {
namespace {

Config config_with(DeviceKind kind, std::int32_t index, CommBackend backend) {
  Config config;
  config.tiers.device.kind = kind;
  config.tiers.device.index = index;
  config.comm.backend = backend;
  return config;
}

PlacementEnvironment environment(bool nccl, std::optional<std::uint32_t> local_rank,
                                 std::uint32_t gpus, std::uint32_t ranks) {
  return {.build_has_nccl = nccl, .local_rank = local_rank, .cuda_device_count = gpus,
          .ranks = ranks};
}

std::string placement_error(const Config& config, const PlacementEnvironment& env) {
  try {
    select_rank_placement(config, env);
  } catch (const PlacementError& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(RankPlacement, EachRankTakesItsLocalRanksGpu) {
  const Config config = config_with(DeviceKind::kCuda, kLocalRankDevice, CommBackend::kAuto);
  for (std::uint32_t local = 0; local < 8; ++local) {
    const RankPlacement placement = select_rank_placement(config, environment(true, local, 8, 8));
    EXPECT_EQ(placement.device_kind, DeviceKind::kCuda);
    EXPECT_EQ(placement.device_index, local);
    EXPECT_EQ(placement.comm, CommChoice::kNccl);
  }
}

TEST(RankPlacement, WithoutMpirunTheFirstGpu) {
  const Config config = config_with(DeviceKind::kCuda, kLocalRankDevice, CommBackend::kAuto);
  EXPECT_EQ(select_rank_placement(config, environment(true, std::nullopt, 4, 1)).device_index, 0u);
}

TEST(RankPlacement, ExplicitIndexOverridesTheLocalRank) {
  const Config config = config_with(DeviceKind::kCuda, 2, CommBackend::kAuto);
  for (std::uint32_t local = 0; local < 4; ++local) {
    EXPECT_EQ(select_rank_placement(config, environment(true, local, 4, 4)).device_index, 2u);
  }
}

TEST(RankPlacement, LocalRankPastTheGpusIsAnError) {
  const Config config = config_with(DeviceKind::kCuda, kLocalRankDevice, CommBackend::kAuto);
  const std::string message = placement_error(config, environment(true, 3, 2, 4));
  EXPECT_NE(message.find("local rank 3"), std::string::npos) << message;
  EXPECT_NE(message.find("only 2 GPU"), std::string::npos) << message;
}

TEST(RankPlacement, ExplicitIndexPastTheGpusIsAnError) {
  const Config config = config_with(DeviceKind::kCuda, 5, CommBackend::kAuto);
  const std::string message = placement_error(config, environment(false, 0, 2, 1));
  EXPECT_NE(message.find("[tiers.device] index = 5"), std::string::npos) << message;
  EXPECT_NE(message.find("only 2 GPU"), std::string::npos) << message;
}

TEST(RankPlacement, CudaWithoutGpuIsAnError) {
  const Config config = config_with(DeviceKind::kCuda, kLocalRankDevice, CommBackend::kAuto);
  const std::string message = placement_error(config, environment(false, std::nullopt, 0, 1));
  EXPECT_NE(message.find("kind = \"cuda\" but no CUDA device"), std::string::npos) << message;
}

TEST(RankPlacement, AutoDeviceFollowsTheGpuCount) {
  const Config config = config_with(DeviceKind::kAuto, kLocalRankDevice, CommBackend::kAuto);
  EXPECT_EQ(select_rank_placement(config, environment(true, 1, 2, 2)),
            (RankPlacement{DeviceKind::kCuda, 1, CommChoice::kNccl}));
  EXPECT_EQ(select_rank_placement(config, environment(true, 1, 0, 2)),
            (RankPlacement{DeviceKind::kHost, 0, CommChoice::kHost}));
}

TEST(RankPlacement, HostDeviceIgnoresGpusAndLocalRank) {
  // A host-device run under mpirun on a node with fewer GPUs than ranks is fine: no GPU is opened.
  const Config config = config_with(DeviceKind::kHost, kLocalRankDevice, CommBackend::kAuto);
  EXPECT_EQ(select_rank_placement(config, environment(true, 7, 2, 8)),
            (RankPlacement{DeviceKind::kHost, 0, CommChoice::kHost}));
}

TEST(RankPlacement, AutoBackendNeedsNcclCudaAndSeveralRanks) {
  const Config config = config_with(DeviceKind::kAuto, kLocalRankDevice, CommBackend::kAuto);
  // Every combination of (build has NCCL, GPUs visible, ranks > 1): NCCL only when all three hold.
  for (const bool nccl : {false, true}) {
    for (const std::uint32_t gpus : {0u, 2u}) {
      for (const std::uint32_t ranks : {1u, 2u}) {
        const CommChoice expected =
            nccl && gpus > 0 && ranks > 1 ? CommChoice::kNccl : CommChoice::kHost;
        EXPECT_EQ(select_rank_placement(config, environment(nccl, 0, gpus, ranks)).comm, expected)
            << "nccl " << nccl << " gpus " << gpus << " ranks " << ranks;
      }
    }
  }
}

TEST(RankPlacement, MpiBackendIsAlwaysHonoured) {
  const Config config = config_with(DeviceKind::kCuda, kLocalRankDevice, CommBackend::kMpi);
  EXPECT_EQ(select_rank_placement(config, environment(true, 1, 2, 2)),
            (RankPlacement{DeviceKind::kCuda, 1, CommChoice::kHost}));
}

TEST(RankPlacement, NcclBackendOnOneRankIsHonoured) {
  const Config config = config_with(DeviceKind::kCuda, kLocalRankDevice, CommBackend::kNccl);
  EXPECT_EQ(select_rank_placement(config, environment(true, std::nullopt, 1, 1)).comm,
            CommChoice::kNccl);
}

TEST(RankPlacement, NcclWithoutNcclBuildIsAnError) {
  const Config config = config_with(DeviceKind::kCuda, kLocalRankDevice, CommBackend::kNccl);
  const std::string message = placement_error(config, environment(false, 0, 2, 2));
  EXPECT_NE(message.find("nccl\" requested but this build has no NCCL"), std::string::npos)
      << message;
}

TEST(RankPlacement, NcclOnTheHostDeviceIsAnError) {
  for (const DeviceKind kind : {DeviceKind::kHost, DeviceKind::kAuto}) {
    const Config config = config_with(kind, kLocalRankDevice, CommBackend::kNccl);
    const std::string message = placement_error(config, environment(true, 0, 0, 2));
    EXPECT_NE(message.find("needs a CUDA device"), std::string::npos) << message;
  }
}

TEST(RankPlacement, ParsesTheLocalRankVariable) {
  EXPECT_EQ(parse_local_rank(nullptr), std::nullopt);
  EXPECT_EQ(parse_local_rank("0"), 0u);
  EXPECT_EQ(parse_local_rank("7"), 7u);
  for (const char* bad : {"", "-1", "x", "3 ", "1.5", "70000"}) {
    try {
      parse_local_rank(bad);
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const PlacementError& error) {
      EXPECT_NE(std::string(error.what()).find(std::string("\"") + bad + "\""), std::string::npos)
          << error.what();
    }
  }
}

TEST(RankPlacement, ConfigKeysReachTheDecision) {
  const Config config = parse_config(
      "[tiers.device]\nkind = \"cuda\"\nindex = 1\n[comm]\nbackend = \"mpi\"\n");
  EXPECT_EQ(config.tiers.device.index, 1);
  EXPECT_EQ(config.comm.backend, CommBackend::kMpi);
  EXPECT_EQ(select_rank_placement(config, environment(true, 0, 2, 2)),
            (RankPlacement{DeviceKind::kCuda, 1, CommChoice::kHost}));
  EXPECT_EQ(parse_config("").tiers.device.index, kLocalRankDevice);
  EXPECT_THROW(parse_config("[comm]\nbackend = \"gloo\"\n"), ConfigError);
  EXPECT_THROW(parse_config("[tiers.device]\nindex = -2\n"), ConfigError);
}

}  // namespace
}  // namespace strata::runtime
