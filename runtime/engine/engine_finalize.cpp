// finalize(): plan -> check budgets -> allocate -> open the NVMe store or resume from it ->
// initialise -> build the residency of gathered units. Nothing is allocated before every budget
// has been checked against the plan (runtime/plan/buffer_plan.hpp), and the allocation is the plan.
#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

#include "base/debug_knobs.hpp"
#include "base/units.hpp"
#include "cpu_adam/cast.hpp"
#include "io/make_engine.hpp"
#include "runtime/config/byte_size.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/engine/engine_state.hpp"
#include "runtime/engine/param_init.hpp"
#include "runtime/plan/preflight.hpp"
#include "tiers/store_probe.hpp"

namespace strata::runtime::detail {
namespace {

// A bound on the hand-off queue (pieces are ~64 bytes each): staging this large would be over
// 10 TiB at 1 MiB blocks.
constexpr std::uint64_t kMaxQueuedPieces = std::uint64_t{1} << 24;

io::IoEngineOptions io_options_of(const NvmeTierConfig& nvme, io::FaultInjector* faults) {
  io::IoEngineOptions options;
  options.kind = nvme.engine;
  options.block_size_bytes = nvme.block_size;
  options.queue_depth = nvme.queue_depth;
  options.rings = nvme.rings;
  options.direct = nvme.direct ? io::DirectIo::kOn : io::DirectIo::kOff;
  options.faults = faults;
  return options;
}

// TensorSpec::fp32_view of each of the unit's tensors.
std::vector<bool> fp32_view_flags(const UnitSpec& unit) {
  std::vector<bool> flags;
  flags.reserve(unit.tensors.size());
  for (const TensorSpec& tensor : unit.tensors) flags.push_back(tensor.fp32_view);
  return flags;
}

// The initial master values of elements [first, first + values.size()) of the flattened unit,
// cut at tensor boundaries (padding stays zero).
void initial_values(std::uint64_t seed, const UnitState& unit, std::uint64_t first,
                    std::span<float> values) {
  const std::uint64_t last = first + values.size();
  for (std::size_t t = 0; t < unit.layout.tensors.size(); ++t) {
    const TensorPlacement& placement = unit.layout.tensors[t];
    const std::uint64_t begin = std::max(first, placement.offset);
    const std::uint64_t end = std::min(last, placement.offset + placement.numel);
    if (begin >= end) continue;
    init_tensor_range(seed, unit.spec.name, unit.spec.tensors[t], begin - placement.offset,
                      values.subspan(begin - first, end - begin));
  }
}

}  // namespace

void EngineState::finalize() {
  if (finalized_) throw std::logic_error("finalize called twice");
  if (units_.empty()) throw std::logic_error("finalize with no units");
  std::vector<tiers::ExtentSpec> extents = plan_homes();
  check_budgets(extents);
  allocate();
  if (open_store(std::move(extents))) {
    rebuild_params_from_master();
  } else {
    initialise_fresh();
  }
  build_residency();
  start_speculation();
  finalized_ = true;
}

// Lays every unit out over the ranks, cuts its shard into sub-groups and gives each kind its home
// (tier and element type); the buffer plan sizes everything else. Returns the NVMe extents.
std::vector<tiers::ExtentSpec> EngineState::plan_homes() {
  BufferPlanInputs inputs;
  for (UnitState& unit : units_) {
    unit.layout = make_unit_layout(unit.spec, ranks_);
    inputs.unit_numels.push_back(unit.layout.numel);
    // (counted only with 16-bit parameters, where widens() follows these flags)
    inputs.unit_fp32_view_numels.push_back(
        pack_fp32_views(unit.layout, fp32_view_flags(unit.spec)).numel);
  }
  inputs.ranks = ranks_;
  inputs.grad_accumulation = options_.grad_accumulation;
  inputs.device_addressable = device_addressable_;
  inputs.collectives_on_device = comm_on_device_;
  inputs.gathers_ahead = gathers_ahead_across_ranks();
  plan_ = make_buffer_plan(config_, inputs);

  std::vector<tiers::ExtentSpec> extents;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    UnitState& unit = units_[u];
    std::vector<bool> widened;
    for (const TensorSpec& tensor : unit.spec.tensors) widened.push_back(widens(tensor));
    unit.fp32_views = pack_fp32_views(unit.layout, widened);
    unit.groups = make_sub_groups(unit.layout.shard_numel, config_.zero.sub_group_size);
    unit.params_in_master = plan_.kind(Kind::kParam).in_master;
    for (Kind kind : kAllShardKinds) {
      const KindPlacement& placement = plan_.kind(kind);
      if (!placement.kept) continue;
      ShardHome home;
      home.tier = plan_.tier_of(kind, u);  // [zero] *_host_fraction split a kind by units
      home.dtype = placement.dtype;
      home.quantized = placement.quantized;
      home.numel = unit.layout.shard_numel;
      home.group_offsets.push_back(0);
      for (const SubGroup& sub : unit.groups) {
        home.group_offsets.push_back(home.group_offsets.back() + home.bytes(sub.numel));
      }
      for (std::size_t g = 0; home.tier == Tier::kNvme && g < unit.groups.size(); ++g) {
        home.extents.push_back(static_cast<tiers::ExtentId>(extents.size()));
        extents.push_back({fmt::format("{}/{}/{}", unit.spec.name, kind_name(kind), g),
                           home.bytes(unit.groups[g].numel)});
      }
      unit.homes[static_cast<std::size_t>(kind)] = std::move(home);
    }
  }
  return extents;
}

