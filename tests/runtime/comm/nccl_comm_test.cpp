// Proves NcclComm runs every collective on device buffers (one rank, bootstrapped over LocalComm)
// and names the rank and call in its errors. Skips, saying why, when no CUDA device is visible.
#include "runtime/comm/nccl_comm.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/comm/local_comm.hpp"
#include "tests/runtime/comm/device_array.hpp"

namespace strata::runtime::comm {
namespace {

using testing::DeviceArray;

class NcclCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    if (!cuda_device_available(&reason)) GTEST_SKIP() << "NcclComm needs a CUDA device: " << reason;
  }
};

TEST_F(NcclCommTest, CollectivesOnDeviceBuffersWithOneRank) {
  LocalComm bootstrap;
  NcclComm comm(bootstrap, NcclCommOptions{std::chrono::seconds(60), -1});
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.backend_name(), "nccl");

  std::vector<float> values(1000);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  DeviceArray<float> send(1000);
  DeviceArray<float> recv(1000);
  send.upload(values);
  comm.all_gather(std::span<const float>(send.span()), recv.span());
  comm.synchronize();
  EXPECT_EQ(recv.download(), values);

  comm.reduce_scatter(std::span<const float>(send.span()), recv.span(), ReduceOp::kAvg);
  comm.synchronize();
  EXPECT_EQ(recv.download(), values);

  std::vector<Bf16> bf16(333, to_bf16(1.25f));
  DeviceArray<Bf16> bf16_device(333);
  bf16_device.upload(bf16);
  comm.all_reduce(bf16_device.span(), ReduceOp::kSum);
  comm.broadcast(bf16_device.span(), 0);
  comm.synchronize();
  EXPECT_EQ(bf16_device.download(), bf16);

  comm.barrier();
  EXPECT_EQ(comm.all_reduce_u64(7, ReduceOp::kMax), 7u);
  EXPECT_EQ(comm.all_reduce_f32(2.5f, ReduceOp::kSum), 2.5f);
  EXPECT_TRUE(comm.any_rank(true));
  EXPECT_EQ(comm.stats()[Collective::kAllGather].calls, 1u);
  EXPECT_EQ(comm.stats()[Collective::kAllReduce].calls, 4u);  // bf16 + u64 + f32 + any_rank
}

TEST_F(NcclCommTest, BadDeviceIsATypedErrorNamingRankAndCall) {
  LocalComm bootstrap;
  try {
    NcclComm comm(bootstrap, NcclCommOptions{std::chrono::seconds(5), 4096});
    FAIL() << "device 4096 accepted";
  } catch (const DeviceCommError& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("rank 0"), std::string::npos) << text;
    EXPECT_NE(text.find("cudaSetDevice"), std::string::npos) << text;
    EXPECT_EQ(error.collective(), Collective::kSetup);
  }
}

}  // namespace
}  // namespace strata::runtime::comm
