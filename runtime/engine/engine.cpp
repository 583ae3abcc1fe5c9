// The Engine facade and GatheredUnit: argument checks and forwarding to EngineState, whose stages
// live one per file (runtime/engine/engine_state.hpp lists them).
#include "runtime/engine/engine.hpp"

#include <stdexcept>

#include <fmt/format.h>

#include "base/assert.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/engine_state.hpp"

namespace strata::runtime {

using detail::Kind;
using detail::UnitState;

namespace {

Kind kind_of(OptimizerState state) {
  switch (state) {
    case OptimizerState::kMaster:
      return Kind::kMaster;
    case OptimizerState::kExpAvg:
      return Kind::kExpAvg;
    case OptimizerState::kExpAvgSq:
      return Kind::kExpAvgSq;
  }
  return Kind::kMaster;
}

}  // namespace

std::string_view to_string(OptimizerState state) {
  return detail::kind_name(kind_of(state));
}

// GatheredUnit ------------------------------------------------------------------------------------

GatheredUnit::GatheredUnit(GatheredUnit&& other) noexcept
    : engine_(std::exchange(other.engine_, nullptr)),
      unit_(other.unit_),
      data_(other.data_),
      bf16_(other.bf16_) {}

GatheredUnit& GatheredUnit::operator=(GatheredUnit&& other) noexcept {
  if (this != &other) {
    if (engine_ != nullptr) engine_->release(unit_);
    engine_ = std::exchange(other.engine_, nullptr);
    unit_ = other.unit_;
    data_ = other.data_;
    bf16_ = other.bf16_;
  }
  return *this;
}

GatheredUnit::~GatheredUnit() {
  if (engine_ != nullptr) engine_->release(unit_);
}

std::span<const float> GatheredUnit::tensor(std::size_t index) const {
  const UnitState& unit = engine_->state_->unit(unit_);
  STRATA_ASSERT(index < unit.layout.tensors.size(), "tensor index out of range");
  const std::uint64_t offset = unit.fp32_views.tensor_offsets[index];
  if (offset == Fp32ViewPacking::kNone) {
    return {};  // not widened (TensorSpec::fp32_view): tensor_bf16 holds it
  }
  return {data_ + offset, unit.layout.tensors[index].numel};
}

std::span<const float> GatheredUnit::tensor(std::string_view name) const {
  const UnitState& unit = engine_->state_->unit(unit_);
  for (std::size_t i = 0; i < unit.spec.tensors.size(); ++i) {
    if (unit.spec.tensors[i].name == name) return tensor(i);
  }
  throw std::out_of_range(fmt::format("unit '{}' has no tensor '{}'", unit.spec.name, name));
}

std::span<const std::uint16_t> GatheredUnit::tensor_bf16(std::size_t index) const {
  if (bf16_ == nullptr) return {};
  const UnitState& unit = engine_->state_->unit(unit_);
  STRATA_ASSERT(index < unit.layout.tensors.size(), "tensor index out of range");
  const auto& placement = unit.layout.tensors[index];
  return {bf16_ + placement.offset, placement.numel};
}

std::size_t GatheredUnit::tensor_count() const {
  return engine_->state_->unit(unit_).spec.tensors.size();
}

// Engine ------------------------------------------------------------------------------------------

Engine::Engine(const Config& config, tiers::Device& device, comm::Communicator& comm,
               const EngineOptions& options)
    : state_(std::make_unique<detail::EngineState>(config, device, comm, options)) {}

Engine::~Engine() = default;

UnitId Engine::add_unit(UnitSpec spec) {
  return state_->add_unit(std::move(spec));
}

void Engine::finalize() {
  state_->finalize();
}

GatheredUnit Engine::gather(UnitId unit) {
  const float* data = state_->gather(unit);
  return GatheredUnit(this, unit, data, state_->gathered_bf16(unit));
}

void Engine::set_compute_fence(tiers::ComputeFence* fence) {
  state_->set_compute_fence(fence);
}

void Engine::release(UnitId unit) {
  state_->release(unit);
}

void Engine::reduce_grads(UnitId unit, std::span<const float> full_grads) {
  state_->reduce_grads(unit, full_grads);
}

StepStats Engine::step() {
  StepStats stats;
  state_->optimizer_step(stats);
  return stats;
}

void Engine::set_optimizer_compute(EngineOptions::OptimizerCompute compute) {
  state_->set_optimizer_compute(compute);
}

void Engine::set_master(UnitId unit, std::span<const float> full_values) {
  state_->set_master(unit, full_values);
}

void Engine::set_learning_rate(double lr) {
  validate_peak_lr(lr, state_->config().optimizer, "set_learning_rate");
  state_->set_learning_rate(lr);
}

void Engine::set_unit_hyperparams(UnitId unit, const UnitHyperparams& hyper) {
  state_->set_unit_hyperparams(unit, hyper);
}

const UnitHyperparams& Engine::unit_hyperparams(UnitId unit) const {
  return state_->unit(unit).hyper;
}

std::vector<float> Engine::master_shard(UnitId unit) {
  return state_shard(unit, OptimizerState::kMaster);
}

std::vector<float> Engine::state_shard(UnitId id, OptimizerState state) {
  const UnitState& unit = state_->unit(id);
  const Kind kind = kind_of(state);
  if (!unit.has(kind)) {
    throw std::invalid_argument(fmt::format("the {} optimizer keeps no '{}'",
                                            to_string(state_->config().optimizer.type),
                                            detail::kind_name(kind)));
  }
  std::vector<float> values = state_->read_shard_fp32(id, kind);
  values.resize(unit.layout.shard_real_numel(state_->rank()));
  return values;
}

std::vector<float> Engine::gather_master(UnitId unit) {
  return state_->gather_master(unit);
}

void Engine::save(const std::filesystem::path& dir) {
  detail::save_checkpoint(*state_, dir);
}
void Engine::load(const std::filesystem::path& dir) {
  detail::load_checkpoint(*state_, dir);
}
void Engine::export_safetensors(const std::filesystem::path& file, DType dtype) {
  detail::export_safetensors(*state_, file, dtype);
}
void Engine::import_safetensors(const std::filesystem::path& file) {
  detail::import_safetensors(*state_, file);
}

double Engine::loss_scale() const {
  return state_->progress().loss_scale;
}
std::uint64_t Engine::step_count() const {
  return state_->progress().step;
}
std::size_t Engine::unit_count() const {
  return state_->units().size();
}
const UnitSpec& Engine::unit_spec(UnitId unit) const {
  return state_->unit(unit).spec;
}
std::uint64_t Engine::unit_numel(UnitId unit) const {
  return state_->unit(unit).layout.numel;
}
const Config& Engine::config() const {
  return state_->config();
}
std::uint64_t Engine::device_high_water_bytes() const {
  return state_->device_high_water_bytes();
}
std::uint64_t Engine::host_high_water_bytes() const {
  return state_->host_high_water_bytes();
}
std::string_view Engine::host_allocator_name() const {
  return state_->host_allocator_name();
}

std::uint64_t Engine::stream_staging_high_water_bytes() const {
  return state_->stream_staging_high_water_bytes();
}

std::string Engine::placement_summary() const {
  const ZeroConfig& zero = state_->config().zero;
  return fmt::format("ZeRO-{} over {} rank(s): params on {}, grads on {}, optimizer state on {}",
                     zero.stage, state_->ranks(), to_string(zero.params), to_string(zero.grads),
                     to_string(zero.optimizer));
}

}  // namespace strata::runtime