void EngineState::check_budgets(const std::vector<tiers::ExtentSpec>& extents) const {
  const std::uint64_t device_need = plan_.device_need_bytes();
  if (device_need > device_->budget_bytes()) {
    throw std::runtime_error(fmt::format(
        "[tiers.device] budget {} is too small for this model: device-homed state {} + scratch {} "
        "+ one gathered unit {} = {} (short by {}); raise the budget or home state on host/nvme",
        format_binary_bytes(device_->budget_bytes()), format_binary_bytes(plan_.device_state_bytes),
        format_binary_bytes(plan_.device_scratch_bytes()),
        format_binary_bytes(plan_.gathered_unit_bytes_max), format_binary_bytes(device_need),
        format_binary_bytes(device_need - device_->budget_bytes())));
  }
  const std::uint64_t host_need = plan_.host_need_bytes();
  const std::uint64_t host_budget = config_.tiers.host.budget_bytes;
  if (host_need > host_budget) {
    throw std::runtime_error(fmt::format(
        "[tiers.host] budget {} is too small: host-homed state {} + NVMe staging {} + device "
        "staging {} = {} (short by {}); raise the budget, lower [zero] sub_group_size or "
        "buffer_count, or home state on nvme",
        format_binary_bytes(host_budget), format_binary_bytes(plan_.host_state_bytes),
        format_binary_bytes(plan_.nvme_staging_bytes()),
        format_binary_bytes(plan_.staged_path_bytes()), format_binary_bytes(host_need),
        format_binary_bytes(host_need - host_budget)));
  }
  const std::uint64_t nvme_budget = config_.tiers.nvme.budget_bytes;
  if (plan_.nvme_state_bytes > nvme_budget) {
    throw std::runtime_error(fmt::format(
        "[tiers.nvme] budget {} is too small: the state homed on NVMe needs {} (two slots of every "
        "extent; short by {}); raise the budget or home less state on nvme",
        format_binary_bytes(nvme_budget), format_binary_bytes(plan_.nvme_state_bytes),
        format_binary_bytes(plan_.nvme_state_bytes - nvme_budget)));
  }
  // NVMe paths usable and large enough, also before anything is allocated.
  if (!extents.empty()) check_nvme_paths(config_.tiers.nvme, extents, rank_);
}

