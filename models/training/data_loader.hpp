// DataLoader: the packed windows split into training and validation, and the seeded order in
// which training micro-batches draw them. A micro-batch is a pure function of (seed, micro-batch
// index, rank): a run resumed at step s draws exactly the batches an uninterrupted run draws from
// step s on, with nothing to save but the step.
//
// Split: the last ceil(windows / 20) windows are validation, the rest training; a stream of a
// single window uses it for both. Order: epoch e visits the training windows in a permutation
// drawn from (seed, e) (Fisher-Yates over splitmix64); global sample k = (index · ranks + rank) ·
// micro_batch + j reads position k mod windows of epoch k / windows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "models/training/token_stream.hpp"

namespace strata::llm {

struct Batch {
  std::vector<std::int32_t> tokens;  // sequences × window_tokens
  std::vector<float> weights;        // sequences × (window_tokens - 1)
  std::size_t sequences = 0;
};

class DataLoader {
 public:
  DataLoader(PackedWindows windows, std::uint32_t micro_batch, std::uint64_t seed,
             std::uint32_t ranks = 1, std::uint32_t rank = 0);

  std::size_t train_windows() const { return train_.size(); }
  std::size_t validation_windows() const { return validation_.size(); }
  std::size_t window_tokens() const { return windows_.window_tokens; }

  // Training micro-batch `index` (step · grad_accumulation + m) of this rank: micro_batch windows.
  void train_batch(std::uint64_t index, Batch& batch) const;
  // The window a global training sample reads (exposed for tests).
  std::size_t train_window_of(std::uint64_t sample) const;
  // Validation batches cover the validation windows in order, micro_batch at a time (the last may
  // hold fewer).
  std::size_t validation_batch_count() const;
  void validation_batch(std::size_t index, Batch& batch) const;

 private:
  void append_window(std::size_t window, Batch& batch) const;

  PackedWindows windows_;
  std::uint32_t micro_batch_;
  std::uint64_t seed_;
  std::uint32_t ranks_;
  std::uint32_t rank_;
  std::vector<std::size_t> train_;
  std::vector<std::size_t> validation_;
  // The permutation of the epoch last asked for (mutable cache; one thread uses a loader).
  mutable std::uint64_t cached_epoch_ = ~std::uint64_t{0};
  mutable std::vector<std::size_t> order_;
};

}  // namespace strata::llm
