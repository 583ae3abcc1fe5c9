// The Engine's memory, computed from (config, unit sizes, rank count, data path) before anything is
// allocated: where each state kind lives and in which element type, the size of every working
// buffer, and the totals the tier budgets are checked against. Engine::finalize allocates exactly
// this plan and `strata plan` prints it, so the two cannot drift apart.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "base/dtype.hpp"
#include "cpu_adam/state_dtype.hpp"
#include "cpu_adam/typed_span.hpp"
#include "runtime/config/config.hpp"

namespace strata::runtime {

// The state kinds each rank keeps per unit shard. kParam holds the parameters in their compute
// type ([precision] params: bf16, fp16 or fp32), the copy gathered for the forward and backward.
// kCompensation is a Kahan-compensated bf16 master's low parts ([optimizer] master_rounding =
// "kahan"; cpu_adam/state_format.hpp): optimizer state, homed with the master.
enum class ShardKind : std::uint8_t { kParam, kGrad, kMaster, kExpAvg, kExpAvgSq, kCompensation };
inline constexpr std::size_t kShardKindCount = 6;
inline constexpr std::array<ShardKind, kShardKindCount> kAllShardKinds = {
    ShardKind::kParam,  ShardKind::kGrad,     ShardKind::kMaster,
    ShardKind::kExpAvg, ShardKind::kExpAvgSq, ShardKind::kCompensation};
// The optimizer's kinds, in the order a sub-group's update reads them.
inline constexpr std::array<ShardKind, 4> kOptimizerShardKinds = {
    ShardKind::kMaster, ShardKind::kCompensation, ShardKind::kExpAvg, ShardKind::kExpAvgSq};
constexpr bool is_optimizer_kind(ShardKind k) {
  return k != ShardKind::kParam && k != ShardKind::kGrad;
}

// Where one kind lives and in which element type; `kept` is false for a moment the optimizer
// does not keep (Adagrad has no exp_avg, Lion no exp_avg_sq), and for parameters `in_master`.
// Moments in int8 are `quantized`: blocks of cpu_adam/state_format.hpp (dtype kUint8 then only
// says "bytes"); every size of a kind goes through bytes(), never numel * element size.
struct KindPlacement {
  bool kept = false;
  Tier tier = Tier::kDevice;
  DType dtype = DType::kFp32;
  bool quantized = false;
  // kParam only: the parameters are the master weights' own bytes, with no home of their own.
  // So when both are bf16 and homed on the same tier ([optimizer] master_dtype = "bf16",
  // [precision] params = "bf16", [zero] params = optimizer): converting a bf16 master to bf16
  // parameters is the identity, so a separate copy would hold the same bits, cost its bytes on
  // every tier and a write per step. Gathers read the master's home; the optimizer writes no
  // parameters. `kept` is then false (nothing is allocated, staged or written for kParam).
  bool in_master = false;
  cpu_adam::StateDType state_dtype() const {
    if (quantized) return cpu_adam::StateDType::kInt8;
    return dtype == DType::kBf16 ? cpu_adam::StateDType::kBf16 : cpu_adam::StateDType::kFp32;
  }
  // int8 sub-groups are padded to whole 4 KiB pages (four blocks): the NVMe store moves whole
  // O_DIRECT pages, as every other kind's sub-groups (multiples of 2048 elements) already are.
  std::uint64_t bytes(std::uint64_t numel) const {
    if (!quantized) return numel * dtype_bytes(dtype);
    constexpr std::uint64_t kPage = 4 * cpu_adam::kQuantBlockBytes;
    return (cpu_adam::state_bytes(cpu_adam::StateDType::kInt8, numel) + kPage - 1) / kPage * kPage;
  }
};

struct BufferPlanInputs {
  std::vector<std::uint64_t> unit_numels;  // real elements of each unit, in registration order
  // With bf16 parameters, the elements of each unit's fp32 view (pack_fp32_views: only the
  // tensors given one). Empty, or other parameter dtypes: every unit widened whole.
  std::vector<std::uint64_t> unit_fp32_view_numels;
  std::uint32_t ranks = 1;
  std::uint32_t grad_accumulation = 1;  // > 1 keeps the gradient shard in fp32
  // The data path (EngineOptions::DeviceAccess): whether the CPU addresses device memory (the
  // host device, direct), and whether collectives take device memory (host device or NcclComm).
  bool device_addressable = true;
  bool collectives_on_device = true;
  // Several ranks whose communicator starts all-gathers ahead of use (MpiComm), not switched off
  // (EngineOptions::gathers_ahead_across_ranks, STRATA_GATHERS_AT_USE).
  bool gathers_ahead = false;
};

// The part of one state kind group (parameters, gradients, or the optimizer's master and moments)
// that a [zero] *_host_fraction keeps in host memory, or optimizer_device_fraction in device
// memory: whole units, one run in registration order, so each unit has one home per kind.
struct UnitShare {
  std::size_t first_unit = 0;    // the run's first unit
  std::size_t units = 0;         // how many units it holds
  std::uint64_t share_numel = 0;  // their shard elements
  std::uint64_t numel = 0;       // every unit's shard elements
  bool holds(std::size_t unit_index) const {
    return unit_index >= first_unit && unit_index - first_unit < units;
  }
  double fraction() const {
    return numel == 0 ? 0.0 : static_cast<double>(share_numel) / static_cast<double>(numel);
  }
};

// With BufferPlan::grads_to_home, the gradient scratch's room for weight-decay runs: units of up
// to 64 KiB / sizeof(cpu_adam::DecayRun) - 1 tensors are updated in place on the device.
inline constexpr std::uint64_t kDecayRunScratchBytes = 64 * 1024;

struct BufferPlan {
  std::array<KindPlacement, kShardKindCount> kinds{};
  std::uint32_t ranks = 1;
  std::uint64_t largest_padded_numel = 0;  // of a gathered unit (ranks * shard)
  std::uint64_t largest_shard_numel = 0;
  std::uint64_t largest_group_numel = 0;  // optimizer sub-group