// [tiers.host] pinned: the device's page-locked memory (mmap + cudaHostRegister, mmap + mlock), or plain
// pageable mmap. Both are 4 KiB aligned, so every path (O_DIRECT included) works on either; pageable
// memory only makes device copies slower (the driver bounces them) and lets the kernel swap it.
std::shared_ptr<tiers::PinnedAllocator> EngineState::host_allocator() const {
  if (config_.tiers.host.pinned) return device_->pinned_allocator();
  tiers::MmapPinnedAllocatorOptions pageable;
  pageable.mlock = tiers::MlockPolicy::kOff;
  return std::make_shared<tiers::MmapPinnedAllocator>(std::move(pageable));
}

// Exactly the plan: every shard on its home tier, then the working buffers.
void EngineState::allocate() {
  host_pool_ = std::make_unique<tiers::PinnedPool>(host_allocator(),
                                                   config_.tiers.host.budget_bytes);
  grad_full_scratch_ = device_->allocate(plan_.grad_full_scratch_bytes);
  grad_shard_scratch_ = device_->allocate(plan_.grad_shard_scratch_bytes);
  gather_send_scratch_ = device_->allocate(plan_.gather_send_bytes);
  if (plan_.norm_device_bytes > 0) {
    STRATA_ASSERT(lanes_ != nullptr, "the device norm is the staged path's");
    norm_device_sum_ = device_->allocate(sizeof(double));
    norm_device_scratch_ = device_->allocate(std::max<std::uint64_t>(
        1, tiers::sum_of_squares_scratch_bytes(plan_.largest_shard_numel)));
    lanes_->compute.fill_bytes(norm_device_sum_.span(), 0);  // before any sum, in stream order
  }
  for (UnitState& unit : units_) {
    for (auto& slot : unit.homes) {
      if (!slot) continue;
      ShardHome& home = *slot;
      const std::uint64_t bytes = home.total_bytes();
      if (home.tier == Tier::kDevice) {
        home.device = device_->allocate(bytes);
        if (device_addressable_) home.memory = home.device.data();
      } else if (home.tier == Tier::kHost) {
        home.host = host_pool_->allocate(bytes);
        home.memory = home.host.data();
      }
    }
  }
  for (std::uint32_t i = 0; i < plan_.pipeline_buffer_count; ++i) {
    pipeline_buffers_.push_back(host_pool_->allocate(plan_.pipeline_buffer_bytes));
  }
  if (plan_.grad_staging_buffer_bytes > 0) {
    for (auto& buffer : grad_buffers_) buffer = host_pool_->allocate(plan_.grad_staging_buffer_bytes);
  }
  if (plan_.device_staging_slot_bytes > 0) {
    device_staging_ = host_pool_->allocate(2 * plan_.device_staging_slot_bytes);
  }
  if (plan_.shard_staging_bytes > 0) shard_staging_ = host_pool_->allocate(plan_.shard_staging_bytes);
  if (plan_.full_staging_bytes > 0) full_staging_ = host_pool_->allocate(plan_.full_staging_bytes);
  if (plan_.grad_move_slot_bytes > 0) {
    grad_moves_.allocate(*host_pool_, plan_.grad_move_slot_bytes);
  }
  if (plan_.norm_readback_bytes > 0) norm_readback_ = host_pool_->allocate(plan_.norm_readback_bytes);
  if (plan_.param_read_slots > 0) {
    param_read_slab_ = host_pool_->allocate_slab(plan_.param_read_slots, plan_.param_read_slot_bytes);
  }
  if (plan_.gather_slots > 0) {
    ahead_.allocate_slots(*host_pool_, plan_.gather_slots, plan_.gather_slot_bytes);
  }
}

