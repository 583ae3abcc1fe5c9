// Proves NcclComm's collectives across 2+ ranks (one GPU each, bootstrapped over MpiComm) give the
// exact sums, gathers and broadcasts. Skips, saying why, when fewer GPUs than ranks are visible.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "runtime/comm/nccl_comm.hpp"
#include "tests/runtime/comm/device_array.hpp"
#include "tests/runtime/comm/mpi_test_main.hpp"
#include "tiers/device/device.hpp"

namespace strata::runtime::comm {
namespace {

using testing::DeviceArray;

class NcclMpiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const int ranks = mpi_testing::world().size();
    const int gpus = tiers::cuda_device_count();
    if (ranks < 2) GTEST_SKIP() << "NcclComm across ranks needs mpirun -np 2 or more";
    if (gpus < ranks) {
      GTEST_SKIP() << fmt::format("NcclComm across {} ranks needs {} GPUs, {} visible", ranks,
                                  ranks, gpus);
    }
    // One GPU per rank, by rank: the test launches on one node.
    const NcclCommOptions options{std::chrono::seconds(60), mpi_testing::world().rank()};
    comm_ = std::make_unique<NcclComm>(mpi_testing::world(), options);
  }

  std::unique_ptr<NcclComm> comm_;
};

// Small integers in fp32: every sum is exact whatever order NCCL adds in.
float value(int rank, std::size_t i) {
  return static_cast<float>(rank * 1000 + static_cast<int>(i % 997));
}

TEST_F(NcclMpiTest, AllGatherConcatenatesInRankOrder) {
  const int ranks = comm_->size();
  const std::size_t count = 4099;  // not a multiple of anything NCCL chunks by
  std::vector<float> mine(count);
  for (std::size_t i = 0; i < count; ++i) mine[i] = value(comm_->rank(), i);
  DeviceArray<float> send(count);
  DeviceArray<float> recv(count * ranks);
  send.upload(mine);
  comm_->all_gather(std::span<const float>(send.span()), recv.span());
  comm_->synchronize();
  const std::vector<float> gathered = recv.download();
  for (int r = 0; r < ranks; ++r) {
    for (std::size_t i = 0; i < count; ++i) {
      ASSERT_EQ(gathered[r * count + i], value(r, i)) << "rank " << r << " element " << i;
    }
  }
}

TEST_F(NcclMpiTest, ReduceScatterAndAllReduceSumExactly) {
  const int ranks = comm_->size();
  const std::size_t chunk = 1500;
  std::vector<float> mine(chunk * ranks);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = value(comm_->rank(), i);
  DeviceArray<float> send(chunk * ranks);
  DeviceArray<float> recv(chunk);
  send.upload(mine);
  comm_->reduce_scatter(std::span<const float>(send.span()), recv.span(), ReduceOp::kSum);
  comm_->all_reduce(send.span(), ReduceOp::kSum);
  comm_->synchronize();
  const std::vector<float> scattered = recv.download();
  const std::vector<float> reduced = send.download();
  for (std::size_t i = 0; i < chunk * ranks; ++i) {
    float sum = 0;
    for (int r = 0; r < ranks; ++r) sum += value(r, i);
    ASSERT_EQ(reduced[i], sum) << "all_reduce element " << i;
    const std::size_t begin = chunk * static_cast<std::size_t>(comm_->rank());
    if (i >= begin && i < begin + chunk) {
      ASSERT_EQ(scattered[i - begin], sum) << "reduce_scatter element " << i;
    }
  }
}

TEST_F(NcclMpiTest, BroadcastAndScalarsReachEveryRank) {
  const int root = comm_->size() - 1;
  std::vector<float> values(777, comm_->rank() == root ? 3.5f : -1.0f);
  DeviceArray<float> data(values.size());
  data.upload(values);
  comm_->broadcast(data.span(), root);
  comm_->synchronize();
  EXPECT_EQ(data.download(), std::vector<float>(values.size(), 3.5f));
  EXPECT_EQ(comm_->all_reduce_u64(static_cast<std::uint64_t>(comm_->rank()), ReduceOp::kMax),
            static_cast<std::uint64_t>(root));
  EXPECT_EQ(comm_->all_reduce_f32(1.0f, ReduceOp::kSum), static_cast<float>(comm_->size()));
  EXPECT_TRUE(comm_->any_rank(comm_->rank() == root));
  EXPECT_FALSE(comm_->any_rank(false));
  comm_->barrier();
}

}  // namespace
}  // namespace strata::runtime::comm
