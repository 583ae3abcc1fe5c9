// The GatherSender (runtime/engine/gather_sender.hpp) without MPI: fake gathers record which thread sent
// their own block and when. Runs under ASan and TSan with the runtime suite.
#include "runtime/engine/gather_sender.hpp"

#include <atomic>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace strata::runtime::detail {
namespace {

class FakeGather final : public comm::PendingAllGather {
 public:
  explicit FakeGather(bool fail = false) : fail_(fail) {}
  void send_own() override {
    sender_ = std::this_thread::get_id();
    sends_.fetch_add(1);
    if (fail_) throw std::runtime_error("MPI_Isend failed");
  }
  bool test() override { return sends_.load() > 0; }
  void wait() override {}
  int sends() const { return sends_.load(); }
  std::thread::id sender() const { return sender_; }

 private:
  bool fail_;
  std::atomic<int> sends_{0};
  std::thread::id sender_;
};

// Each block is sent once its reads are in, not before, on the sender's own thread, in
// submission order; a job whose read failed sends nothing but is done; a send that throws is
// done too (the gather reports it); the destructor runs what was submitted.
TEST(GatherSender, SendsEachOwnBlockOnceItIsInOnItsOwnThread) {
  std::promise<bool> first_in, second_in;
  std::shared_future<bool> first = first_in.get_future().share();
  std::shared_future<bool> second = second_in.get_future().share();
  FakeGather a, b, failed_read, failed_send(true), at_the_end;
  std::uint64_t last = 0;
  {
    GatherSender sender;
    const std::uint64_t job_a = sender.submit([first] { return first.get(); }, a);
    const std::uint64_t job_b = sender.submit([second] { return second.get(); }, b);
    const std::uint64_t job_failed_read = sender.submit([] { return false; }, failed_read);
    const std::uint64_t job_throws = sender.submit(
        []() -> bool { throw std::runtime_error("checksum mismatch"); }, failed_read);
    const std::uint64_t job_failed_send = sender.submit([] { return true; }, failed_send);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_FALSE(sender.done(job_a));
    EXPECT_EQ(a.sends(), 0) << "sent before its reads were in";
    second_in.set_value(true);  // b's reads are in, but a comes first
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(b.sends(), 0) << "jobs run in submission order";
    first_in.set_value(true);
    sender.wait(job_b);
    EXPECT_TRUE(sender.done(job_a));
    EXPECT_EQ(a.sends(), 1);
    EXPECT_EQ(b.sends(), 1);
    EXPECT_NE(a.sender(), std::this_thread::get_id());
    sender.wait(job_failed_send);
    EXPECT_TRUE(sender.done(job_failed_read));
    EXPECT_TRUE(sender.done(job_throws));
    EXPECT_EQ(failed_read.sends(), 0) << "a block whose read failed was sent";
    EXPECT_EQ(failed_send.sends(), 1);
    last = sender.submit([] { return true; }, at_the_end);
  }
  EXPECT_GT(last, 0u);
  EXPECT_EQ(at_the_end.sends(), 1) << "the destructor dropped a submitted job";
}

}  // namespace
}  // namespace strata::runtime::detail
