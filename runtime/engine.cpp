#include "runtime/engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "base/assert.hpp"
#include "base/units.hpp"
#include "cpu_adam/cast.hpp"
#include "io/make_engine.hpp"
#include "runtime/byte_size.hpp"
#include "runtime/checkpoint.hpp"
#include "runtime/dtype_conversion.hpp"
#include "runtime/engine_state.hpp"
#include "runtime/param_init.hpp"
#include "runtime/preflight.hpp"

namespace strata::runtime {
namespace detail {

std::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::kParam16:
      return "param16";
    case Kind::kGrad:
      return "grad";
    case Kind::kMaster:
      return "master";
    case Kind::kExpAvg:
      return "exp_avg";
    case Kind::kExpAvgSq:
      return "exp_avg_sq";
  }
  return "?";
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

namespace {

Tier home_tier(const Config& config, Kind kind) {
  switch (kind) {
    case Kind::kParam16:
      return config.zero.params;
    case Kind::kGrad:
      return config.zero.grads;
    default:
      return config.zero.optimizer;
  }
}

bool kind_needed(OptimizerType type, Kind kind) {
  if (kind == Kind::kExpAvg) return type != OptimizerType::kAdagrad;
  if (kind == Kind::kExpAvgSq) return type != OptimizerType::kLion;
  return true;
}

constexpr std::array<Kind, kKindCount> kAllKinds = {Kind::kParam16, Kind::kGrad, Kind::kMaster,
                                                    Kind::kExpAvg, Kind::kExpAvgSq};

}  // namespace

EngineState::EngineState(const Config& config_in, tiers::Device& device_in,
                         comm::Communicator& comm_in, const EngineOptions& options_in)
    : config(config_in), options(options_in), device(&device_in), comm(&comm_in) {
  // The data path (runtime/engine_device.cpp): the CPU addresses device memory only when it is
  // host memory and the staged path was not asked for.
  device_addressable = device->kind() == tiers::DeviceKind::kHost &&
                       options.device_access == EngineOptions::DeviceAccess::kAuto;
  const bool comm_takes_device = comm->buffer_memory() == comm::BufferMemory::kDevice;
  if (comm_takes_device && device->kind() != tiers::DeviceKind::kCuda) {
    throw std::invalid_argument(fmt::format(
        "the {} communicator takes CUDA device memory, but the Engine's device is '{}': use "
        "LocalComm/MpiComm with the host device, or a CUDA device",
        comm->backend_name(), device->name()));
  }
  comm_on_device = comm_takes_device || device_addressable;
  if (!device_addressable) lanes = std::make_unique<DeviceLanes>(*device);
  if (options.grad_accumulation == 0) throw std::invalid_argument("grad_accumulation must be >= 1");
  rank = static_cast<std::uint32_t>(comm->rank());
  ranks = static_cast<std::uint32_t>(comm->size());
  // Whole-suite knob (docs/design.md): STRATA_FORCE_NVME=1 homes every state kind on NVMe, so any
  // test or run can be repeated through the NVMe store.
  if (const char* force = std::getenv("STRATA_FORCE_NVME"); force != nullptr && force[0] == '1') {
    config.zero.stage = 3;
    config.zero.params = config.zero.grads = config.zero.optimizer = Tier::kNvme;
    if (config.tiers.nvme.paths.empty()) {
      const char* tmp = std::getenv("STRATA_TEST_TMPDIR");
      config.tiers.nvme.paths = {std::string(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp")};
    }
  }
  param_dtype = to_cpu_adam_dtype(config.precision.params);
  // Accumulating over micro-batches keeps the gradient shard in fp32 (no rounding per addition).
  grad_dtype = options.grad_accumulation > 1 ? cpu_adam::Dtype::kFp32
                                             : to_cpu_adam_dtype(config.precision.grads);
  const bool fp16 =
      config.precision.params == DType::kFp16 || config.precision.grads == DType::kFp16;
  loss_scale = fp16 ? config.precision.loss_scale : 1.0;
  const int threads = config.optimizer.threads == 0 ? tbb::task_arena::automatic
                                                    : static_cast<int>(config.optimizer.threads);
  arena = std::make_unique<tbb::task_arena>(threads);
}

EngineState::~EngineState() {
  // Gathered units and reads in flight go before the store and the I/O engine.
  residency.reset();
  for (UnitState& unit : units) {
    for (tiers::StoreRead& read : unit.reads) {
      try {
        read.wait();
      } catch (...) {  // a failed prefetch nobody used
      }
    }
  }
  for (auto& writes : grad_buffer_writes) {
    for (io::Ticket& ticket : writes) ticket.wait();
  }
  // Units hold pinned and device buffers: they go before the pools that own the memory.
  units.clear();
}

void EngineState::wait_timed(tiers::StoreRead& read) {
  const auto start = std::chrono::steady_clock::now();
  if (!read.poll()) {
    Tracer::Scope scope(options.tracer, TraceTrack::kIo, "NVMe read wait");
    read.wait();
  }
  read.wait();  // verifies the checksum (once)
  io_wait_s += seconds_since(start);
}

void EngineState::wait_timed(const io::Ticket& ticket) {
  const auto start = std::chrono::steady_clock::now();
  if (!ticket.poll()) {
    Tracer::Scope scope(options.tracer, TraceTrack::kIo, "NVMe write wait");
    ticket.wait();
  }
  ticket.get();
  io_wait_s += seconds_since(start);
}

double EngineState::loss_scale_for_step() const {
  return loss_scale;
}

void EngineState::finalize() {
  const ZeroConfig& zero = config.zero;
  // Stage < 3 keeps every rank's parameters whole: one "rank" for the parameter layout. The
  // optimizer state and gradients are sharded at every stage >= 1 / >= 2; strata keeps one layout
  // per unit, sharded over all ranks, and replicates by gathering (stages 0-2 gather once).
  std::uint64_t device_state = 0;
  std::uint64_t host_state = 0;
  std::uint64_t largest_padded = 0;
  std::uint64_t largest_shard = 0;
  std::uint64_t largest_group = 0;
  std::vector<tiers::ExtentSpec> extents;
  // A kind's element type: parameters and gradients as configured, optimizer state in fp32.
  const auto dtype_of = [&](Kind kind) {
    return kind == Kind::kParam16 ? param_dtype
           : kind == Kind::kGrad  ? grad_dtype
                                  : cpu_adam::Dtype::kFp32;
  };
  for (UnitState& unit : units) {
    unit.layout = make_unit_layout(unit.spec, ranks);
    unit.groups = make_sub_groups(unit.layout.shard_numel, zero.sub_group_size);
    largest_padded = std::max(largest_padded, unit.layout.padded_numel);
    largest_shard = std::max(largest_shard, unit.layout.shard_numel);
    for (const SubGroup& group : unit.groups) largest_group = std::max(largest_group, group.numel);
    for (Kind kind : kAllKinds) {
      if (!kind_needed(config.optimizer.type, kind)) continue;
      ShardHome home;
      home.tier = home_tier(config, kind);
      home.dtype = dtype_of(kind);
      home.numel = unit.layout.shard_numel;
      const std::uint64_t bytes = home.numel * home.element_bytes();
      if (home.tier == Tier::kDevice) device_state += bytes;
      if (home.tier == Tier::kHost) host_state += round_up(bytes, kDirectIoAlignment);
      if (home.tier == Tier::kNvme) {
        for (std::size_t g = 0; g < unit.groups.size(); ++g) {
          home.extents.push_back(static_cast<tiers::ExtentId>(extents.size()));
          extents.push_back({fmt::format("{}/{}/{}", unit.spec.name, kind_name(kind), g),
                             unit.groups[g].numel * home.element_bytes()});
        }
      }
      unit.homes[static_cast<std::size_t>(kind)] = std::move(home);
    }
  }

  // Working buffers: gradient scratch and the all-gather send copy on the device; NVMe staging on
  // the host.
  const std::uint64_t scratch_bytes =
      largest_padded * 4 + largest_shard * 4 + largest_shard * cpu_adam::dtype_bytes(param_dtype);
  pipeline_buffer_bytes = 0;
  for (Kind kind : {Kind::kMaster, Kind::kExpAvg, Kind::kExpAvgSq, Kind::kGrad, Kind::kParam16}) {
    const bool on_nvme =
        kind_needed(config.optimizer.type, kind) && home_tier(config, kind) == Tier::kNvme;
    if (!on_nvme) continue;
    const std::uint64_t element_bytes = cpu_adam::dtype_bytes(dtype_of(kind));
    pipeline_offsets[static_cast<std::size_t>(kind)] = pipeline_buffer_bytes;
    pipeline_buffer_bytes += round_up(largest_group * element_bytes, kDirectIoAlignment);
  }
  const bool any_nvme = !extents.empty();
  const std::uint64_t pipeline_bytes = any_nvme ? zero.buffer_count * pipeline_buffer_bytes : 0;
  const std::uint64_t grad_staging_bytes =
      zero.grads == Tier::kNvme
          ? 2 * round_up(largest_shard * cpu_adam::dtype_bytes(grad_dtype), kDirectIoAlignment)
          : 0;
  // The staged data path (runtime/engine_device.cpp): pinned memory between the device and the
  // CPU: a sub-group of each device-homed kind, a gradient shard in fp32, a padded unit in fp32
  // when collectives run on the host, and the NVMe parameter reads of the units being loaded.
  std::uint64_t device_staging_bytes = 0;
  std::uint64_t staged_path_bytes = 0;
  if (!device_addressable) {
    for (Kind kind : kAllKinds) {
      if (!kind_needed(config.optimizer.type, kind) || home_tier(config, kind) != Tier::kDevice) {
        continue;
      }
      const std::uint64_t element_bytes = cpu_adam::dtype_bytes(dtype_of(kind));
      device_staging_offsets[static_cast<std::size_t>(kind)] = device_staging_bytes;
      device_staging_bytes += round_up(largest_group * element_bytes, kDirectIoAlignment);
    }
    device_staging_bytes *= 2;  // two slots: the optimizer stages one while it updates the other
    staged_path_bytes = device_staging_bytes + round_up(largest_shard * 4, kDirectIoAlignment);
    if (ranks > 1 && !comm_on_device) {
      staged_path_bytes += round_up(largest_padded * 4, kDirectIoAlignment);
    }
    if (zero.params == Tier::kNvme) {
      // At most the prefetched units and the one being acquired are loading at once.
      staged_path_bytes +=
          (zero.prefetch_depth + 2) *
          round_up(largest_shard * cpu_adam::dtype_bytes(param_dtype), kDirectIoAlignment);
    }
  }

  // The budgets, checked before anything is allocated.
  const std::uint64_t unit_bytes_max =
      largest_padded *
      (4 + (param_dtype == cpu_adam::Dtype::kFp32 ? 0 : cpu_adam::dtype_bytes(param_dtype)));
  const std::uint64_t device_need = device_state + scratch_bytes + unit_bytes_max;
  if (device_need > device->budget_bytes()) {
    throw std::runtime_error(fmt::format(
        "[tiers.device] budget {} is too small for this model: device-homed state {} + scratch {} "
        "+ one gathered unit {} = {} (short by {}); raise the budget or home state on host/nvme",
        format_binary_bytes(device->budget_bytes()), format_binary_bytes(device_state),
        format_binary_bytes(scratch_bytes), format_binary_bytes(unit_bytes_max),
        format_binary_bytes(device_need),
        format_binary_bytes(device_need - device->budget_bytes())));
  }
  const std::uint64_t host_need =
      host_state + pipeline_bytes + grad_staging_bytes + staged_path_bytes;
  if (host_need > config.tiers.host.budget_bytes) {
    throw std::runtime_error(fmt::format(
        "[tiers.host] budget {} is too small: host-homed state {} + NVMe staging {} + device "
        "staging {} = {} (short by {}); raise the budget, lower [zero] sub_group_size or "
        "buffer_count, or home state on nvme",
        format_binary_bytes(config.tiers.host.budget_bytes), format_binary_bytes(host_state),
        format_binary_bytes(pipeline_bytes + grad_staging_bytes),
        format_binary_bytes(staged_path_bytes), format_binary_bytes(host_need),
        format_binary_bytes(host_need - config.tiers.host.budget_bytes)));
  }

  std::uint64_t nvme_need = 0;
  for (const tiers::ExtentSpec& extent : extents) {
    nvme_need += 2 * round_up(extent.length_bytes, kDirectIoAlignment);  // A/B slots
  }
  if (nvme_need > config.tiers.nvme.budget_bytes) {
    throw std::runtime_error(fmt::format(
        "[tiers.nvme] budget {} is too small: the state homed on NVMe needs {} (two slots of every "
        "extent; short by {}); raise the budget or home less state on nvme",
        format_binary_bytes(config.tiers.nvme.budget_bytes), format_binary_bytes(nvme_need),
        format_binary_bytes(nvme_need - config.tiers.nvme.budget_bytes)));
  }
  // NVMe paths usable and large enough, also before anything is allocated.
  if (!extents.empty()) check_nvme_paths(config.tiers.nvme, extents, rank);

  // Allocate.
  host_pool = std::make_unique<tiers::PinnedPool>(device->pinned_allocator(),
                                                  config.tiers.host.budget_bytes);
  grad_full_scratch = device->allocate(largest_padded * 4);
  grad_shard_scratch = device->allocate(largest_shard * 4);
  gather_send_scratch = device->allocate(largest_shard * cpu_adam::dtype_bytes(param_dtype));
  for (UnitState& unit : units) {
    for (auto& slot : unit.homes) {
      if (!slot) continue;
      ShardHome& home = *slot;
      const std::uint64_t bytes = home.numel * home.element_bytes();
      if (home.tier == Tier::kDevice) {
        home.device = device->allocate(bytes);
        if (device_addressable) home.memory = home.device.data();
      } else if (home.tier == Tier::kHost) {
        home.host = host_pool->allocate(bytes);
        home.memory = home.host.data();
      }
    }
  }
  for (std::uint32_t i = 0; any_nvme && i < zero.buffer_count; ++i) {
    pipeline_buffers.push_back(host_pool->allocate(pipeline_buffer_bytes));
  }
  if (grad_staging_bytes > 0) {
    for (auto& buffer : grad_buffers) buffer = host_pool->allocate(grad_staging_bytes / 2);
  }
  if (!device_addressable) {
    device_staging_slot_bytes = device_staging_bytes / 2;
    if (device_staging_bytes > 0) device_staging = host_pool->allocate(device_staging_bytes);
    shard_staging = host_pool->allocate(round_up(largest_shard * 4, kDirectIoAlignment));
    if (ranks > 1 && !comm_on_device) {
      full_staging = host_pool->allocate(round_up(largest_padded * 4, kDirectIoAlignment));
    }
    if (zero.params == Tier::kNvme) {
      param_read_slab = host_pool->allocate_slab(
          zero.prefetch_depth + 2,
          round_up(largest_shard * cpu_adam::dtype_bytes(param_dtype), kDirectIoAlignment));
    }
  }

  bool resumed = false;
  if (any_nvme) {
    const NvmeTierConfig& nvme = config.tiers.nvme;
    io::EngineOptions io_options;
    io_options.kind = nvme.engine == IoEngineKind::kIoUring ? io::EngineKind::kIoUring
                      : nvme.engine == IoEngineKind::kPosix ? io::EngineKind::kPosix
                                                            : io::EngineKind::kAuto;
    io_options.block_size_bytes = nvme.block_size;
    io_options.queue_depth = nvme.queue_depth;
    io_options.rings = nvme.rings;
    io_options.direct = nvme.direct ? io::DirectIo::kOn : io::DirectIo::kOff;
    io_options.faults = options.faults;
    io_engine = io::make_engine(io_options);
    tiers::NvmeStoreOptions store_options;
    for (const std::string& path : nvme.paths) store_options.paths.emplace_back(path);
    store_options.rank = rank;
    store_options.ranks = ranks;
    store_options.durable = nvme.fsync;
    store_options.mode =
        options.resume ? tiers::StoreOpenMode::kResume : tiers::StoreOpenMode::kCreate;
    record_or_check_store_model(*this, options.resume);  // runtime/checkpoint.hpp
    store = std::make_unique<tiers::NvmeStore>(*io_engine, store_options, std::move(extents));
    resumed = store->resumed() && store->committed_step().has_value();
  } else if (options.resume) {
    throw std::invalid_argument(
        "resume asked, but no state is homed on NVMe: there is no store "
        "to resume from");
  }

  if (resumed) {
    step_count = *store->committed_step();
    // Parameters homed in memory are derived from the committed master weights.
    std::vector<std::byte> bytes;
    for (UnitState& unit : units) {
      ShardHome& param = unit.home(Kind::kParam16);
      if (param.tier == Tier::kNvme) continue;
      const std::vector<float> master = read_shard_fp32(unit, Kind::kMaster);
      for (std::size_t g = 0; g < unit.groups.size(); ++g) {
        const SubGroup& sub = unit.groups[g];
        bytes.resize(sub.numel * param.element_bytes());
        cpu_adam::convert(std::span<const float>(master).subspan(sub.begin, sub.numel),
                          cpu_adam::TypedSpan(bytes.data(), sub.numel, param.dtype), *arena);
        write_group_sync(unit, Kind::kParam16, g, bytes);
      }
    }
  } else {
    initialise_fresh();
  }

  // Gathered units on the device, within what the device budget leaves.
  std::vector<std::uint64_t> unit_bytes;
  for (const UnitState& unit : units) {
    unit_bytes.push_back(
        unit.layout.padded_numel *
        (4 + (param_dtype == cpu_adam::Dtype::kFp32 ? 0 : cpu_adam::dtype_bytes(param_dtype))));
  }
  tiers::ResidencyOptions residency_options;
  residency_options.budget_bytes = device->budget_bytes() - device->in_use_bytes();
  residency_options.prefetch_depth = zero.prefetch_depth;
  residency_options.max_inflight_bytes = zero.max_inflight_bytes;
  residency =
      std::make_unique<tiers::ResidencyManager>(*this, residency_options, unit_bytes, "device");
  // Stages 0-2 keep the parameters whole on every rank: each unit is gathered once after a step
  // and stays (2Ψ per step with the gradient reduce-scatter); stage 3 gathers per use (3Ψ), but
  // keeps units under the persistence threshold.
  for (UnitId id = 0; id < units.size(); ++id) {
    if (zero.stage < 3 || units[id].layout.numel < zero.persistence_threshold) {
      residency->set_persistent(id);
    }
  }
  nvme_read_mark = store ? store->bytes_read() : 0;
  nvme_written_mark = store ? store->bytes_written() : 0;
  finalized = true;
}

void EngineState::initialise_fresh() {
  step_count = 0;
  std::vector<float> master;
  std::vector<std::byte> bytes;
  for (UnitState& unit : units) {
    const UnitLayout& layout = unit.layout;
    const std::uint64_t shard_begin = layout.shard_begin(rank);
    for (std::size_t g = 0; g < unit.groups.size(); ++g) {
      const SubGroup& group = unit.groups[g];
      master.assign(group.numel, 0.0f);
      // Elements [first, last) of the flattened unit, cut at tensor boundaries.
      const std::uint64_t first = shard_begin + group.begin;
      const std::uint64_t last = first + group.numel;
      for (std::size_t t = 0; t < layout.tensors.size(); ++t) {
        const TensorPlacement& placement = layout.tensors[t];
        const std::uint64_t begin = std::max(first, placement.offset);
        const std::uint64_t end = std::min(last, placement.offset + placement.numel);
        if (begin >= end) continue;
        init_tensor_range(config.run.seed, unit.spec.name, unit.spec.tensors[t],
                          begin - placement.offset,
                          std::span(master).subspan(begin - first, end - begin));
      }
      const auto write_kind = [&](Kind kind, cpu_adam::ConstTypedSpan values) {
        if (!unit.has(kind)) return;
        ShardHome& home = unit.home(kind);
        bytes.assign(group.numel * home.element_bytes(), std::byte{0});
        cpu_adam::convert(values, cpu_adam::TypedSpan(bytes.data(), group.numel, home.dtype),
                          *arena);
        write_group_sync(unit, kind, g, bytes);
      };
      const std::vector<float> zeros(group.numel, 0.0f);
      write_kind(Kind::kMaster, std::span<const float>(master));
      write_kind(Kind::kParam16, std::span<const float>(master));
      write_kind(Kind::kExpAvg, std::span<const float>(zeros));
      write_kind(Kind::kExpAvgSq, std::span<const float>(zeros));
      write_kind(Kind::kGrad, std::span<const float>(zeros));
    }
  }
  if (store) store->commit(0);
}

void EngineState::write_group_sync(UnitState& unit, Kind kind, std::size_t group,
                                   std::span<const std::byte> data) {
  ShardHome& home = unit.home(kind);
  const SubGroup& sub = unit.groups[group];
  STRATA_ASSERT(data.size() == sub.numel * home.element_bytes(), "group size mismatch");
  if (home.memory != nullptr) {
    std::memcpy(home.at(sub.begin), data.data(), data.size());
    return;
  }
  if (home.staged_on_device()) {  // through its pinned staging (free outside the optimizer step)
    std::byte* staging = device_staging_at(kind);
    std::memcpy(staging, data.data(), data.size());
    copy_to_device(home.device_span(sub.begin, sub.numel), staging);
    return;
  }
  // Outside the optimizer step the first pipeline buffer is free: no allocation beyond the budget
  // the plan checked (it holds a sub-group of every kind homed on NVMe, so one kind fits).
  std::byte* staging = pipeline_buffers.front().data();
  std::memcpy(staging, data.data(), data.size());
  wait_timed(store->write(home.extents[group], std::span<const std::byte>(staging, data.size())));
}

void EngineState::read_group(UnitState& unit, Kind kind, std::size_t group,
                             std::span<std::byte> out) {
  ShardHome& home = unit.home(kind);
  const SubGroup& sub = unit.groups[group];
  STRATA_ASSERT(out.size() == sub.numel * home.element_bytes(), "group size mismatch");
  if (home.memory != nullptr) {
    std::memcpy(out.data(), home.at(sub.begin), out.size());
    return;
  }
  if (home.staged_on_device()) {
    std::byte* staging = device_staging_at(kind);
    copy_to_host(staging, home.device_span(sub.begin, sub.numel));
    std::memcpy(out.data(), staging, out.size());
    return;
  }
  std::byte* staging = pipeline_buffers.front().data();
  tiers::StoreRead read = store->read(home.extents[group], std::span(staging, out.size()));
  wait_timed(read);
  std::memcpy(out.data(), staging, out.size());
}

std::vector<float> EngineState::read_shard_fp32(UnitState& unit, Kind kind) {
  ShardHome& home = unit.home(kind);
  std::vector<float> out(home.numel);
  std::vector<std::byte> bytes;
  for (std::size_t g = 0; g < unit.groups.size(); ++g) {
    const SubGroup& sub = unit.groups[g];
    bytes.resize(sub.numel * home.element_bytes());
    read_group(unit, kind, g, bytes);
    cpu_adam::convert(cpu_adam::ConstTypedSpan(bytes.data(), sub.numel, home.dtype),
                      std::span<float>(out).subspan(sub.begin, sub.numel), *arena);
  }
  return out;
}

// Gathered units -------------------------------------------------------------------------------

void EngineState::start_load(tiers::UnitId id) {
  UnitState& unit = units[id];
  const std::uint64_t padded = unit.layout.padded_numel;
  unit.full32 = device->allocate(padded * 4);
  if (param_dtype != cpu_adam::Dtype::kFp32) {
    unit.full16 = device->allocate(padded * cpu_adam::dtype_bytes(param_dtype));
  }
  ShardHome& param = unit.home(Kind::kParam16);
  if (param.tier != Tier::kNvme) return;
  // Read this rank's shard straight into its place in the gathered buffer when the CPU addresses
  // device memory (the host device's memory is 4 KiB aligned; the shard offset is a multiple of
  // 4 KiB), else into pinned staging that finish_gather copies to the device.
  std::byte* shard = nullptr;
  if (device_addressable) {
    std::byte* gathered =
        param_dtype == cpu_adam::Dtype::kFp32 ? unit.full32.data() : unit.full16.data();
    shard = gathered + unit.layout.shard_begin(rank) * param.element_bytes();
  } else {
    if (std::optional<tiers::PinnedLease> lease = param_read_slab->try_acquire()) {
      unit.param_lease = std::move(*lease);
    } else {
      unit.param_buffer = host_pool->allocate(
          round_up(unit.layout.shard_numel * param.element_bytes(), kDirectIoAlignment));
    }
    shard = unit.param_staging();
  }
  for (std::size_t g = 0; g < unit.groups.size(); ++g) {
    const SubGroup& sub = unit.groups[g];
    unit.reads.push_back(store->read(
        param.extents[g],
        std::span(shard + sub.begin * param.element_bytes(), sub.numel * param.element_bytes())));
  }
}

bool EngineState::load_complete(tiers::UnitId id) {
  for (const tiers::StoreRead& read : units[id].reads) {
    if (!read.poll()) return false;
  }
  return true;
}

void EngineState::wait_load(tiers::UnitId id) {
  UnitState& unit = units[id];
  for (tiers::StoreRead& read : unit.reads) wait_timed(read);
  unit.reads.clear();
  Tracer::Scope scope(options.tracer, TraceTrack::kCopies, "gather " + unit.spec.name);
  finish_gather(unit);
}

void EngineState::write_back(tiers::UnitId) {
  STRATA_ASSERT(false, "gathered parameters are never dirty");
}

void EngineState::evict(tiers::UnitId id) {
  UnitState& unit = units[id];
  for (tiers::StoreRead& read : unit.reads) {
    try {
      read.wait();
    } catch (...) {  // an unused prefetch failed: the next load reads again and reports it
    }
  }
  unit.reads.clear();
  unit.release_param_staging();
  unit.full16.reset();
  unit.full32.reset();
}

}  // namespace detail

using detail::Kind;
using detail::UnitState;

// GatheredUnit ------------------------------------------------------------------------------------

GatheredUnit::GatheredUnit(GatheredUnit&& other) noexcept
    : engine_(std::exchange(other.engine_, nullptr)), unit_(other.unit_), data_(other.data_) {}

GatheredUnit& GatheredUnit::operator=(GatheredUnit&& other) noexcept {
  if (this != &other) {
    if (engine_ != nullptr) engine_->release(unit_);
    engine_ = std::exchange(other.engine_, nullptr);
    unit_ = other.unit_;
    data_ = other.data_;
  }
  return *this;
}

GatheredUnit::~GatheredUnit() {
  if (engine_ != nullptr) engine_->release(unit_);
}

std::span<const float> GatheredUnit::tensor(std::size_t index) const {
  const UnitState& unit = engine_->state_->units[unit_];
  STRATA_ASSERT(index < unit.layout.tensors.size(), "tensor index out of range");
  const auto& placement = unit.layout.tensors[index];
  return {data_ + placement.offset, placement.numel};
}

std::span<const float> GatheredUnit::tensor(std::string_view name) const {
  const UnitState& unit = engine_->state_->units[unit_];
  for (std::size_t i = 0; i < unit.spec.tensors.size(); ++i) {
    if (unit.spec.tensors[i].name == name) return tensor(i);
  }
  throw std::out_of_range(fmt::format("unit '{}' has no tensor '{}'", unit.spec.name, name));
}

std::size_t GatheredUnit::tensor_count() const {
  return engine_->state_->units[unit_].spec.tensors.size();
}

// Engine ------------------------------------------------------------------------------------------

Engine::Engine(const Config& config, tiers::Device& device, comm::Communicator& comm,
               const EngineOptions& options)
    : state_(std::make_unique<detail::EngineState>(config, device, comm, options)) {}

Engine::~Engine() = default;

UnitId Engine::add_unit(UnitSpec spec) {
  if (state_->finalized) throw std::logic_error("add_unit after finalize");
  for (const UnitState& unit : state_->units) {
    if (unit.spec.name == spec.name) {
      throw std::invalid_argument(fmt::format("two units are named '{}'", spec.name));
    }
  }
  if (spec.tensors.empty()) {
    throw std::invalid_argument(fmt::format("unit '{}' has no tensors", spec.name));
  }
  UnitState unit;
  unit.spec = std::move(spec);
  state_->units.push_back(std::move(unit));
  return static_cast<UnitId>(state_->units.size() - 1);
}

void Engine::finalize() {
  if (state_->finalized) throw std::logic_error("finalize called twice");
  if (state_->units.empty()) throw std::logic_error("finalize with no units");
  state_->finalize();
}

GatheredUnit Engine::gather(UnitId unit) {
  STRATA_ASSERT(state_->finalized, "gather before finalize");
  STRATA_ASSERT(unit < state_->units.size(), "unknown unit");
  state_->residency->acquire(unit);
  return GatheredUnit(this, unit,
                      reinterpret_cast<const float*>(state_->units[unit].full32.data()));
}

void Engine::release(UnitId unit) {
  state_->residency->release(unit);
}

void Engine::reduce_grads(UnitId id, std::span<const float> full_grads) {
  detail::EngineState& s = *state_;
  STRATA_ASSERT(s.finalized, "reduce_grads before finalize");
  UnitState& unit = s.units.at(id);
  const UnitLayout& layout = unit.layout;
  if (full_grads.size() != layout.numel) {
    throw std::invalid_argument(
        fmt::format("reduce_grads('{}'): {} gradient values, the unit has {}", unit.spec.name,
                    full_grads.size(), layout.numel));
  }
  if (unit.grad_calls >= s.options.grad_accumulation) {
    throw std::logic_error(
        fmt::format("reduce_grads('{}') called {} times in one step; "
                    "grad_accumulation is {}",
                    unit.spec.name, unit.grad_calls + 1, s.options.grad_accumulation));
  }
  Tracer::Scope scope(s.options.tracer, TraceTrack::kCopies, "reduce_grads " + unit.spec.name);
  s.reduce_grads(unit, full_grads);
}

StepStats Engine::step() {
  detail::EngineState& s = *state_;
  STRATA_ASSERT(s.finalized, "step before finalize");
  StepStats stats;
  s.optimizer_step(stats);
  return stats;
}

void Engine::set_master(UnitId id, std::span<const float> full_values) {
  detail::EngineState& s = *state_;
  STRATA_ASSERT(s.finalized, "set_master before finalize");
  UnitState& unit = s.units.at(id);
  if (full_values.size() != unit.layout.numel) {
    throw std::invalid_argument(fmt::format("set_master('{}'): {} values, the unit has {}",
                                            unit.spec.name, full_values.size(), unit.layout.numel));
  }
  s.residency->invalidate();
  const std::uint64_t shard_begin = unit.layout.shard_begin(s.rank);
  std::vector<float> master;
  std::vector<std::byte> bytes;
  for (std::size_t g = 0; g < unit.groups.size(); ++g) {
    const SubGroup& group = unit.groups[g];
    master.assign(group.numel, 0.0f);
    const std::uint64_t first = shard_begin + group.begin;
    for (std::uint64_t i = 0; i < group.numel && first + i < unit.layout.numel; ++i) {
      master[i] = full_values[first + i];
    }
    const std::vector<float> zeros(group.numel, 0.0f);
    for (Kind kind : {Kind::kMaster, Kind::kParam16, Kind::kExpAvg, Kind::kExpAvgSq}) {
      if (!unit.has(kind)) continue;
      detail::ShardHome& home = unit.home(kind);
      bytes.assign(group.numel * home.element_bytes(), std::byte{0});
      const std::vector<float>& source =
          kind == Kind::kMaster || kind == Kind::kParam16 ? master : zeros;
      cpu_adam::convert(std::span<const float>(source),
                        cpu_adam::TypedSpan(bytes.data(), group.numel, home.dtype), *s.arena);
      s.write_group_sync(unit, kind, g, bytes);
    }
  }
}

void Engine::set_optimizer_compute(EngineOptions::OptimizerCompute compute) {
  state_->options.optimizer_compute = compute;
}

void Engine::set_learning_rate(double lr) {
  OptimizerConfig& optimizer = state_->config.optimizer;
  if (!std::isfinite(lr) || lr < 0) {
    throw std::invalid_argument(
        fmt::format("set_learning_rate: {} is not a finite, non-negative learning rate", lr));
  }
  if (optimizer.schedule != LrScheduleKind::kConstant && lr < optimizer.min_lr) {
    throw std::invalid_argument(fmt::format(
        "set_learning_rate: {} is below [optimizer] min_lr = {} of the {} schedule", lr,
        optimizer.min_lr, to_string(optimizer.schedule)));
  }
  optimizer.lr = lr;
}

std::vector<float> Engine::master_shard(UnitId unit) {
  return state_shard(unit, "master");
}

std::vector<float> Engine::state_shard(UnitId id, std::string_view kind) {
  UnitState& unit = state_->units.at(id);
  for (Kind candidate :
       {Kind::kMaster, Kind::kExpAvg, Kind::kExpAvgSq, Kind::kParam16, Kind::kGrad}) {
    if (detail::kind_name(candidate) != kind) continue;
    if (!unit.has(candidate)) {
      throw std::invalid_argument(fmt::format("this optimizer keeps no '{}'", kind));
    }
    std::vector<float> values = state_->read_shard_fp32(unit, candidate);
    values.resize(unit.layout.shard_real_numel(state_->rank));
    return values;
  }
  throw std::invalid_argument(fmt::format("unknown state kind '{}'", kind));
}

std::vector<float> Engine::gather_master(UnitId id) {
  detail::EngineState& s = *state_;
  UnitState& unit = s.units.at(id);
  std::vector<float> shard = s.read_shard_fp32(unit, Kind::kMaster);
  std::vector<float> full(unit.layout.padded_numel);
  if (s.ranks > 1) {
    s.all_gather_host(comm::ConstBuffer::of(std::span<const float>(shard)),
                      comm::MutableBuffer::of(std::span<float>(full)));
  } else {
    full = shard;
  }
  full.resize(unit.layout.numel);
  return full;
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
  return state_->loss_scale;
}

std::uint64_t Engine::step_count() const {
  return state_->step_count;
}
std::size_t Engine::unit_count() const {
  return state_->units.size();
}
const UnitSpec& Engine::unit_spec(UnitId unit) const {
  return state_->units.at(unit).spec;
}
std::uint64_t Engine::unit_numel(UnitId unit) const {
  return state_->units.at(unit).layout.numel;
}
const Config& Engine::config() const {
  return state_->config;
}
std::uint64_t Engine::device_high_water_bytes() const {
  return state_->device->high_water_bytes();
}
std::uint64_t Engine::host_high_water_bytes() const {
  return state_->host_pool ? state_->host_pool->high_water_bytes() : 0;
}

std::string Engine::placement_summary() const {
  const ZeroConfig& zero = state_->config.zero;
  return fmt::format("ZeRO-{} over {} rank(s): params on {}, grads on {}, optimizer state on {}",
                     zero.stage, state_->ranks, to_string(zero.params), to_string(zero.grads),
                     to_string(zero.optimizer));
}

}  // namespace strata::runtime
