// Gathers started ahead of use whose own shard comes from NVMe (several ranks, the host device):
// the Engine posts the receives at the unit's load, and this thread sends the own block as soon as
// the shard's reads complete (PendingAllGather::send_own), whatever the Engine's thread is doing.
// A peer waiting for that block so depends on this rank's disk, never on this rank's next Engine
// call: ranks whose Engines end at different moments (Python collecting them), or that wait
// for another collective in between, cannot deadlock. Needs the communicator's
// sends_from_any_thread() (MpiComm under MPI_THREAD_MULTIPLE); without it such shards gather
// at use. A shard whose read fails is not sent: this rank reports the read at wait_load, and its
// peers time out naming it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "runtime/comm/communicator.hpp"

namespace strata::runtime::detail {

class GatherSender {
 public:
  GatherSender();
  ~GatherSender();  // sends what was submitted (its reads complete), then stops
  GatherSender(const GatherSender&) = delete;
  GatherSender& operator=(const GatherSender&) = delete;

  // Once `own_block_in()` returns true (it blocks until the own block is in place: the Engine's
  // waits for the shard's reads), `gather.send_own()`; false (a read failed) sends nothing. The
  // gather must outlive the job: wait() for the returned number before destroying it. Jobs run
  // in submission order, one at a time.
  std::uint64_t submit(std::function<bool()> own_block_in, comm::PendingAllGather& gather);
  // Whether job `number` has run (its block sent, or not sent because a read failed).
  bool done(std::uint64_t number);
  void wait(std::uint64_t number);

 private:
  struct Job {
    std::function<bool()> own_block_in;
    comm::PendingAllGather* gather = nullptr;
  };
  void loop();

  std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable finished_;
  std::deque<Job> queue_;
  std::uint64_t submitted_ = 0;
  std::uint64_t completed_ = 0;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace strata::runtime::detail