  // Device memory. Each gathered unit holds its padded elements in the parameter type (what the
  // all-gather moves) and, for 16-bit parameters, an fp32 view (what compute reads): the whole
  // unit, or with bf16 parameters the tensors given one, packed (BufferPlanInputs).
  std::uint64_t device_state_bytes = 0;
  // A padded unit's gradient, fp32; with grads_to_home only room for a sub-group's weight-decay
  // runs (kDecayRunScratchBytes: the device optimizer reads them from there).
  std::uint64_t grad_full_scratch_bytes = 0;
  std::uint64_t grad_shard_scratch_bytes = 0;  // its reduced shard, fp32 (several ranks)
  std::uint64_t gather_send_bytes = 0;  // the all-gather's send copy of a parameter shard (idem)
  // The staged path with one rank and every gradient homed on the device: reduce_grads converts
  // (or adds) the caller's gradient into its home directly, through no padded scratch copy.
  bool grads_to_home = false;
  std::vector<std::uint64_t> gathered_unit_bytes;  // per unit
  std::uint64_t gathered_unit_bytes_max = 0;

  // Pinned host memory. Shards are rounded up to the direct-I/O alignment.
  std::uint64_t host_state_bytes = 0;
  std::uint32_t pipeline_buffer_count = 0;  // optimizer pipeline; 0 when nothing is on NVMe
  std::uint64_t pipeline_buffer_bytes = 0;  // a sub-group of every NVMe-homed kind
  std::array<std::uint64_t, kShardKindCount> pipeline_offsets{};
  std::uint64_t grad_staging_buffer_bytes = 0;  // each of two; gradients on NVMe only
  // The staged data path only: two slots of a sub-group of every device-homed kind, a gradient
  // shard in fp32, a padded unit in fp32 for collectives on the host, the NVMe parameter reads of
  // the units being loaded, and two slots a unit's gradient is copied into (d2h) while the
  // backward goes on (its padded fp32 values, or a device-homed gradient's stored shard).
  std::uint64_t device_staging_slot_bytes = 0;
  std::array<std::uint64_t, kShardKindCount> device_staging_offsets{};
  std::uint64_t shard_staging_bytes = 0;
  std::uint64_t full_staging_bytes = 0;
  std::uint64_t grad_move_slot_bytes = 0;  // each of two
  // Every gradient homed on the device: its sum of squares is added up on the device (one fp64
  // and the kernel's block sums, device memory) and read back once per step through a pinned
  // page, instead of each stored shard leaving the device for the norm.
  std::uint64_t norm_device_bytes = 0;
  std::uint64_t norm_readback_bytes = 0;
  // One rank, or collectives on the host: reduce_grads hands a gradient's cast (and norm) to the
  // compute stream and returns without waiting for them.
  bool grad_stores_queued = false;
  std::uint32_t param_read_slots = 0;
  std::uint64_t param_read_slot_bytes = 0;
  // Several ranks with collectives on the host (BufferPlanInputs::gathers_ahead): pinned slots an
  // all-gather started ahead of use receives into, a padded unit in the parameter dtype, one per
  // unit loading at once; as many as fit in half the host budget the rest of the plan leaves
  // free (none: every gather runs at use).
  std::uint32_t gather_slots = 0;
  std::uint64_t gather_slot_bytes = 0;

