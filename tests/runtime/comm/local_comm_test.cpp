// Proves LocalComm's collectives are the one-rank identities, that it counts statistics like every
// backend, that chunk_of partitions exactly, and that make_communicator() is local without mpirun.
#include "runtime/comm/local_comm.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <vector>

#include "runtime/comm/communicator.hpp"

namespace strata::runtime::comm {
namespace {

TEST(LocalCommTest, CollectivesAreIdentities) {
  LocalComm comm;
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);

  std::vector<float> send(37);
  std::iota(send.begin(), send.end(), 1.0f);
  std::vector<float> recv(37, 0.0f);
  comm.all_gather(std::span<const float>(send), std::span<float>(recv));
  EXPECT_EQ(recv, send);

  std::vector<Bf16> grads(5, to_bf16(2.5f));
  std::vector<Bf16> shard(5);
  comm.reduce_scatter(std::span<const Bf16>(grads), std::span<Bf16>(shard), ReduceOp::kAvg);
  EXPECT_EQ(shard, grads);

  std::vector<Fp16> values = {to_fp16(1.0f), to_fp16(-3.0f)};
  comm.all_reduce(std::span<Fp16>(values), ReduceOp::kSum);
  EXPECT_EQ(values[0], to_fp16(1.0f));
  EXPECT_EQ(values[1], to_fp16(-3.0f));

  std::vector<std::uint8_t> bytes = {1, 2, 3};
  comm.broadcast(std::span<std::uint8_t>(bytes), 0);
  EXPECT_EQ(bytes, (std::vector<std::uint8_t>{1, 2, 3}));
  comm.barrier();

  EXPECT_EQ(comm.all_reduce_u64(41, ReduceOp::kMax), 41u);
  EXPECT_EQ(comm.all_reduce_f32(0.25f, ReduceOp::kAvg), 0.25f);
  EXPECT_TRUE(comm.any_rank(true));
  EXPECT_FALSE(comm.any_rank(false));
}

TEST(LocalCommTest, CountsCallsAndPayloadButSendsNothing) {
  LocalComm comm;
  std::vector<float> buffer(100);
  comm.all_gather(std::span<const float>(buffer), std::span<float>(buffer));
  comm.all_gather(std::span<const float>(buffer), std::span<float>(buffer));
  comm.all_reduce(std::span<float>(buffer), ReduceOp::kSum);
  comm.barrier();
  const CommStats& stats = comm.stats();
  EXPECT_EQ(stats[Collective::kAllGather].calls, 2u);
  EXPECT_EQ(stats[Collective::kAllGather].payload_bytes, 800u);
  EXPECT_EQ(stats[Collective::kAllReduce].calls, 1u);
  EXPECT_EQ(stats[Collective::kAllReduce].payload_bytes, 400u);
  EXPECT_EQ(stats[Collective::kBarrier].calls, 1u);
  EXPECT_EQ(stats[Collective::kReduceScatter].calls, 0u);
  EXPECT_EQ(stats.total_sent_bytes(), 0u);
  EXPECT_EQ(stats.total_payload_bytes(), 1200u);
  comm.reset_stats();
  EXPECT_EQ(comm.stats()[Collective::kAllGather].calls, 0u);
}

TEST(LocalCommTest, ChunkOfPartitionsExactlyWithTheRemainderFirst) {
  for (std::size_t total : {0u, 1u, 5u, 7u, 64u, 1001u}) {
    for (int size = 1; size <= 5; ++size) {
      std::size_t next = 0;
      for (int rank = 0; rank < size; ++rank) {
        const Chunk chunk = chunk_of(total, size, rank);
        EXPECT_EQ(chunk.begin, next) << total << " " << size << " " << rank;
        EXPECT_LE(chunk.count, total / static_cast<std::size_t>(size) + 1);
        next += chunk.count;
      }
      EXPECT_EQ(next, total);
    }
  }
  EXPECT_EQ(chunk_of(7, 3, 0).count, 3u);
  EXPECT_EQ(chunk_of(7, 3, 2).count, 2u);
}

TEST(LocalCommTest, MakeCommunicatorIsLocalWithoutMpirun) {
  if (launched_by_mpirun()) GTEST_SKIP() << "this process was started by mpirun";
  auto comm = make_communicator();
  EXPECT_EQ(comm->backend_name(), "local");
  EXPECT_EQ(comm->size(), 1);
}

TEST(LocalCommTest, ErrorsNameRankAndCollective) {
  const CommTimeoutError error(2, Collective::kAllReduce, 2.0, {1, 3}, "detail here");
  const std::string text = error.what();
  EXPECT_NE(text.find("rank 2"), std::string::npos) << text;
  EXPECT_NE(text.find("all_reduce"), std::string::npos) << text;
  EXPECT_NE(text.find("rank(s) 1, 3 did not arrive"), std::string::npos) << text;
  EXPECT_EQ(error.missing_ranks(), (std::vector<int>{1, 3}));
  const MpiError mpi(0, Collective::kBroadcast, "MPI_Ibcast", 5,
                     "MPI_ERR_TRUNCATE: message truncated");
  EXPECT_NE(std::string(mpi.what()).find("MPI_Ibcast failed with MPI error 5: MPI_ERR_TRUNCATE"),
            std::string::npos)
      << mpi.what();
}

}  // namespace
}  // namespace strata::runtime::comm
