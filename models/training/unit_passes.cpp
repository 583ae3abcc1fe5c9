#include "models/training/unit_passes.hpp"

#include "base/units.hpp"

namespace strata::examples {

UnitGradBuffer::UnitGradBuffer(tiers::Device& device, std::size_t largest_numel,
                               std::size_t slots)
    : largest_numel_(largest_numel), slots_(slots) {
  STRATA_ASSERT(slots >= 1, "a gradient buffer of no slots");
  // Each slot starts on the device's allocation granularity (a multiple of 64 floats).
  const std::size_t stride = round_up(largest_numel, tiers::kDeviceAllocationGranularity / 4);
  const std::size_t total = stride * (slots - 1) + largest_numel;
  if (device.kind() == tiers::DeviceKind::kCuda) {
    device_ = device.allocate(total * sizeof(float));
    buffer_ = std::span<float>(device_.span().as<float>(), total);
    stream_.emplace(device.create_stream());
  } else {
    host_.resize(total);
    buffer_ = host_;
  }
  stride_ = stride;
}

std::span<float> UnitGradBuffer::first(std::size_t numel, std::size_t slot) const {
  STRATA_ASSERT(numel <= largest_numel_ && slot < slots_, "a gradient past the buffer's slots");
  return buffer_.subspan(slot * stride_, numel);
}

void UnitGradBuffer::scale(std::span<float> grads, float scale) {
  if (stream_) {
    stream_->scale({reinterpret_cast<std::byte*>(grads.data()), grads.size_bytes()}, scale);
    stream_->synchronize();
    return;
  }
  for (float& g : grads) g *= scale;
}

namespace {

std::vector<std::span<const float>> tensor_views(const runtime::GatheredUnit& unit) {
  std::vector<std::span<const float>> views;
  for (std::size_t i = 0; i < unit.tensor_count(); ++i) views.push_back(unit.tensor(i));
  return views;
}

// Empty unless the parameters are bf16.
std::vector<std::span<const std::uint16_t>> bf16_views(const runtime::GatheredUnit& unit) {
  std::vector<std::span<const std::uint16_t>> views;
  if (unit.tensor_count() == 0 || unit.tensor_bf16(0).empty()) return views;
  for (std::size_t i = 0; i < unit.tensor_count(); ++i) views.push_back(unit.tensor_bf16(i));
  return views;
}

}  // namespace

namespace detail {

GatheredPair gather_unit(runtime::Engine& engine, std::span<const runtime::UnitId> units,
                         std::size_t u, bool reads_embedding, double* wait_s) {
  const auto wait_start = Clock::now();
  GatheredPair gathered{engine.gather(units[u]), std::nullopt, {}, {}, {}, {}};
  if (reads_embedding) gathered.embedding.emplace(engine.gather(units[0]));
  if (wait_s != nullptr) *wait_s += seconds_between(wait_start, Clock::now());
  gathered.views = tensor_views(gathered.unit);
  gathered.views_bf16 = bf16_views(gathered.unit);
  if (gathered.embedding) {
    gathered.shared = tensor_views(*gathered.embedding);
    gathered.shared_bf16 = bf16_views(*gathered.embedding);
  }
  return gathered;
}

void finish_step(runtime::Engine& engine, runtime::comm::Communicator& comm,
                 runtime::Tracer* tracer, StepReport& report) {
  // Each rank's loss covers its part of the global batch: the line printed is the mean over ranks.
  if (comm.size() > 1) {
    report.loss =
        comm.all_reduce_f32(static_cast<float>(report.loss), runtime::comm::ReduceOp::kAvg);
  }
  {
    runtime::Tracer::Scope scope(tracer, runtime::TraceTrack::kOptimizer, "step");
    report.optimizer = engine.step();
  }
  report.step = report.optimizer.step;
}

}  // namespace detail
}  // namespace strata::examples
