#include "models/training/unit_passes.hpp"

namespace strata::examples {

UnitGradBuffer::UnitGradBuffer(tiers::Device& device, std::size_t largest_numel) {
  if (device.kind() == tiers::DeviceKind::kCuda) {
    device_ = device.allocate(largest_numel * sizeof(float));
    buffer_ = std::span<float>(device_.span().as<float>(), largest_numel);
    stream_.emplace(device.create_stream());
  } else {
    host_.resize(largest_numel);
    buffer_ = host_;
  }
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

}  // namespace

namespace detail {

GatheredPair gather_unit(runtime::Engine& engine, std::span<const runtime::UnitId> units,
                         std::size_t u, bool reads_embedding, double* wait_s) {
  const auto wait_start = Clock::now();
  GatheredPair gathered{engine.gather(units[u]), std::nullopt, {}, {}};
  if (reads_embedding) gathered.embedding.emplace(engine.gather(units[0]));
  if (wait_s != nullptr) *wait_s += seconds_between(wait_start, Clock::now());
  gathered.views = tensor_views(gathered.unit);
  if (gathered.embedding) gathered.shared = tensor_views(*gathered.embedding);
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
