#include "runtime/plan/pcie_traffic.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include "base/assert.hpp"
#include "runtime/plan/partition.hpp"

namespace strata::runtime {
namespace {

// The kinds a sub-group's update reads and writes (runtime/engine/engine_state.hpp's
// kUpdateReadKinds / kUpdateWriteKinds): stage_in copies the device-homed ones of the first d2h,
// stage_out those of the second h2d.
constexpr std::array<ShardKind, 5> kStagedInKinds = {ShardKind::kMaster, ShardKind::kCompensation,
                                                     ShardKind::kExpAvg, ShardKind::kExpAvgSq,
                                                     ShardKind::kGrad};
constexpr std::array<ShardKind, 5> kStagedOutKinds = {ShardKind::kMaster, ShardKind::kCompensation,
                                                      ShardKind::kExpAvg, ShardKind::kExpAvgSq,
                                                      ShardKind::kParam};

// Bytes of one kind over a shard, sub-group by sub-group (int8 sub-groups are padded to whole
// pages), as the buffer plan sizes them.
std::uint64_t shard_kind_bytes(const KindPlacement& placement, std::uint64_t shard_numel,
                               std::uint64_t sub_group_size) {
  const std::uint64_t group = sub_group_elements(sub_group_size);
  return shard_numel / group * placement.bytes(group) + placement.bytes(shard_numel % group);
}

bool on_device(const BufferPlan& buffers, ShardKind kind, std::size_t unit) {
  return buffers.kind(kind).kept && buffers.tier_of(kind, unit) == Tier::kDevice;
}

// The device optimizer updates a unit in place when every kind its update touches is homed on
// the device (EngineState::updates_on_device; its limit on a unit's tensor count is left out).
bool updated_on_device(const BufferPlan& buffers, std::size_t unit) {
  for (const auto& kinds : {kStagedInKinds, kStagedOutKinds}) {
    for (ShardKind kind : kinds) {
      if (buffers.kind(kind).kept && buffers.tier_of(kind, unit) != Tier::kDevice) return false;
    }
  }
  return true;
}

// One unit's gathers: `gathers` of them per step (gather.cpp, queue_gather and
// finish_gather_staged / queue_gathered_copy).
void add_gathers(const BufferPlan& buffers, const UnitLayout& layout, std::size_t unit,
                 double gathers, double& h2d, double& d2h) {
  const std::uint64_t param_bytes = dtype_bytes(buffers.kind(ShardKind::kParam).dtype);
  // (Parameters in the master's bytes are homed with it, on the parameters' own tier.)
  const bool device_home = buffers.tier_of(ShardKind::kParam, unit) == Tier::kDevice;
  if (buffers.ranks == 1) {
    // The shard is the unit: h2d from pinned memory, or a copy within the device.
    if (!device_home) h2d += gathers * static_cast<double>(layout.shard_numel * param_bytes);
    return;
  }
  // All-gathered into a pinned slot on the host, then the whole unit h2d.
  h2d += gathers * static_cast<double>(layout.padded_numel * param_bytes);
  if (device_home) d2h += gathers * static_cast<double>(layout.shard_numel * param_bytes);
}

// One unit's reduce_grads calls, one per micro-batch (reduce_grads.cpp).
void add_gradients(PcieTraffic& traffic, const BufferPlan& buffers, const UnitLayout& layout,
                   std::size_t unit, std::uint64_t micro_batches) {
  const bool device_home = buffers.tier_of(ShardKind::kGrad, unit) == Tier::kDevice;
  if (device_home && buffers.ranks == 1) return;  // cast or accumulated on the device
  // The padded fp32 gradient to the host: to its home (queue_grad_move), or reduced there.
  traffic.grad_d2h_bytes += micro_batches * layout.padded_numel * 4;
  // The reduced fp32 shard back to a device home.
  if (device_home) traffic.grad_h2d_bytes += micro_batches * layout.shard_numel * 4;
}

// One unit's optimizer step on the CPU: its device-homed kinds staged in and out, every
// sub-group once (device_lanes.cpp, stage_in / stage_out).
void add_optimizer_staging(PcieTraffic& traffic, const BufferPlan& buffers,
                           const UnitLayout& layout, std::size_t unit,
                           std::uint64_t sub_group_size) {
  if (updated_on_device(buffers, unit)) return;
  for (ShardKind kind : kStagedInKinds) {
    if (!on_device(buffers, kind, unit)) continue;
    traffic.optimizer_d2h_bytes +=
        shard_kind_bytes(buffers.kind(kind), layout.shard_numel, sub_group_size);
  }
  for (ShardKind kind : kStagedOutKinds) {
    if (!on_device(buffers, kind, unit)) continue;
    traffic.optimizer_h2d_bytes +=
        shard_kind_bytes(buffers.kind(kind), layout.shard_numel, sub_group_size);
  }
}

}  // namespace

double PcieTraffic::bound_s() const {
  STRATA_ASSERT(link_bytes_per_s > 0, "a PCIe bound at no link rate");
  return static_cast<double>(std::max(h2d_bytes(), d2h_bytes())) / link_bytes_per_s;
}

double gathers_per_step(bool kept_all_step, std::uint32_t micro_batches, double resident_fraction) {
  if (kept_all_step) return 1.0;
  const double uses = 2.0 * std::max<std::uint32_t>(1, micro_batches);
  const double kept = std::clamp(resident_fraction, 0.0, 1.0);
  return uses - (uses - 1.0) * kept;
}

PcieTraffic count_pcie_traffic(const Config& config, const BufferPlan& buffers,
                               const PcieInputs& inputs) {
  STRATA_ASSERT(buffers.ranks == inputs.ranks, "a PCIe count over another rank count's plan");
  PcieTraffic traffic;
  traffic.link_bytes_per_s = inputs.link_bytes_per_s;
  const std::uint64_t micro_batches = std::max<std::uint32_t>(1, inputs.micro_batches);
  double gather_h2d = 0;
  double gather_d2h = 0;
  double gathers = 0;
  for (std::size_t u = 0; u < inputs.unit_numels.size(); ++u) {
    const std::uint64_t numel = inputs.unit_numels[u];
    const UnitLayout layout = make_unit_layout(
        UnitSpec{"", {TensorSpec{"", {numel}, TensorInit::zeros()}}}, inputs.ranks);
    // Stages 0-2 keep every unit gathered; stage 3 the units under the persistence threshold
    // (engine_finalize.cpp, build_residency).
    const bool kept_all_step = config.zero.stage < 3 || numel < config.zero.persistence_threshold;
    const double unit_gathers =
        gathers_per_step(kept_all_step, inputs.micro_batches, inputs.resident_fraction);
    gathers += unit_gathers;
    add_gathers(buffers, layout, u, unit_gathers, gather_h2d, gather_d2h);
    add_gradients(traffic, buffers, layout, u, micro_batches);
    add_optimizer_staging(traffic, buffers, layout, u, config.zero.sub_group_size);
  }
  traffic.gather_h2d_bytes = static_cast<std::uint64_t>(std::llround(gather_h2d));
  traffic.gather_d2h_bytes = static_cast<std::uint64_t>(std::llround(gather_d2h));
  if (!inputs.unit_numels.empty()) {
    traffic.gathers_per_unit = gathers / static_cast<double>(inputs.unit_numels.size());
  }
  return traffic;
}

}  // namespace strata::runtime
