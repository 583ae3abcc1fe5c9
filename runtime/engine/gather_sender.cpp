#include "runtime/engine/gather_sender.hpp"

#include <utility>

#include "base/assert.hpp"

namespace strata::runtime::detail {

GatherSender::GatherSender() : thread_([this] { loop(); }) {}

GatherSender::~GatherSender() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  thread_.join();
}

std::uint64_t GatherSender::submit(std::function<bool()> own_block_in,
                                   comm::PendingAllGather& gather) {
  STRATA_ASSERT(own_block_in != nullptr, "a send job without its wait for the own block");
  std::uint64_t number = 0;
  {
    const std::lock_guard lock(mutex_);
    STRATA_ASSERT(!stopping_, "a send job submitted to a stopping GatherSender");
    queue_.push_back(Job{std::move(own_block_in), &gather});
    number = ++submitted_;
    STRATA_ASSERT(submitted_ - completed_ >= queue_.size(), "jobs lost from the queue");
  }
  work_.notify_all();
  return number;
}

bool GatherSender::done(std::uint64_t number) {
  const std::lock_guard lock(mutex_);
  STRATA_ASSERT(number != 0 && number <= submitted_, "a send job never submitted");
  return completed_ >= number;
}

void GatherSender::wait(std::uint64_t number) {
  std::unique_lock lock(mutex_);
  STRATA_ASSERT(number != 0 && number <= submitted_, "waiting for a send job never submitted");
  finished_.wait(lock, [&] { return completed_ >= number; });
  STRATA_ASSERT(completed_ >= number, "woken before the job ran");
}

void GatherSender::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mutex_);
      work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    STRATA_ASSERT(job.gather != nullptr && job.own_block_in != nullptr, "a send job without work");
    bool in = false;
    try {
      in = job.own_block_in();
    } catch (...) {  // reported by the Engine's own wait on the read
    }
    if (in) {
      try {
        job.gather->send_own();
      } catch (...) {  // kept by the gather: its next test() or wait() throws it
      }
    }
    {
      const std::lock_guard lock(mutex_);
      ++completed_;
      STRATA_ASSERT(completed_ <= submitted_, "more send jobs run than submitted");
    }
    finished_.notify_all();
  }
}

}  // namespace strata::runtime::detail