bool EngineState::open_store(std::vector<tiers::ExtentSpec> extents) {
  if (!plan_.any_nvme) {
    if (options_.resume) {
      throw std::invalid_argument(
          "resume asked, but no state is homed on NVMe: there is no store to resume from");
    }
    return false;
  }
  const NvmeTierConfig& nvme = config_.tiers.nvme;
  const bool resume = resume_decided();
  io::IoEngineOptions io_options = io_options_of(nvme, options_.faults);
  lend_staging_to_io(io_options);
  io_engine_ = io::make_io_engine(io_options);
  tiers::NvmeStoreOptions store_options;
  for (const std::string& path : nvme.paths) store_options.paths.emplace_back(path);
  store_options.rank = rank_;
  store_options.ranks = ranks_;
  store_options.durable = nvme.fsync;
  if (config_.tiers.host.nvme_read_cache) store_options.read_cache_bytes = plan_.nvme_read_cache_bytes;
  store_options.mode = resume ? tiers::StoreOpenMode::kResume : tiers::StoreOpenMode::kCreate;
  record_or_check_store_model(*this, resume);  // runtime/checkpoint/checkpoint.hpp
  store_ = std::make_unique<tiers::NvmeStore>(*io_engine_, store_options, std::move(extents));
  if (!store_->resumed() || !store_->committed_step().has_value()) return false;
  progress_.step = *store_->committed_step();
  return true;
}

void EngineState::lend_staging_to_io(io::IoEngineOptions& options) const {
  std::uint64_t groups_per_unit = 1;
  for (const UnitState& unit : units_)
    groups_per_unit = std::max<std::uint64_t>(groups_per_unit, unit.groups.size());
  const std::uint64_t block = options.block_size_bytes;
  // An optimizer buffer has at most one request per kind in flight (its writes drain before its
  // next reads); a gradient buffer or parameter slot one per sub-group of a unit.
  std::uint64_t pieces = 2 * std::uint64_t{options.queue_depth};  // the synchronous paths' share
  pieces += plan_.pipeline_buffer_count *
            io::pieces_for(plan_.pipeline_buffer_bytes, kAllShardKinds.size(), block);
  pieces += grad_buffers_.size() *
            io::pieces_for(plan_.grad_staging_buffer_bytes, groups_per_unit, block);
  pieces +=
      plan_.param_read_slots * io::pieces_for(plan_.param_read_slot_bytes, groups_per_unit, block);
  options.queued_pieces =
      static_cast<std::uint32_t>(std::min<std::uint64_t>(pieces, kMaxQueuedPieces));

  // io_uring takes buffers of at most 1 GiB; with a larger one, none is registered (plain I/O).
  std::vector<std::span<std::byte>> fixed;
  for (const tiers::PinnedBuffer& buffer : pipeline_buffers_) fixed.push_back(buffer.span());
  for (const tiers::PinnedBuffer& buffer : grad_buffers_) {
    if (!buffer.span().empty()) fixed.push_back(buffer.span());
  }
  const bool registrable = std::all_of(fixed.begin(), fixed.end(), [](std::span<std::byte> buffer) {
    return buffer.size() <= kGiB;
  });
  if (registrable) options.fixed_buffers = std::move(fixed);
}

// Resume, start afresh, or refuse: EngineOptions resume / overwrite, else [tiers.nvme]
// on_existing. Decided from the manifests alone, before any file is created or truncated, so a
// refusal leaves the store byte for byte as it was. A store committed only at step 0 holds no
// training (the seed or an import recreates it) and is overwritten without asking.
bool EngineState::resume_decided() const {
  if (options_.resume && options_.overwrite) {
    throw std::invalid_argument("resume and overwrite both asked: choose one");
  }
  if (options_.resume) return true;
  const NvmeTierConfig& nvme = config_.tiers.nvme;
  const std::filesystem::path directory = nvme.paths.front();
  const std::optional<std::uint64_t> step = tiers::committed_step_on_disk(directory, rank_);
  if (options_.overwrite || !step || *step == 0) return false;
  if (nvme.on_existing == OnExistingStore::kOverwrite) return false;
  if (nvme.on_existing == OnExistingStore::kResume) return true;
  throw CommittedStoreExists(
      fmt::format("the NVMe store at {} (rank {}) holds {} committed at step {}: starting afresh "
                  "would overwrite it. Resume it (strata-finetune --resume, or [tiers.nvme] "
                  "on_existing = \"resume\"), or discard it explicitly (--overwrite, or "
                  "on_existing = \"overwrite\")",
                  directory.string(), rank_, describe_stored_model(*this), *step),
      *step);
}

