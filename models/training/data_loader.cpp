#include "models/training/data_loader.hpp"

#include <numeric>
#include <utility>

#include "base/assert.hpp"

namespace strata::llm {
namespace {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

DataLoader::DataLoader(PackedWindows windows, std::uint32_t micro_batch, std::uint64_t seed,
                       std::uint32_t ranks, std::uint32_t rank)
    : windows_(std::move(windows)),
      micro_batch_(micro_batch),
      seed_(seed),
      ranks_(ranks),
      rank_(rank) {
  STRATA_ASSERT(micro_batch >= 1 && rank < ranks);
  const std::size_t count = windows_.count();
  STRATA_ASSERT(count >= 1, "no windows to draw from");
  const std::size_t held_out = count == 1 ? 0 : (count + 19) / 20;
  for (std::size_t w = 0; w < count - held_out; ++w) train_.push_back(w);
  for (std::size_t w = count - held_out; w < count; ++w) validation_.push_back(w);
  if (validation_.empty()) validation_ = train_;
}

std::size_t DataLoader::train_window_of(std::uint64_t sample) const {
  const std::uint64_t epoch = sample / train_.size();
  if (epoch != cached_epoch_) {
    order_ = train_;
    std::uint64_t state = seed_ * 0x2545f4914f6cdd1dull + epoch;
    for (std::size_t i = order_.size(); i > 1; --i) {
      std::swap(order_[i - 1], order_[splitmix64(state) % i]);
    }
    cached_epoch_ = epoch;
  }
  return order_[sample % train_.size()];
}

void DataLoader::append_window(std::size_t window, Batch& batch) const {
  const auto tokens = windows_.window(window);
  const auto weights = windows_.window_weights(window);
  batch.tokens.insert(batch.tokens.end(), tokens.begin(), tokens.end());
  batch.weights.insert(batch.weights.end(), weights.begin(), weights.end());
  ++batch.sequences;
}

void DataLoader::train_batch(std::uint64_t index, Batch& batch) const {
  batch = Batch{};
  const std::uint64_t first = (index * ranks_ + rank_) * micro_batch_;
  for (std::uint32_t j = 0; j < micro_batch_; ++j) append_window(train_window_of(first + j), batch);
}

std::size_t DataLoader::validation_batch_count() const {
  return (validation_.size() + micro_batch_ - 1) / micro_batch_;
}

void DataLoader::validation_batch(std::size_t index, Batch& batch) const {
  batch = Batch{};
  const std::size_t first = index * micro_batch_;
  for (std::size_t i = first; i < std::min(validation_.size(), first + micro_batch_); ++i) {
    append_window(validation_[i], batch);
  }
}

}  // namespace strata::llm
