// The host buffers that checkpoint save / load and safetensors export / import stream through,
// outside the host budget. Each operation holds one sub-group's worth (a few of them at most, see
// docs/reliability.md), never a unit or the model: StreamStaging counts the bytes live and keeps
// their high-water mark (Engine::stream_staging_high_water_bytes), so tests can hold the bound.
// Threading: the Engine's thread only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

namespace strata::runtime::detail {

class StagingMeter {
 public:
  void add(std::uint64_t bytes) {
    live_bytes_ += bytes;
    high_water_bytes_ = std::max(high_water_bytes_, live_bytes_);
  }
  void remove(std::uint64_t bytes) { live_bytes_ -= bytes; }
  std::uint64_t high_water_bytes() const { return high_water_bytes_; }

 private:
  std::uint64_t live_bytes_ = 0;
  std::uint64_t high_water_bytes_ = 0;
};

// `count` fp32 values of staging, zero on creation, counted in the meter while alive. Move-only.
class StreamStaging {
 public:
  StreamStaging(StagingMeter& meter, std::uint64_t count) : meter_(&meter), values_(count) {
    meter_->add(count * sizeof(float));
  }
  StreamStaging(StreamStaging&& other) noexcept
      : meter_(std::exchange(other.meter_, nullptr)), values_(std::move(other.values_)) {}
  StreamStaging& operator=(StreamStaging&&) = delete;
  StreamStaging(const StreamStaging&) = delete;
  StreamStaging& operator=(const StreamStaging&) = delete;
  ~StreamStaging() {
    if (meter_ != nullptr) meter_->remove(values_.size() * sizeof(float));
  }

  // The first `count` values (count <= the staging's size).
  std::span<float> first(std::uint64_t count) { return std::span<float>(values_).first(count); }
  std::span<std::byte> bytes() { return std::as_writable_bytes(std::span<float>(values_)); }
  std::uint64_t size() const { return values_.size(); }

 private:
  StagingMeter* meter_;
  std::vector<float> values_;
};

}  // namespace strata::runtime::detail
