#include "runtime/plan/buffer_plan.hpp"

#include <algorithm>

#include "base/assert.hpp"
#include "base/units.hpp"
#include "runtime/plan/partition.hpp"
#include "tiers/device/device.hpp"

namespace strata::runtime {
namespace {

bool kind_kept(const OptimizerConfig& optimizer, ShardKind kind) {
  if (kind == ShardKind::kExpAvg) return optimizer.type != OptimizerType::kAdagrad;
  if (kind == ShardKind::kExpAvgSq) return optimizer.type != OptimizerType::kLion;
  if (kind == ShardKind::kCompensation) {
    return optimizer.master_rounding == MasterRounding::kKahan &&
           optimizer.master_dtype == cpu_adam::StateDType::kBf16;
  }
  return true;
}

Tier home_tier(const ZeroConfig& zero, ShardKind kind) {
  switch (kind) {
    case ShardKind::kParam:
      return zero.params;
    case ShardKind::kGrad:
      return zero.grads;
    default:
      return zero.optimizer;
  }
}

std::uint64_t aligned(std::uint64_t bytes) {
  return round_up(bytes, kDirectIoAlignment);
}

// One unit of `numel` elements laid out over `ranks` (runtime/plan/partition.hpp's arithmetic).
UnitLayout layout_of(std::uint64_t numel, std::uint32_t ranks) {
  return make_unit_layout(UnitSpec{"", {TensorSpec{"", {numel}, TensorInit::zeros()}}}, ranks);
}

// The shard's sub-groups as make_sub_groups cuts them, counted without listing them (a plan for
// 1e15 parameters in small sub-groups has too many to list).
struct SubGroupCount {
  std::uint64_t size = 0;       // elements of each full sub-group
  std::uint64_t full = 0;       // how many are full
  std::uint64_t remainder = 0;  // elements of the last, partial one (0: none)
  std::uint64_t largest() const { return full > 0 ? size : remainder; }
};

SubGroupCount count_sub_groups(std::uint64_t shard_numel, std::uint64_t sub_group_numel) {
  SubGroupCount count;
  count.size = sub_group_elements(sub_group_numel);
  count.full = shard_numel / count.size;
  count.remainder = shard_numel % count.size;
  return count;
}

// The units from `first` on that a share keeps apart: the longest run whose shards hold at most
// `fraction` of every shard's elements (whole units, so each unit has one home per kind).
UnitShare plan_share(double fraction, const std::vector<UnitLayout>& layouts, std::size_t first) {
  UnitShare share;
  share.first_unit = first;
  for (const UnitLayout& layout : layouts) share.numel += layout.shard_numel;
  if (fraction <= 0) return share;
  const auto allowed = static_cast<std::uint64_t>(fraction * static_cast<double>(share.numel));
  for (std::size_t u = first; u < layouts.size(); ++u) {
    if (share.share_numel + layouts[u].shard_numel > allowed) break;
    share.share_numel += layouts[u].shard_numel;
    ++share.units;
  }
  return share;
}

// A host share splits a kind homed on NVMe only (the config refuses one elsewhere).
UnitShare plan_host_share(Tier home, double fraction, const std::vector<UnitLayout>& layouts,
                          std::size_t first = 0) {
  return plan_share(home == Tier::kNvme ? fraction : 0.0, layouts, first);
}

void plan_shares(BufferPlan& plan, const Config& config, const std::vector<UnitLayout>& layouts) {
  const ZeroConfig& zero = config.zero;
  plan.params_share = plan_host_share(zero.params, zero.params_host_fraction, layouts);
  plan.grads_share = plan_host_share(zero.grads, zero.grads_host_fraction, layouts);
  // The device share first: the first units are the ones the next forward needs first, and
  // their updates run last in the step.
  const bool device_share = zero.optimizer != Tier::kDevice;
  plan.optimizer_device_share =
      plan_share(device_share ? zero.optimizer_device_fraction : 0.0, layouts, 0);
  plan.optimizer_share = plan_host_share(zero.optimizer, zero.optimizer_host_fraction, layouts,
                                         plan.optimizer_device_share.units);
  STRATA_ASSERT(plan.optimizer_device_share.units + plan.optimizer_share.units <= layouts.size(),
                "the optimizer's device and host shares hold more units than there are");
}

void plan_state(BufferPlan& plan, const Config& config, const UnitLayout& layout,
                std::size_t unit_index) {
  const SubGroupCount groups = count_sub_groups(layout.shard_numel, config.zero.sub_group_size);
  plan.largest_group_numel = std::max(plan.largest_group_numel, groups.largest());
  for (ShardKind kind : kAllShardKinds) {
    const KindPlacement& placement = plan.kind(kind);
    if (!placement.kept) continue;
    // Sub-groups are encoded separately (int8 blocks start at each one's first element).
    const std::uint64_t bytes = groups.full * placement.bytes(groups.size) +
                                placement.bytes(groups.remainder);
    const Tier tier = plan.tier_of(kind, unit_index);
    if (tier == Tier::kDevice) plan.device_state_bytes += bytes;
    if (tier == Tier::kHost) plan.host_state_bytes += aligned(bytes);
    if (tier == Tier::kNvme) {
      // One extent per sub-group, two slots (A/B) of each.
      plan.any_nvme = true;
      plan.nvme_state_bytes += 2 * groups.full * aligned(placement.bytes(groups.size));
      if (groups.remainder > 0) {
        plan.nvme_state_bytes += 2 * aligned(placement.bytes(groups.remainder));
      }
    }
  }
}

void plan_nvme_staging(BufferPlan& plan, const Config& config) {
  if (!plan.any_nvme) return;
  // Offsets in a pipeline buffer, in the order the optimizer reads them.
  for (ShardKind kind : {ShardKind::kMaster, ShardKind::kCompensation, ShardKind::kExpAvg,
                         ShardKind::kExpAvgSq, ShardKind::kGrad, ShardKind::kParam}) {
    if (!plan.on(kind, Tier::kNvme)) continue;
    plan.pipeline_offsets[static_cast<std::size_t>(kind)] = plan.pipeline_buffer_bytes;
    plan.pipeline_buffer_bytes +=
        aligned(plan.kind(kind).bytes(plan.largest_group_numel));
  }
  plan.pipeline_buffer_count = config.zero.buffer_count;
  if (plan.on(ShardKind::kGrad, Tier::kNvme)) {
    plan.grad_staging_buffer_bytes =
        aligned(plan.kind(ShardKind::kGrad).bytes(plan.largest_shard_numel));
  }
}

void plan_staged_path(BufferPlan& plan, const Config& config, const BufferPlanInputs& inputs) {
  if (inputs.device_addressable) return;
  // The optimizer_device_fraction's units are updated in place on the device; their slots are for
  // a unit that must be staged all the same (updates_on_device: a run without Adam, or more
  // tensors than the gradient scratch has room to describe).
  const bool device_share = plan.optimizer_device_share.units > 0;
  for (ShardKind kind : kAllShardKinds) {
    if (!plan.on(kind, Tier::kDevice) &&
        !(device_share && is_optimizer_kind(kind) && plan.kind(kind).kept)) {
      continue;
    }
    plan.device_staging_offsets[static_cast<std::size_t>(kind)] = plan.device_staging_slot_bytes;
    plan.device_staging_slot_bytes +=
        aligned(plan.kind(kind).bytes(plan.largest_group_numel));
  }
  const bool grads_on_device = plan.kind(ShardKind::kGrad).tier == Tier::kDevice;
  plan.grad_stores_queued = plan.ranks == 1 || !inputs.collectives_on_device;
  const bool moves_queued = !grads_on_device && plan.grad_stores_queued;
  // A gradient shard in fp32: with several ranks the send side of a gather's all-gather and the
  // reduce-scatter's result.
  if (plan.ranks > 1) plan.shard_staging_bytes = aligned(plan.largest_shard_numel * 4);
  if (grads_on_device) {
    plan.norm_device_bytes =
        round_up(sizeof(double), tiers::kDeviceAllocationGranularity) +
        round_up(std::max<std::uint64_t>(1, tiers::sum_of_squares_scratch_bytes(
                                                plan.largest_shard_numel)),
                 tiers::kDeviceAllocationGranularity);
    plan.norm_readback_bytes = aligned(sizeof(double));
  }
  if (plan.ranks > 1 && !inputs.collectives_on_device) {
    plan.full_staging_bytes = aligned(plan.largest_padded_numel * 4);
  }
  // Gradients homed in host memory or on NVMe leave the device through these while the backward
  // goes on (reduce_grads.cpp): a padded unit in fp32 (reduced on the host with several ranks).
  if (moves_queued) plan.grad_move_slot_bytes = aligned(plan.largest_padded_numel * 4);
  if (config.zero.params == Tier::kNvme) {
    // At most the prefetched units and the one being acquired are loading at once.
    plan.param_read_slots = config.zero.prefetch_depth + 2;
    plan.param_read_slot_bytes =
        aligned(plan.kind(ShardKind::kParam).bytes(plan.largest_shard_numel));
  }
}

// The staged path's all-gathers started ahead of use (gather.cpp, start_pending_gather): the
// units loading at once (prefetched, and the one acquired), within half the spare host budget.
void plan_gather_slots(BufferPlan& plan, const Config& config, const BufferPlanInputs& inputs) {
  if (inputs.device_addressable || inputs.collectives_on_device || !inputs.gathers_ahead ||
      plan.ranks < 2) {
    return;
  }
  const std::uint64_t need = plan.host_need_bytes();
  const std::uint64_t budget = config.tiers.host.budget_bytes;
  const std::uint64_t room = budget > need ? (budget - need) / 2 : 0;
  const std::uint64_t slot = aligned(plan.kind(ShardKind::kParam).bytes(plan.largest_padded_numel));
  if (slot == 0) return;
  plan.gather_slot_bytes = slot;
  plan.gather_slots = static_cast<std::uint32_t>(
      std::min<std::uint64_t>(config.zero.prefetch_depth + 2, room / slot));
}

// The speculative updates' undo copies (BufferPlan::undo_unit_bytes), of the kinds the update
// writes in memory. On the staged path a unit with any state in device memory is not speculated
// (speculation.cpp, may_speculate), so it has none.
void plan_undo_copies(BufferPlan& plan, const Config& config, const BufferPlanInputs& inputs,
                      const std::vector<UnitLayout>& layouts) {
  plan.undo_unit_bytes.assign(layouts.size(), 0);
  if (!config.zero.overlap_optimizer) return;
  const std::uint64_t need = plan.host_need_bytes();
  const std::uint64_t budget = config.tiers.host.budget_bytes;
  const std::uint64_t room = budget > need ? (budget - need) / 2 : 0;
  constexpr std::array kWritten = {ShardKind::kMaster, ShardKind::kCompensation,
                                   ShardKind::kExpAvg, ShardKind::kExpAvgSq, ShardKind::kParam};
  const auto on_device = [&](std::size_t u) {  // every kind is read or written by the update
    for (ShardKind kind : kAllShardKinds) {
      if (plan.kind(kind).kept && plan.tier_of(kind, u) == Tier::kDevice) return true;
    }
    return false;
  };
  for (std::size_t u = layouts.size(); u-- > 0;) {
    if (!inputs.device_addressable && on_device(u)) continue;
    const SubGroupCount groups = count_sub_groups(layouts[u].shard_numel, config.zero.sub_group_size);
    std::uint64_t bytes = 0;
    for (ShardKind kind : kWritten) {
      const KindPlacement& placement = plan.kind(kind);
      if (!placement.kept || plan.tier_of(kind, u) == Tier::kNvme) continue;
      bytes += groups.full * placement.bytes(groups.size) + placement.bytes(groups.remainder);
    }
    if (bytes == 0 || plan.undo_bytes + aligned(bytes) > room) continue;
    plan.undo_unit_bytes[u] = bytes;
    plan.undo_bytes += aligned(bytes);
  }
}

}  // namespace

std::array<KindPlacement, kShardKindCount> place_kinds(const Config& config,
                                                       std::uint32_t grad_accumulation) {
  std::array<KindPlacement, kShardKindCount> kinds{};
  for (ShardKind kind : kAllShardKinds) {
    KindPlacement& placement = kinds[static_cast<std::size_t>(kind)];
    placement.kept = kind_kept(config.optimizer, kind);
    placement.tier = home_tier(config.zero, kind);
    // Parameters as configured; gradients too, except that accumulating over micro-batches keeps
    // them in fp32 (no rounding per addition); optimizer state as [optimizer] master_dtype and
    // state_dtype say.
    const cpu_adam::StateDType state =
        kind == ShardKind::kMaster || kind == ShardKind::kCompensation
            ? config.optimizer.master_dtype
            : config.optimizer.state_dtype;
    placement.dtype = kind == ShardKind::kParam ? config.precision.params
                      : kind == ShardKind::kGrad
                          ? (grad_accumulation > 1 ? DType::kFp32
                                                   : config.precision.grads)
                      : state == cpu_adam::StateDType::kBf16 ? DType::kBf16
                      : state == cpu_adam::StateDType::kInt8 ? DType::kUint8
                                                             : DType::kFp32;
    placement.quantized = placement.dtype == DType::kUint8;
  }
  KindPlacement& param = kinds[static_cast<std::size_t>(ShardKind::kParam)];
  const KindPlacement& master = kinds[static_cast<std::size_t>(ShardKind::kMaster)];
  // fp16 parameters (or an fp32 master) are a rounding of the master: they keep their own copy.
  param.in_master = param.dtype == DType::kBf16 && master.dtype == DType::kBf16 &&
                    !master.quantized && param.tier == master.tier;
  if (param.in_master) param.kept = false;
  return kinds;
}

BufferPlan make_buffer_plan(const Config& config, const BufferPlanInputs& inputs) {
  BufferPlan plan;
  plan.kinds = place_kinds(config, inputs.grad_accumulation);
  plan.ranks = inputs.ranks;
  const DType param_dtype = plan.kind(ShardKind::kParam).dtype;
  const std::uint64_t param_bytes = dtype_bytes(param_dtype);
  STRATA_ASSERT(inputs.unit_fp32_view_numels.empty() ||
                    inputs.unit_fp32_view_numels.size() == inputs.unit_numels.size(),
                "one fp32 view count per unit, or none");
  // A gathered unit: its parameters (fp32: they are the fp32 view), and with 16-bit parameters
  // their fp32 view too: the whole unit, or with bf16 parameters the tensors given one, packed
  // (pack_fp32_views; fp16 has no bf16 view to read instead: EngineState::widens).
  const auto gathered_bytes = [&](std::size_t u, const UnitLayout& layout) {
    if (param_dtype == DType::kFp32) return layout.padded_numel * 4;
    const std::uint64_t fp32_numel =
        inputs.unit_fp32_view_numels.empty() || param_dtype != DType::kBf16
            ? layout.padded_numel
            : inputs.unit_fp32_view_numels[u];
    return layout.padded_numel * param_bytes + fp32_numel * 4;
  };
  std::vector<UnitLayout> layouts;
  for (std::uint64_t numel : inputs.unit_numels) layouts.push_back(layout_of(numel, inputs.ranks));
  plan_shares(plan, config, layouts);
  for (std::size_t u = 0; u < layouts.size(); ++u) {
    const UnitLayout& layout = layouts[u];
    plan.largest_padded_numel = std::max(plan.largest_padded_numel, layout.padded_numel);
    plan.largest_shard_numel = std::max(plan.largest_shard_numel, layout.shard_numel);
    plan.gathered_unit_bytes.push_back(gathered_bytes(u, layout));
    plan.gathered_unit_bytes_max =
        std::max(plan.gathered_unit_bytes_max, plan.gathered_unit_bytes.back());
    plan_state(plan, config, layout, u);
  }
  plan.grads_to_home = !inputs.device_addressable && inputs.ranks == 1 &&
                       plan.kind(ShardKind::kGrad).tier == Tier::kDevice &&
                       plan.grads_share.units == 0;
  plan.grad_full_scratch_bytes =
      plan.grads_to_home ? kDecayRunScratchBytes : plan.largest_padded_numel * 4;
  if (inputs.ranks > 1) {
    plan.grad_shard_scratch_bytes = plan.largest_shard_numel * 4;
    plan.gather_send_bytes = plan.largest_shard_numel * param_bytes;
  }
  plan_nvme_staging(plan, config);
  plan_staged_path(plan, config, inputs);
  plan_gather_slots(plan, config, inputs);
  plan_undo_copies(plan, config, inputs, layouts);
  if (config.tiers.host.nvme_read_cache && plan.any_nvme &&
      config.tiers.host.budget_bytes > plan.host_need_bytes()) {
    plan.nvme_read_cache_bytes = std::min(config.tiers.host.budget_bytes - plan.host_need_bytes(),
                                          plan.nvme_state_bytes / 2);
  }
  return plan;
}

const UnitShare& BufferPlan::share_of(ShardKind k) const {
  switch (k) {
    case ShardKind::kParam:
      return params_share;
    case ShardKind::kGrad:
      return grads_share;
    default:
      return optimizer_share;
  }
}

Tier BufferPlan::tier_of(ShardKind k, std::size_t unit_index) const {
  if (is_optimizer_kind(k) && optimizer_device_share.holds(unit_index)) return Tier::kDevice;
  if (share_of(k).holds(unit_index)) return Tier::kHost;
  return kind(k).tier;
}

std::uint64_t BufferPlan::device_scratch_bytes() const {
  return grad_full_scratch_bytes + grad_shard_scratch_bytes + gather_send_bytes + norm_device_bytes;
}

std::uint64_t BufferPlan::device_need_bytes() const {
  return device_state_bytes + device_scratch_bytes() + gathered_unit_bytes_max;
}

std::uint64_t BufferPlan::device_all_gathered_bytes() const {
  std::uint64_t total = 0;
  for (std::uint64_t bytes : gathered_unit_bytes) total += bytes;
  return total;
}

std::uint64_t BufferPlan::nvme_staging_bytes() const {
  return pipeline_buffer_count * pipeline_buffer_bytes + 2 * grad_staging_buffer_bytes;
}

std::uint64_t BufferPlan::staged_path_bytes() const {
  return 2 * device_staging_slot_bytes + shard_staging_bytes + full_staging_bytes +
         2 * grad_move_slot_bytes + norm_readback_bytes + param_read_slots * param_read_slot_bytes +
         gather_slots * gather_slot_bytes;
}

}  // namespace strata::runtime
