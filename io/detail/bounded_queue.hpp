// BoundedQueue: a fixed-capacity FIFO between submitting threads and an I/O thread. Producers block
// while it is full (back-pressure instead of unbounded memory); memory is allocated once.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "base/assert.hpp"

namespace strata::io::detail {

template <class T>
class BoundedQueue {
 public:
  explicit BoundedQueue(std::size_t capacity) : slots_(capacity) { STRATA_ASSERT(capacity > 0); }

  // Blocks while full. Returns false (and leaves `item` untouched) once the queue is closed.
  bool push(T& item) {
    {
      std::unique_lock lock(mutex_);
      not_full_.wait(lock, [this] { return closed_ || count_ < slots_.size(); });
      if (closed_) {
        return false;
      }
      slots_[(head_ + count_) % slots_.size()] = std::move(item);
      ++count_;
    }
    not_empty_.notify_one();
    return true;
  }

  // Blocks while empty and open. Returns nullopt once closed, even if items remain (see drain()).
  std::optional<T> pop() {
    std::unique_lock lock(mutex_);
    not_empty_.wait(lock, [this] { return closed_ || count_ > 0; });
    if (closed_) {
      return std::nullopt;
    }
    return take(lock);
  }

  // Never blocks.
  std::optional<T> try_pop() {
    std::unique_lock lock(mutex_);
    if (count_ == 0) {
      return std::nullopt;
    }
    return take(lock);
  }

  bool empty() const {
    std::lock_guard lock(mutex_);
    return count_ == 0;
  }

  // Wakes every blocked producer and consumer; later pushes fail.
  void close() {
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
    }
    not_full_.notify_all();
    not_empty_.notify_all();
  }

  // The items still queued, oldest first (after close(), for cancelling them).
  std::vector<T> drain() {
    std::vector<T> items;
    std::lock_guard lock(mutex_);
    while (count_ > 0) {
      items.push_back(std::move(slots_[head_]));
      head_ = (head_ + 1) % slots_.size();
      --count_;
    }
    return items;
  }

 private:
  T take(std::unique_lock<std::mutex>& lock) {
    T item = std::move(slots_[head_]);
    slots_[head_] = T{};
    head_ = (head_ + 1) % slots_.size();
    --count_;
    lock.unlock();
    not_full_.notify_one();
    return item;
  }

  mutable std::mutex mutex_;
  std::condition_variable not_full_;
  std::condition_variable not_empty_;
  std::vector<T> slots_;
  std::size_t head_ = 0;
  std::size_t count_ = 0;
  bool closed_ = false;
};

}  // namespace strata::io::detail
