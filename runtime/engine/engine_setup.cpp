// EngineState's construction and teardown, and the narrow API checkpoints and the facade use.
#include <stdexcept>

#include <fmt/format.h>

#include "base/assert.hpp"
#include "base/debug_knobs.hpp"
#include "cpu_adam/cast.hpp"
#include "runtime/engine/engine_state.hpp"

namespace strata::runtime::detail {
namespace {

// Whole-suite knob (base/debug_knobs.hpp): STRATA_FORCE_NVME=1 homes every state kind on NVMe,
// so any test or run can be repeated through the NVMe store.
Config with_debug_knobs(Config config) {
  if (force_nvme_knob()) {
    config.zero.stage = 3;
    config.zero.params = config.zero.grads = config.zero.optimizer = Tier::kNvme;
    config.zero.optimizer_host_fraction = config.zero.optimizer_device_fraction = 0;
    config.zero.params_host_fraction = config.zero.grads_host_fraction = 0;
    if (config.tiers.nvme.paths.empty()) config.tiers.nvme.paths = {test_tmpdir_knob().string()};
  }
  return config;
}

}  // namespace

bool uses_fp16(const Config& config) {
  return config.precision.params == DType::kFp16 || config.precision.grads == DType::kFp16;
}

std::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::kParam:
      return "param16";
    case Kind::kGrad:
      return "grad";
    case Kind::kMaster:
      return "master";
    case Kind::kExpAvg:
      return "exp_avg";
    case Kind::kExpAvgSq:
      return "exp_avg_sq";
    case Kind::kCompensation:
      return "compensation";
  }
  return "?";
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

EngineState::EngineState(const Config& config, tiers::Device& device, comm::Communicator& comm,
                         const EngineOptions& options)
    : config_(with_debug_knobs(config)), options_(options), device_(&device), comm_(&comm) {
  // The data path (runtime/engine/device_lanes.cpp): the CPU addresses device memory only when it is
  // host memory and the staged path was not asked for.
  device_addressable_ = device_->kind() == tiers::DeviceKind::kHost &&
                        options_.device_access == EngineOptions::DeviceAccess::kAuto;
  const bool comm_takes_device = comm_->buffer_memory() == comm::BufferMemory::kDevice;
  if (comm_takes_device && device_->kind() != tiers::DeviceKind::kCuda) {
    throw std::invalid_argument(fmt::format(
        "the {} communicator takes CUDA device memory, but the Engine's device is '{}': use "
        "LocalComm/MpiComm with the host device, or a CUDA device",
        comm_->backend_name(), device_->name()));
  }
  comm_on_device_ = comm_takes_device || device_addressable_;
  // NcclComm reduces the device's fp32 gradient as it is (a 16-bit cast there needs a device
  // buffer the plan does not have); "auto" falls back to fp32, an explicit 16-bit dtype is refused.
  reduce_dtype_ = gradient_reduce_dtype(config.precision, options_.grad_accumulation);
  if (comm_takes_device && reduce_dtype_ != DType::kFp32) {
    if (config.precision.reduce_dtype) {
      throw std::invalid_argument(fmt::format(
          "[precision] reduce_dtype = \"{}\" needs LocalComm or MpiComm; the {} communicator "
          "reduce-scatters fp32 gradients: set reduce_dtype = \"auto\" or \"fp32\"",
          to_string(reduce_dtype_), comm_->backend_name()));
    }
    reduce_dtype_ = DType::kFp32;
  }
  if (!device_addressable_) lanes_ = std::make_unique<DeviceLanes>(*device_);
  if (options_.grad_accumulation == 0) {
    throw std::invalid_argument("grad_accumulation must be >= 1");
  }
  rank_ = static_cast<std::uint32_t>(comm_->rank());
  ranks_ = static_cast<std::uint32_t>(comm_->size());
  plan_.kinds = place_kinds(config_, options_.grad_accumulation);
  progress_.loss_scale = uses_fp16(config_) ? config_.precision.loss_scale : 1.0;
  const int threads = config_.optimizer.threads == 0 ? tbb::task_arena::automatic
                                                     : static_cast<int>(config_.optimizer.threads);
  arena_ = std::make_unique<tbb::task_arena>(threads);
}