  // [zero] overlap_optimizer (runtime/engine/speculation.hpp): pinned copies of the in-memory state
  // (master, moments, parameters homed on the host, or in device memory the CPU addresses) a
  // speculative update changes, so step() can undo it. One allocation of undo_bytes, carved per
  // unit (0: the unit is updated in step()), last units first (the backward's order), within half
  // the host budget the rest of the plan leaves free.
  std::vector<std::uint64_t> undo_unit_bytes;
  std::uint64_t undo_bytes = 0;

  // NVMe: two slots (A/B) of every extent.
  std::uint64_t nvme_state_bytes = 0;
  // [tiers.host] nvme_read_cache: the host budget the rest of the plan leaves, at most one slot of
  // every extent (what the store may copy); 0 when off or nothing is on NVMe.
  std::uint64_t nvme_read_cache_bytes = 0;
  bool any_nvme = false;

  // [zero] params_host_fraction, grads_host_fraction, optimizer_host_fraction: a run of units
  // keeps that state kind group in host memory although it is homed on NVMe (from the first unit;
  // the optimizer's from the first unit after its device share).
  UnitShare params_share, grads_share, optimizer_share;
  // [zero] optimizer_device_fraction: the first units keep their optimizer state in device memory
  // although it is homed on the host or NVMe.
  UnitShare optimizer_device_share;

  const KindPlacement& kind(ShardKind k) const { return kinds[static_cast<std::size_t>(k)]; }
  bool on(ShardKind k, Tier tier) const { return kind(k).kept && kind(k).tier == tier; }
  // The host share of kind `k`'s group (master and moments share the optimizer's).
  const UnitShare& share_of(ShardKind k) const;
  // The tier of kind `k` in the unit at `unit_index`: its kind's tier, except in the units its
  // group's host fraction keeps in host memory, and the units optimizer_device_fraction keeps on
  // the device.
  Tier tier_of(ShardKind k, std::size_t unit_index) const;
  std::uint64_t device_scratch_bytes() const;
  // What finalize needs of the device budget: state, scratch and one gathered unit.
  std::uint64_t device_need_bytes() const;
  // Every unit gathered at once (stages 0-2 keep them all; stage 3 caches them while room lasts).
  std::uint64_t device_all_gathered_bytes() const;
  std::uint64_t nvme_staging_bytes() const;   // pipeline buffers and gradient write buffers
  std::uint64_t staged_path_bytes() const;    // the staged data path's pinned buffers
  std::uint64_t host_buffer_bytes() const {
    return nvme_staging_bytes() + staged_path_bytes() + undo_bytes;
  }
  std::uint64_t host_need_bytes() const { return host_state_bytes + host_buffer_bytes(); }
};

// The tier and element type of each kind, from [zero] and [precision] (and kParam in_master).
std::array<KindPlacement, kShardKindCount> place_kinds(const Config& config,
                                                       std::uint32_t grad_accumulation);

BufferPlan make_buffer_plan(const Config& config, const BufferPlanInputs& inputs);

}  // namespace strata::runtime
