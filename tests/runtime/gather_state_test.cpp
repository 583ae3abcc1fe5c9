// The gather's state machine (runtime/engine/gathered_copy.hpp): each legal path a unit's gather
// takes through GatherState and OwnShard reads back the states, and the data, the Engine expects.
#include "runtime/engine/gathered_copy.hpp"

#include <array>
#include <memory>

#include <gtest/gtest.h>

#include "tiers/device/device.hpp"

namespace strata::runtime::detail {
namespace {

constexpr std::uint64_t kUnitBytes = 4096;

class FakeGather final : public comm::PendingAllGather {
 public:
  void send_own() override {}
  bool test() override { return true; }
  void wait() override {}
};

class GatherStateTest : public ::testing::Test {
 protected:
  GatherStateTest() {
    tiers::DeviceOptions options;
    options.kind = tiers::DeviceKind::kHost;
    options.budget_bytes = 16 * kUnitBytes;
    device_ = tiers::make_device(options);
  }

  // evicted -> loading, with an fp32 and a 16-bit buffer.
  void load(GatheredCopy& copy) {
    copy.begin_load(device_->allocate(kUnitBytes), device_->allocate(kUnitBytes / 2));
  }
  void create_events(GatheredCopy& copy) {
    copy.copied.emplace(device_->create_event());
    copy.ready.emplace(device_->create_event());
  }

  std::unique_ptr<tiers::Device> device_;
};

TEST_F(GatherStateTest, ANewCopyIsEvictedWithItsShardInItsHome) {
  const GatheredCopy copy;
  EXPECT_EQ(copy.state(), GatherState::kEvicted);
  EXPECT_EQ(copy.own(), OwnShard::kInHome);
  EXPECT_FALSE(copy.awaiting_update());
  EXPECT_FALSE(copy.sends_after_update());
  EXPECT_FALSE(copy.full32);
}

// One rank on the staged path: the copy and cast queued ahead of use, waited for, evicted; the
// events stay for the unit's next queued gather.
TEST_F(GatherStateTest, QueuedAheadThenReadyThenEvicted) {
  GatheredCopy copy;
  load(copy);
  EXPECT_EQ(copy.state(), GatherState::kLoading);
  EXPECT_TRUE(copy.full32);
  EXPECT_TRUE(copy.full16);
  create_events(copy);
  copy.queue_copy();
  EXPECT_EQ(copy.state(), GatherState::kQueued);
  copy.finish_queued();
  EXPECT_EQ(copy.state(), GatherState::kReady);
  copy.evict();
  EXPECT_EQ(copy.state(), GatherState::kEvicted);
  EXPECT_FALSE(copy.full32);
  EXPECT_FALSE(copy.full16);
  EXPECT_TRUE(copy.copied.has_value());
  load(copy);  // a later load starts over
  EXPECT_EQ(copy.state(), GatherState::kLoading);
  EXPECT_EQ(copy.own(), OwnShard::kInHome);
}

// A gather at use: loading, then ready once wait_load has gathered and cast it.
TEST_F(GatherStateTest, GatheredAtUse) {
  GatheredCopy copy;
  load(copy);
  copy.mark_ready();
  EXPECT_EQ(copy.state(), GatherState::kReady);
}

// The own shard read from NVMe: reading until wait_load has waited for every read.
TEST_F(GatherStateTest, OwnShardReadThenLanded) {
  GatheredCopy copy;
  load(copy);
  copy.begin_reads();
  EXPECT_EQ(copy.own(), OwnShard::kReading);
  copy.finish_reads();
  EXPECT_EQ(copy.own(), OwnShard::kLanded);
  EXPECT_TRUE(copy.reads.empty());
  copy.mark_ready();
  copy.evict();
  EXPECT_EQ(copy.own(), OwnShard::kInHome);
}

// The own shard from the step's update: due sub-group by sub-group, landed after the last.
TEST_F(GatherStateTest, OwnShardHandedOverByTheUpdate) {
  GatheredCopy copy;
  load(copy);
  std::array<std::byte, 64> staging{};
  copy.await_update(2, staging.data());
  EXPECT_EQ(copy.own(), OwnShard::kFromUpdate);
  EXPECT_TRUE(copy.awaiting_update());
  EXPECT_EQ(copy.fresh_dest(), staging.data());
  copy.hand_over_group();
  EXPECT_TRUE(copy.awaiting_update());
  copy.hand_over_group();
  EXPECT_FALSE(copy.awaiting_update());
  EXPECT_EQ(copy.own(), OwnShard::kLanded);
  copy.evict();
  EXPECT_EQ(copy.fresh_dest(), nullptr);
}

// The update that was to hand the shard over failed: wait_load reads the store's shard into the
// same place instead.
TEST_F(GatherStateTest, AFailedUpdateFallsBackToReads) {
  GatheredCopy copy;
  load(copy);
  std::array<std::byte, 64> staging{};
  copy.await_update(3, staging.data());
  copy.hand_over_group();
  copy.begin_reads();
  EXPECT_EQ(copy.own(), OwnShard::kReading);
  EXPECT_FALSE(copy.awaiting_update());
  EXPECT_EQ(copy.fresh_dest(), staging.data());
}

// Several ranks, in place: an all-gather started at the load whose own block the deferred update's
// worker sends; finished at wait_load.
TEST_F(GatherStateTest, AllGatheredAheadThenReady) {
  GatheredCopy copy;
  load(copy);
  copy.begin_all_gather(std::make_unique<FakeGather>(), OwnSend::kAfterUpdate, 0);
  EXPECT_EQ(copy.state(), GatherState::kAllGathering);
  EXPECT_TRUE(copy.sends_after_update());
  EXPECT_NE(copy.pending, nullptr);
  copy.finish_all_gather();
  EXPECT_EQ(copy.state(), GatherState::kGathered);
  EXPECT_EQ(copy.pending, nullptr);
  EXPECT_FALSE(copy.sends_after_update());
  copy.mark_ready();
  EXPECT_EQ(copy.state(), GatherState::kReady);
}

// Several ranks on the staged path: the all-gather complete in its slot, then the copy and cast
// queued on the streams.
TEST_F(GatherStateTest, AllGatheredThenQueued) {
  GatheredCopy copy;
  load(copy);
  copy.begin_all_gather(std::make_unique<FakeGather>(), OwnSend::kAfterReads, 7);
  EXPECT_EQ(copy.send_job, 7U);
  copy.send_job = 0;  // finish_send_job: the sender ran it
  copy.finish_all_gather();
  create_events(copy);
  copy.queue_copy();
  EXPECT_EQ(copy.state(), GatherState::kQueued);
  copy.finish_queued();
  EXPECT_EQ(copy.state(), GatherState::kReady);
}

// A prefetch never used: its all-gather, waited for, goes with the copy.
TEST_F(GatherStateTest, AnUnusedAllGatherIsEvicted) {
  GatheredCopy copy;
  load(copy);
  copy.begin_all_gather(std::make_unique<FakeGather>(), OwnSend::kNow, 0);
  copy.pending->wait();
  copy.evict();
  EXPECT_EQ(copy.state(), GatherState::kEvicted);
  EXPECT_EQ(copy.pending, nullptr);
  EXPECT_FALSE(copy.sends_after_update());
}

}  // namespace
}  // namespace strata::runtime::detail