// Resumed: parameters homed in memory are derived from the committed master weights.
void EngineState::rebuild_params_from_master() {
  for (UnitId id = 0; id < units_.size(); ++id) {
    // Parameters in the master's home are rebuilt already, and NVMe-homed ones were committed.
    if (!units_[id].has(Kind::kParam)) continue;
    if (units_[id].home(Kind::kParam).tier == Tier::kNvme) continue;
    write_shard(id, Kind::kParam, read_shard_fp32(id, Kind::kMaster));
  }
}

void EngineState::initialise_fresh() {
  progress_.step = 0;
  std::vector<float> master;
  std::vector<float> zeros;
  for (UnitState& unit : units_) {
    const std::uint64_t shard_begin = unit.layout.shard_begin(rank_);
    for (std::size_t g = 0; g < unit.groups.size(); ++g) {
      const SubGroup& group = unit.groups[g];
      master.assign(group.numel, 0.0f);
      zeros.assign(group.numel, 0.0f);
      initial_values(config_.run.seed, unit, shard_begin + group.begin, master);
      const auto write_kind = [&](Kind kind, const std::vector<float>& values) {
        write_group_fp32(static_cast<UnitId>(&unit - units_.data()), kind, g, values);
      };
      write_kind(Kind::kMaster, master);
      write_kind(Kind::kParam, master);
      write_kind(Kind::kExpAvg, zeros);
      write_kind(Kind::kExpAvgSq, zeros);
      write_kind(Kind::kGrad, zeros);
    }
  }
  if (store_) store_->commit(0);
}

// Gathered units on the device, within what the device budget leaves. Stages 0-2 keep the
// parameters whole on every rank: each unit is gathered once after a step and stays (2Ψ per step
// with the gradient reduce-scatter); stage 3 gathers per use (3Ψ), but keeps units under the
// persistence threshold.
void EngineState::build_residency() {
  const ZeroConfig& zero = config_.zero;
  tiers::ResidencyOptions residency_options;
  residency_options.budget_bytes = device_->budget_bytes() - device_->in_use_bytes();
  residency_options.prefetch_depth = zero.prefetch_depth;
  residency_options.max_inflight_bytes = zero.max_inflight_bytes;
  // wait_load all-gathers with several ranks: every rank must finish the same units.
  residency_options.rank_independent = ranks_ > 1;
  // Each unit's gather started ahead is its own key (gather.cpp, start_pending_gather), from a
  // range no other Engine on this communicator uses: every rank finalizes its Engines in the same
  // order, so the ranges agree.
  // Collectives on the host: received into pinned slots (staged path), when the plan found room.
  if (gathers_ahead_across_ranks() && (device_addressable_ || plan_.gather_slots > 0)) {
    ahead_.set_key_base(comm_->reserve_pending_keys(static_cast<std::uint32_t>(units_.size())));
  }
  // Shards read from NVMe, and on the staged path shards copied d2h from a device home, are sent
  // by the GatherSender once they are in host memory.
  const bool sends_later = std::any_of(units_.begin(), units_.end(), [](const UnitState& unit) {
    const Residence residence = unit.home(Kind::kParam).residence();
    return residence == Residence::kNvme || residence == Residence::kStagedDevice;
  });
  if (ahead_.across_ranks() && sends_later && comm_->sends_from_any_thread()) {
    ahead_.start_sender();
  }
  residency_ = std::make_unique<tiers::ResidencyManager>(*this, residency_options,
                                                         plan_.gathered_unit_bytes, "device");
  for (UnitId id = 0; id < units_.size(); ++id) {
    if (zero.stage < 3 || units_[id].layout.numel < zero.persistence_threshold) {
      residency_->set_persistent(id);
    }
  }
  nvme_read_mark_ = store_ ? store_->bytes_read() : 0;
  nvme_written_mark_ = store_ ? store_->bytes_written() : 0;
}

}  // namespace strata::runtime::detail
