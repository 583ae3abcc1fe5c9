#include "runtime/engine/gather_sender.hpp"

#include <utility>

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
  std::uint64_t number = 0;
  {
    const std::lock_guard lock(mutex_);
    queue_.push_back(Job{std::move(own_block_in), &gather});
    number = ++submitted_;
  }
  work_.notify_all();
  return number;
}

bool GatherSender::done(std::uint64_t number) {
  const std::lock_guard lock(mutex_);
  return completed_ >= number;
}

void GatherSender::wait(std::uint64_t number) {
  std::unique_lock lock(mutex_);
  finished_.wait(lock, [&] { return completed_ >= number; });
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
    }
    finished_.notify_all();
  }
}

}  // namespace strata::runtime::detail