EngineState::~EngineState() {
  // The last step's deferred updates run and it commits: a step() that returned is not lost.
  try {
    complete_deferred();
  } catch (const std::exception& error) {
    fmt::print(stderr, "strata: the last step could not be completed: {}\n", error.what());
  }
  discard_grad_moves();  // a backward without its step: the copies end before their slots go
  worker_.reset();  // finishes any speculative update before what it uses goes
  discard_pre_reads();
  drop_pre_reads(deferred_pre_reads_);  // handed to deferred updates that never ran (none, usually)
  // Gathered units and reads in flight go before the store and the I/O engine.
  residency_.reset();
  for (UnitState& unit : units_) {
    for (tiers::StoreRead& read : unit.gathered.reads) {
      try {
        read.wait();
      } catch (...) {  // a failed prefetch nobody used
      }
    }
    // A gather queued and never waited for: its copy and cast read the buffers.
    if (unit.gathered.state() == GatherState::kQueued) unit.gathered.ready->wait();
  }
  // Gathers started ahead and never used complete before their buffers go: every rank sent its
  // block when it started them, or its sender does once the reads (all in now) are, so this
  // needs no Engine call of the peers (whose Engine may end at another moment, e.g. when Python
  // collects it).
  ahead_.stop_sender();  // runs what was submitted
  for (UnitState& unit : units_) {
    if (!unit.gathered.pending) continue;
    try {
      unit.gathered.pending->wait();
    } catch (...) {  // withdrawn (or the job ended) by the communicator
    }
    unit.gathered.pending.reset();
  }
  for (auto& writes : grad_buffer_writes_) {
    for (io::Ticket& ticket : writes) ticket.wait();
  }
  // Units hold pinned and device buffers: they go before the pools that own the memory.
  units_.clear();
}

UnitId EngineState::add_unit(UnitSpec spec) {
  if (finalized_) throw std::logic_error("add_unit after finalize");
  for (const UnitState& unit : units_) {
    if (unit.spec.name == spec.name) {
      throw std::invalid_argument(fmt::format("two units are named '{}'", spec.name));
    }
  }
  if (spec.tensors.empty()) {
    throw std::invalid_argument(fmt::format("unit '{}' has no tensors", spec.name));
  }
  UnitState unit;
  unit.spec = std::move(spec);
  units_.push_back(std::move(unit));
  return static_cast<UnitId>(units_.size() - 1);
}

const UnitState& EngineState::unit(UnitId id) const {
  if (id >= units_.size()) {
    throw std::out_of_range(
        fmt::format("unit id {} is unknown (the Engine has {} units)", id, units_.size()));
  }
  return units_[id];
}

void EngineState::set_master(UnitId id, std::span<const float> full_values) {
  STRATA_ASSERT(finalized_, "set_master before finalize");
  const UnitLayout& layout = unit(id).layout;
  if (full_values.size() != layout.numel) {
    throw std::invalid_argument(fmt::format("set_master('{}'): {} values, the unit has {}",
                                            units_[id].spec.name, full_values.size(), layout.numel));
  }
  residency_->invalidate();
  // This rank's shard of the values; the moments restart from zero.
  const std::vector<float> shard = layout.shard_of(full_values, rank_);
  const std::vector<float> zeros(layout.shard_numel, 0.0f);
  write_shard(id, Kind::kMaster, shard);
  write_shard(id, Kind::kParam, shard);
  write_shard(id, Kind::kExpAvg, zeros);
  write_shard(id, Kind::kExpAvgSq, zeros);
}

void EngineState::set_unit_hyperparams(UnitId id, const UnitHyperparams& hyper) {
  const UnitState& target = unit(id);  // throws for an unknown id
  validate_unit_hyperparams(hyper, config_.optimizer, target.spec.name);
  units_[id].hyper = hyper;
}

void EngineState::set_optimizer_compute(EngineOptions::OptimizerCompute compute) {
  options_.optimizer_compute = compute;
}

std::uint64_t EngineState::device_high_water_bytes() const {
  return device_->high_water_bytes();
}

std::uint64_t EngineState::host_high_water_bytes() const {
  // The NVMe read cache's copies are the store's, outside the pool, within the plan's spare room.
  return (host_pool_ ? host_pool_->high_water_bytes() : 0) +
         (store_ ? store_->read_cache_bytes_used() : 0);
}

std::string_view EngineState::host_allocator_name() const {
  return host_pool_ ? host_pool_->allocator_name() : std::string_view();
}

void EngineState::drain_gradient_writes() {
  for (auto& writes : grad_buffer_writes_) {
    for (io::Ticket& ticket : writes) ticket.get();
    writes.clear();
  }
}

void EngineState::begin_replace() {
  cancel_speculation();
  drain_gradient_writes();
  residency_->invalidate();
  norm_.reset();
  if (norm_device_sum_) lanes_->compute.fill_bytes(norm_device_sum_.span(), 0);
  for (UnitState& unit : units_) unit.grad_calls = 0;
}

void EngineState::finish_replace(const TrainingProgress& progress) {
  progress_ = progress;
  if (store_) store_->commit(progress_.step);
  residency_->invalidate();
}

}  // namespace strata::runtime::detail
