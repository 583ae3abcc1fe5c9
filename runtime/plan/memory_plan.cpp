#include "runtime/plan/memory_plan.hpp"

#include "cpu_adam/state_dtype.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "base/debug_knobs.hpp"
#include "cpu_adam/state_dtype.hpp"
#include "runtime/plan/buffer_plan.hpp"
#include "runtime/config/byte_size.hpp"

namespace strata::runtime {
namespace {

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) {
  return (a + b - 1) / b;
}

TierRow& tier_row(MemoryPlan& plan, Tier tier) {
  return plan.tiers[static_cast<std::size_t>(tier)];
}

// The largest unit gathered at once. With an explicit parameter count the model's shape is unknown,
// so a unit is taken as 1/layers of the model; otherwise it is the largest GPT-2 block or
// embedding.
std::uint64_t largest_unit_elements(const Config& config, std::uint64_t params) {
  const ModelConfig& model = config.model;
  if (model.params != 0 || params != config.parameter_count()) {
    return ceil_div(params, std::max<std::uint64_t>(1, model.layers));
  }
  const std::uint64_t d = model.d_model;
  const std::uint64_t block = 12 * d * d + 13 * d;
  const std::uint64_t embedding = (static_cast<std::uint64_t>(model.vocab) + model.seq_len) * d;
  return std::max(block, embedding);
}

// The Engine's buffer plan for this plan's units and data path. Only Ψ known: units of
// plan.unit_elements. A CUDA device takes the staged path, and its collectives are counted on the
// host (a unit of pinned staging, and the slots of gathers started ahead over MPI, that NcclComm
// would make unneeded).
BufferPlanInputs buffer_inputs(const Config& config, const PlanInputs& inputs,
                               const MemoryPlan& plan) {
  BufferPlanInputs out;
  out.unit_numels = inputs.unit_numels;
  out.unit_fp32_view_numels = inputs.unit_numels.empty() ? std::vector<std::uint64_t>{}
                                                         : inputs.unit_fp32_view_numels;
  if (out.unit_numels.empty()) {
    const std::uint64_t unit = std::max<std::uint64_t>(1, plan.unit_elements);
    for (std::uint64_t done = 0; done < plan.params; done += unit) {
      out.unit_numels.push_back(std::min(unit, plan.params - done));
    }
  }
  out.ranks = plan.ranks;
  out.grad_accumulation = config.model.grad_accumulation;
  out.device_addressable = config.tiers.device.kind != DeviceKind::kCuda;
  out.collectives_on_device = out.device_addressable;
  out.gathers_ahead = plan.ranks > 1 && !gathers_at_use_knob();
  return out;
}

// Units known: the state rows hold padded shards, per tier as the Engine places them.
void use_exact_state(MemoryPlan& plan, const BufferPlan& buffers) {
  tier_row(plan, Tier::kDevice).state_bytes = buffers.device_state_bytes;
  tier_row(plan, Tier::kHost).state_bytes = buffers.host_state_bytes;
  tier_row(plan, Tier::kNvme).state_bytes = buffers.nvme_state_bytes;
}

// Device memory of the gathered units: every unit at stages 0-2 (kept for the whole step); at
// stage 3 the units the residency manager caches while the budget allows (units known:
// docs/design.md, "Residency and prefetch"), or only Ψ known, the working set of prefetch_depth + 1
// units.
std::uint64_t gathered_device_bytes(const MemoryPlan& plan, const Config& config,
                                    const BufferPlan& buffers, const PlanInputs& inputs) {
  const std::uint64_t all = buffers.device_all_gathered_bytes();
  if (plan.stage < 3) return all;
  if (inputs.unit_numels.empty()) {
    return std::min<std::uint64_t>(
        all, (config.zero.prefetch_depth + 1) * buffers.gathered_unit_bytes_max);
  }
  const std::uint64_t fixed = buffers.device_state_bytes + buffers.device_scratch_bytes() +
                              inputs.compute_device_bytes;
  const std::uint64_t left =
      config.tiers.device.budget_bytes > fixed ? config.tiers.device.budget_bytes - fixed : 0;
  return std::min(all, std::max(left, buffers.gathered_unit_bytes_max));
}

void add_buffer_rows(MemoryPlan& plan, const Config& config, const BufferPlan& buffers,
                     const PlanInputs& inputs) {
  const bool exact = !inputs.unit_numels.empty();
  const ZeroConfig& zero = config.zero;
  if (inputs.compute_device_bytes > 0) {
    plan.buffers.push_back({inputs.compute_description.empty() ? std::string("the model's compute")
                                                               : inputs.compute_description,
                            Tier::kDevice, inputs.compute_device_bytes});
  }
  std::string gathered_purpose = "every unit gathered for the whole step (stages 0-2)";
  if (plan.stage >= 3 && exact) {
    gathered_purpose = fmt::format("gathered units cached (all {} units, as far as the budget allows)",
                                   buffers.gathered_unit_bytes.size());
  } else if (plan.stage >= 3) {
    gathered_purpose = fmt::format("{} gathered units (prefetch_depth {} + 1) of {} params",
                                   zero.prefetch_depth + 1, zero.prefetch_depth, plan.unit_elements);
  }
  plan.buffers.push_back({gathered_purpose, Tier::kDevice,
                          gathered_device_bytes(plan, config, buffers, inputs)});
  plan.buffers.push_back(
      {buffers.grads_to_home
           ? "gradient scratch: the norm's sum and the optimizer's weight-decay runs (one rank, "
             "gradients homed on the device: each is converted into its home directly)"
       : buffers.ranks > 1
           ? "gradient scratch: one unit's gradient (fp32) and its reduced shard, gather send copy"
           : "gradient scratch: one unit's gradient (fp32)",
       Tier::kDevice, buffers.device_scratch_bytes()});
  if (buffers.pipeline_buffer_count > 0) {
    plan.buffers.push_back({fmt::format("{} optimizer pipeline buffers of {} elements",
                                        buffers.pipeline_buffer_count, buffers.largest_group_numel),
                            Tier::kHost,
                            buffers.pipeline_buffer_count * buffers.pipeline_buffer_bytes});
  }
  if (buffers.grad_staging_buffer_bytes > 0) {
    plan.buffers.push_back({"2 gradient shard write buffers", Tier::kHost,
                            2 * buffers.grad_staging_buffer_bytes});
  }
  if (buffers.undo_bytes > 0) {
    std::size_t units = 0;
    for (std::uint64_t bytes : buffers.undo_unit_bytes) units += bytes > 0 ? 1 : 0;
    plan.buffers.push_back(
        {fmt::format("copies that undo the optimizer updates started during the backward ({} of "
                     "{} units; [zero] overlap_optimizer)",
                     units, buffers.undo_unit_bytes.size()),
         Tier::kHost, buffers.undo_bytes});
  }
  if (buffers.nvme_read_cache_bytes > 0) {
    plan.buffers.push_back({"NVMe read cache: copies of NVMe-homed extents in the spare host "
                            "budget, reads served from them (at most)",
                            Tier::kHost, buffers.nvme_read_cache_bytes});
  }
  if (buffers.staged_path_bytes() > 0) {
    plan.buffers.push_back(
        {"pinned staging of the CUDA data path (device-homed sub-groups, a gradient shard, a "
         "unit for collectives on the host, NVMe parameter reads, gathers started ahead)",
         Tier::kHost, buffers.staged_path_bytes()});
  }
}

// Bytes of the parameter row that gathers read from NVMe when the parameters are the master's
// bytes: the master's units homed on the host (optimizer_host_fraction) are read from there.
std::uint64_t param_bytes_read_from_nvme(const StateRow& params, const BufferPlan& buffers) {
  const std::uint64_t bytes =
      params.elements_per_rank * dtype_bytes(buffers.kind(ShardKind::kParam).dtype);
  return static_cast<std::uint64_t>((1 - buffers.optimizer_share.fraction()) *
                                    static_cast<double>(bytes));
}

// [zero] params_host_fraction, grads_host_fraction, optimizer_host_fraction: the buffer plan keeps
// whole units of each NVMe-homed kind on the host; each row moves that share from the NVMe tier
// (two slots) to the host tier. optimizer_device_fraction moves the optimizer row's device share
// from its home tier (one slot on the host, two on NVMe) to the device tier.
void keep_shares_apart(MemoryPlan& plan, const BufferPlan& buffers) {
  for (StateRow& row : plan.states) {
    const auto bytes_of = [&](const UnitShare& share) {  // rounded: 1/3 of 3k bytes is k
      return static_cast<std::uint64_t>(
          std::llround(share.fraction() * static_cast<double>(row.bytes_per_rank)));
    };
    if (row.kind == StateKind::kOptimizer && buffers.optimizer_device_share.share_numel > 0) {
      const UnitShare& share = buffers.optimizer_device_share;
      row.device_bytes_per_rank = bytes_of(share);
      row.layout += fmt::format(" ({:.0f}% on device)", 100 * share.fraction());
      tier_row(plan, Tier::kDevice).state_bytes += row.device_bytes_per_rank;
      tier_row(plan, row.home).state_bytes -=
          row.device_bytes_per_rank * (row.home == Tier::kNvme ? 2 : 1);
    }
    const UnitShare& share = row.kind == StateKind::kParams ? buffers.params_share
                             : row.kind == StateKind::kGrads ? buffers.grads_share
                                                             : buffers.optimizer_share;
    if (share.share_numel == 0) continue;
    row.host_bytes_per_rank = bytes_of(share);
    row.layout += fmt::format(" ({:.0f}% on host)", 100 * share.fraction());
    tier_row(plan, Tier::kHost).state_bytes += row.host_bytes_per_rank;
    tier_row(plan, Tier::kNvme).state_bytes -= 2 * row.host_bytes_per_rank;
  }
}

// Adds one state row; bytes_of(elements): the bytes of the row's kinds over that many elements.
template <typename BytesOf>
void add_state(MemoryPlan& plan, StateKind kind, std::string layout, const BytesOf& bytes_of,
               bool sharded, Tier home) {
  const std::uint64_t elements = sharded ? ceil_div(plan.params, plan.ranks) : plan.params;
  const std::uint64_t bytes = bytes_of(elements);
  // Per parameter over a whole page of int8 blocks (four), where no padding counts.
  constexpr std::uint64_t kPageElems = 4 * cpu_adam::kQuantBlockElems;
  const double per_param = static_cast<double>(bytes_of(kPageElems)) / kPageElems;
  plan.states.push_back({kind, std::move(layout), per_param, sharded, home, elements, bytes, 0});
  // The NVMe store keeps two slots (A/B) of every extent, so a crash mid-step never touches the
  // committed copy: state homed on NVMe occupies twice its size there.
  tier_row(plan, home).state_bytes += bytes * (home == Tier::kNvme ? 2 : 1);
}

// The optimizer row's layout: each kept kind in its own format ([optimizer] master_dtype,
// state_dtype).
std::string optimizer_layout(const BufferPlan& buffers) {
  std::string layout;
  for (ShardKind kind : kOptimizerShardKinds) {
    const KindPlacement& placement = buffers.kind(kind);
    if (!placement.kept) continue;
    const bool adagrad_sum = kind == ShardKind::kExpAvgSq && !buffers.kind(ShardKind::kExpAvg).kept;
    layout += fmt::format("{}{} {}", layout.empty() ? "" : " + ",
                          cpu_adam::state_dtype_name(placement.state_dtype()),
                          kind == ShardKind::kMaster         ? "master"
                          : kind == ShardKind::kCompensation ? "compensation"
                          : kind == ShardKind::kExpAvg       ? "exp_avg"
                          : adagrad_sum ? "sum of squares"  // Adagrad's exp_avg_sq
                                        : "exp_avg_sq");
  }
  return layout;
}

// The params, grads and optimizer rows in the buffer plan's element types, each homed where
// [zero] says, with the shares [zero] *_host_fraction keeps on the host.
void add_state_rows(MemoryPlan& plan, const Config& config, const BufferPlan& buffers) {
  const ZeroConfig& zero = config.zero;
  const DType param_dtype = buffers.kind(ShardKind::kParam).dtype;
  const DType grad_dtype = buffers.kind(ShardKind::kGrad).dtype;
  const auto param_bytes = static_cast<std::uint32_t>(dtype_bytes(param_dtype));
  const auto grad_bytes = static_cast<std::uint32_t>(dtype_bytes(grad_dtype));
  const auto optimizer_bytes = [&](std::uint64_t elements) {
    std::uint64_t bytes = 0;
    for (ShardKind kind : kOptimizerShardKinds) {
      if (buffers.kind(kind).kept) bytes += buffers.kind(kind).bytes(elements);
    }
    return bytes;
  };
  // Parameters in the master's bytes (KindPlacement::in_master) take no bytes of their own.
  const bool params_in_master = buffers.kind(ShardKind::kParam).in_master;
  add_state(
      plan, StateKind::kParams,
      params_in_master ? fmt::format("{} (the master's own bytes)", to_string(param_dtype))
                       : std::string(to_string(param_dtype)),
      [&](std::uint64_t elements) { return params_in_master ? 0 : elements * param_bytes; },
      plan.stage >= 3, zero.params);
  add_state(
      plan, StateKind::kGrads, std::string(to_string(grad_dtype)),
      [&](std::uint64_t elements) { return elements * grad_bytes; }, plan.stage >= 2, zero.grads);
  add_state(plan, StateKind::kOptimizer, optimizer_layout(buffers), optimizer_bytes,
            plan.stage >= 1, zero.optimizer);
  keep_shares_apart(plan, buffers);
}

// Each tier's buffer total, budget and name.
void total_tiers(MemoryPlan& plan, const Config& config) {
  for (const BufferRow& buffer : plan.buffers)
    tier_row(plan, buffer.tier).buffer_bytes += buffer.bytes;

  tier_row(plan, Tier::kDevice).budget_bytes = config.tiers.device.budget_bytes;
  tier_row(plan, Tier::kHost).budget_bytes = config.tiers.host.budget_bytes;
  tier_row(plan, Tier::kNvme).budget_bytes = config.tiers.nvme.budget_bytes;
  for (std::size_t t = 0; t < plan.tiers.size(); ++t) plan.tiers[t].tier = static_cast<Tier>(t);
}

// The NVMe bytes one NVMe-homed state row moves in an optimizer step (forward + backward + step).
NvmeTraffic state_nvme_traffic(const StateRow& state, const Config& config,
                               const BufferPlan& buffers) {
  NvmeTraffic traffic;
  // What a host or device fraction keeps in memory moves no NVMe bytes.
  const std::uint64_t streamed =
      state.bytes_per_rank - state.host_bytes_per_rank - state.device_bytes_per_rank;
  switch (state.kind) {
    case StateKind::kOptimizer:  // read, update, write back
      traffic.read_bytes = streamed;
      traffic.write_bytes = streamed;
      break;
    case StateKind::kGrads:  // written in backward, read by the optimizer
      traffic.write_bytes = streamed;
      traffic.read_bytes = streamed;
      break;
    case StateKind::kParams: {  // read for the forward and the backward gather, written by the step
      // [zero] defer_update without the speculation during the backward: every update runs when
      // the next forward gathers its unit and hands the new parameters over, so only the
      // backward reads them (with the speculation, the units it confirms are read by the
      // forward as well: counted as if all were).
      // (A CUDA device runs the update in step(): no deferral there.)
      const bool all_deferred = config.zero.defer_update && !config.zero.overlap_optimizer &&
                                config.tiers.device.kind != DeviceKind::kCuda;
      const std::uint64_t gathers = all_deferred ? 1 : 2;
      // In the master's bytes: read from there (the share optimizer_host_fraction keeps on the
      // host aside), written by no one but the optimizer (counted in its row; streamed is 0).
      const bool params_in_master = buffers.kind(ShardKind::kParam).in_master;
      traffic.read_bytes =
          gathers * (params_in_master ? param_bytes_read_from_nvme(state, buffers) : streamed);
      traffic.write_bytes = streamed;
      break;
    }
  }
  // [tiers.host] nvme_read_cache: the share of the extents the cache has room for is read from
  // memory (the first written; counted as an even share of every kind).
  if (buffers.nvme_read_cache_bytes > 0 && buffers.nvme_state_bytes > 0) {
    const double covered = std::min(1.0, 2.0 * static_cast<double>(buffers.nvme_read_cache_bytes) /
                                             static_cast<double>(buffers.nvme_state_bytes));
    traffic.read_bytes = static_cast<std::uint64_t>(
        std::llround((1.0 - covered) * static_cast<double>(traffic.read_bytes)));
  }
  return traffic;
}

// NVMe traffic of one optimizer step, per NVMe-homed kind and in all.
void add_nvme_traffic(MemoryPlan& plan, const Config& config, const BufferPlan& buffers) {
  for (const StateRow& state : plan.states) {
    if (state.home != Tier::kNvme) continue;
    NvmeTraffic& traffic = plan.nvme_traffic[static_cast<std::size_t>(state.kind)];
    traffic = state_nvme_traffic(state, config, buffers);
    plan.nvme_read_bytes_per_step += traffic.read_bytes;
    plan.nvme_write_bytes_per_step += traffic.write_bytes;
  }
}

// Communication per rank per step, as the seeds count it: stages 0-2 move 2Ψ (reduce-scatter of
// gradients + all-gather of parameters), stage 3 adds a second parameter gather: 3Ψ. With
// [model] grad_accumulation micro-batches, every micro-batch reduce-scatters its gradients (into
// the fp32 shard) and, at stage 3, gathers for its forward and its backward; stages 0-2 keep the
// parameters gathered for the whole step.
void add_communication(MemoryPlan& plan, const Config& config, const BufferPlan& buffers) {
  if (plan.ranks <= 1) return;
  const std::uint64_t psi = plan.params;
  const std::uint64_t param_bytes = dtype_bytes(buffers.kind(ShardKind::kParam).dtype);
  const std::uint64_t micro = std::max<std::uint32_t>(1, config.model.grad_accumulation);
  const std::uint64_t gathers = plan.stage >= 3 ? 2 * micro : 1;
  plan.micro_batches = static_cast<std::uint32_t>(micro);
  plan.comm_elements_per_rank = static_cast<double>(gathers + micro) * static_cast<double>(psi);
  // The gradients travel in [precision] reduce_dtype (fp32 or the 16-bit gradient dtype).
  plan.reduce_dtype = gradient_reduce_dtype(config.precision, config.model.grad_accumulation);
  plan.comm_bytes_per_rank =
      micro * psi * dtype_bytes(plan.reduce_dtype) + gathers * psi * param_bytes;
}

// The CUDA data path's host <-> device copies per step (pcie_traffic.hpp). The share of the
// gathered units the device keeps from one use to the next is the share of them the plan's
// gathered-unit buffer holds (1 at stages 0-2, and when the cache holds every unit).
void add_pcie_traffic(MemoryPlan& plan, const Config& config, const BufferPlan& buffers,
                      const PlanInputs& inputs, const std::vector<std::uint64_t>& unit_numels) {
  const std::uint64_t all = buffers.device_all_gathered_bytes();
  PcieInputs pcie;
  pcie.unit_numels = unit_numels;
  pcie.ranks = plan.ranks;
  pcie.micro_batches = std::max<std::uint32_t>(1, config.model.grad_accumulation);
  pcie.resident_fraction =
      all == 0 ? 1.0
               : static_cast<double>(gathered_device_bytes(plan, config, buffers, inputs)) /
                     static_cast<double>(all);
  pcie.link_bytes_per_s = inputs.pcie_bytes_per_s;
  plan.pcie = count_pcie_traffic(config, buffers, pcie);
}

MemoryPlan compute(const Config& config, const PlanInputs& inputs) {
  MemoryPlan plan;
  plan.params = inputs.params;
  plan.ranks = std::max<std::uint32_t>(1, inputs.ranks);
  plan.stage = config.zero.stage;
  // The Engine's buffer plan over the model's units (or units of the largest unit's size when only
  // Ψ is known): each kind's element type and whether the optimizer keeps it, and the working
  // buffers.
  plan.unit_elements = inputs.unit_numels.empty() ? largest_unit_elements(config, plan.params)
                                                  : *std::max_element(inputs.unit_numels.begin(),
                                                                      inputs.unit_numels.end());
  const BufferPlanInputs units = buffer_inputs(config, inputs, plan);
  const BufferPlan buffers = make_buffer_plan(config, units);
  add_state_rows(plan, config, buffers);
  // Units known: the exact state of the buffer plan replaces the ZeRO arithmetic's.
  if (!inputs.unit_numels.empty()) use_exact_state(plan, buffers);
  add_buffer_rows(plan, config, buffers, inputs);
  total_tiers(plan, config);
  add_nvme_traffic(plan, config, buffers);
  add_communication(plan, config, buffers);
  if (config.tiers.device.kind == DeviceKind::kCuda) {
    add_pcie_traffic(plan, config, buffers, inputs, units.unit_numels);
  }
  return plan;
}

Config with_home(const Config& config, StateKind kind, Tier tier) {
  Config changed = config;
  switch (kind) {
    case StateKind::kParams:
      changed.zero.params = tier;
      break;
    case StateKind::kGrads:
      changed.zero.grads = tier;
      break;
    case StateKind::kOptimizer:
      changed.zero.optimizer = tier;
      break;
  }
  return changed;
}

std::string_view budget_section(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "[tiers.device]";
    case Tier::kHost:
      return "[tiers.host]";
    case Tier::kNvme:
      return "[tiers.nvme]";
  }
  return "?";
}

// The largest power-of-two sub_group_size (below the configured one) with which the plan fits.
std::optional<std::uint64_t> fitting_sub_group(const Config& config, const PlanInputs& inputs) {
  for (std::uint64_t group = std::uint64_t{1} << 40; group >= 1024; group /= 2) {
    if (group >= config.zero.sub_group_size) continue;
    Config smaller = config;
    smaller.zero.sub_group_size = group;
    if (compute(smaller, inputs).fits()) return group;
  }
  return std::nullopt;
}

// Moving `state` from the tier that is over down to a lower tier, as the first suggestion that
// fits (streaming the optimizer from NVMe may fit only with smaller staging sub-groups).
std::optional<std::string> move_down(const Config& config, const PlanInputs& inputs,
                                     const MemoryPlan& plan, const StateRow& state, Tier over) {
  for (Tier lower : {Tier::kHost, Tier::kNvme}) {
    if (static_cast<int>(lower) <= static_cast<int>(over)) continue;
    if (lower == Tier::kNvme && state.kind == StateKind::kParams && plan.stage < 3) continue;
    if (lower == Tier::kNvme && state.kind == StateKind::kGrads && plan.stage < 2) continue;
    const Config moved = with_home(config, state.kind, lower);
    std::string extra;
    if (!compute(moved, inputs).fits()) {
      if (state.kind != StateKind::kOptimizer || lower != Tier::kNvme) continue;
      const std::optional<std::uint64_t> group = fitting_sub_group(moved, inputs);
      if (!group) continue;
      extra = fmt::format(" and sub_group_size = {}", *group);
    }
    return fmt::format("or move {} to {}: set [zero] {} = \"{}\"{}{}", to_string(state.kind),
                       to_string(lower), to_string(state.kind), to_string(lower), extra,
                       lower == Tier::kNvme && config.tiers.nvme.paths.empty()
                           ? " and list drives in [tiers.nvme] paths"
                           : "");
  }
  return std::nullopt;
}

// Per tier that is over: a larger budget, or a state homed there moved down a tier.
void suggest_budgets_and_homes(const Config& config, const PlanInputs& inputs,
                               const MemoryPlan& plan, std::vector<std::string>& out) {
  for (const TierRow& row : plan.tiers) {
    if (row.fits()) continue;
    out.push_back(fmt::format("raise {} budget to at least {} (short by {})",
                              budget_section(row.tier), format_binary_bytes(row.total_bytes()),
                              format_binary_bytes(row.short_bytes())));
    for (const StateRow& state : plan.states) {
      if (state.home != row.tier) continue;
      if (std::optional<std::string> moved = move_down(config, inputs, plan, state, row.tier)) {
        out.push_back(std::move(*moved));
      }
    }
  }
}

// The device tier over: settings that shrink the model's compute. Alternatives come in
// preference order; of one knob (its first word), the first that fits.
void suggest_smaller_compute(const Config& config, const PlanInputs& inputs,
                             std::vector<std::string>& out) {
  std::vector<std::string> offered;
  for (const PlanInputs::ComputeAlternative& alternative : inputs.compute_alternatives) {
    const std::string knob = alternative.knob.substr(0, alternative.knob.find(' '));
    if (std::find(offered.begin(), offered.end(), knob) != offered.end()) continue;
    PlanInputs smaller = inputs;
    smaller.compute_device_bytes = alternative.bytes;
    if (!compute(config, smaller).tier(Tier::kDevice).fits()) continue;
    offered.push_back(knob);
    out.push_back(fmt::format("or {}: the model's compute takes {} instead of {}",
                              alternative.knob, format_binary_bytes(alternative.bytes),
                              format_binary_bytes(inputs.compute_device_bytes)));
  }
}

// Smaller optimizer sub-groups, ZeRO stage 3, more ranks: the first count of ranks that fits.
void suggest_other_layouts(const Config& config, const PlanInputs& inputs, const MemoryPlan& plan,
                           std::vector<std::string>& out) {
  if (!plan.tier(Tier::kHost).fits() && config.zero.optimizer == Tier::kNvme) {
    if (const std::optional<std::uint64_t> group = fitting_sub_group(config, inputs)) {
      out.push_back(
          fmt::format("or stream the optimizer in smaller sub-groups: set [zero] "
                      "sub_group_size = {}",
                      *group));
    }
  }
  if (plan.stage < 3) {
    Config staged = config;
    staged.zero.stage = 3;
    if (compute(staged, inputs).fits()) {
      out.push_back("or shard everything over the ranks: set [zero] stage = 3");
    }
  }
  if (plan.stage >= 1) {
    for (std::uint64_t ranks = static_cast<std::uint64_t>(plan.ranks) * 2; ranks <= (1u << 20);
         ranks *= 2) {
      PlanInputs more = inputs;
      more.ranks = static_cast<std::uint32_t>(ranks);
      if (compute(config, more).fits()) {
        out.push_back(fmt::format("or run on {} ranks (--ranks {})", ranks, ranks));
        break;
      }
    }
  }
}

// Changes that would make the plan fit: larger budgets, state moved down a tier, a smaller
// compute, more ranks.
std::vector<std::string> suggest(const Config& config, const PlanInputs& inputs,
                                 const MemoryPlan& plan) {
  std::vector<std::string> out;
  suggest_budgets_and_homes(config, inputs, plan, out);
  if (!plan.tier(Tier::kDevice).fits()) suggest_smaller_compute(config, inputs, out);
  suggest_other_layouts(config, inputs, plan, out);
  return out;
}

}  // namespace

std::string_view to_string(StateKind kind) {
  switch (kind) {
    case StateKind::kParams:
      return "params";
    case StateKind::kGrads:
      return "grads";
    case StateKind::kOptimizer:
      return "optimizer";
  }
  return "?";
}

std::uint64_t MemoryPlan::model_state_bytes_per_rank() const {
  std::uint64_t total = 0;
  for (const StateRow& state : states) total += state.bytes_per_rank;
  return total;
}

bool MemoryPlan::fits() const {
  return std::all_of(tiers.begin(), tiers.end(), [](const TierRow& row) { return row.fits(); });
}

MemoryPlan make_memory_plan(const Config& config, const PlanInputs& inputs) {
  MemoryPlan plan = compute(config, inputs);
  if (!plan.fits()) plan.suggestions = suggest(config, inputs, plan);
  return plan;
}

MemoryPlan make_memory_plan_unsuggested(const Config& config, const PlanInputs& inputs) {
  return compute(config, inputs);
}

namespace {

// render_plan_text, one function per section of the report; each appends its lines to out.
void render_state_section(const MemoryPlan& plan, std::string& out) {
  auto line = [&out](const std::string& text) { out += text + "\n"; };
  line(fmt::format("{:<10} {:<46} {:>7} {:>8} {:>7} {:>14}", "state", "layout", "B/param",
                   "sharded", "home", "per rank"));
  for (const StateRow& state : plan.states) {
    line(fmt::format("{:<10} {:<46} {:>7.4g} {:>8} {:>7} {:>14}", to_string(state.kind),
                     state.layout,
                     state.bytes_per_param, state.sharded ? "1/N" : "no", to_string(state.home),
                     format_decimal_bytes(static_cast<double>(state.bytes_per_rank))));
  }
  line(fmt::format("model state per rank: {} ({} bytes)",
                   format_decimal_bytes(static_cast<double>(plan.model_state_bytes_per_rank())),
                   plan.model_state_bytes_per_rank()));
  if (!plan.buffers.empty()) {
    line("");
    line("working buffers:");
    for (const BufferRow& buffer : plan.buffers) {
      line(fmt::format("  {:<7} {:>12}  {}", to_string(buffer.tier),
                       format_binary_bytes(buffer.bytes), buffer.purpose));
    }
  }
}

void render_tier_section(const MemoryPlan& plan, std::string& out) {
  auto line = [&out](const std::string& text) { out += text + "\n"; };
  line("");
  line(fmt::format("{:<7} {:>12} {:>12} {:>12} {:>12}  {}", "tier", "state", "buffers", "total",
                   "budget", "status"));
  for (const TierRow& row : plan.tiers) {
    const std::string status =
        row.fits() ? fmt::format("fits ({} free)",
                                 format_binary_bytes(row.budget_bytes - row.total_bytes()))
                   : fmt::format("OVER by {}", format_binary_bytes(row.short_bytes()));
    line(fmt::format("{:<7} {:>12} {:>12} {:>12} {:>12}  {}", to_string(row.tier),
                     format_binary_bytes(row.state_bytes), format_binary_bytes(row.buffer_bytes),
                     format_binary_bytes(row.total_bytes()), format_binary_bytes(row.budget_bytes),
                     status));
  }
}

// The CUDA data path's copies per step, each direction's total and parts, and the time the
// busier direction takes at the assumed link rate.
void render_pcie_lines(const PcieTraffic& pcie, std::string& out) {
  const auto bytes = [](std::uint64_t value) {
    return format_decimal_bytes(static_cast<double>(value));
  };
  out += fmt::format("PCIe per optimizer step: h2d {}, d2h {}; at {:.4g} GB/s each way "
                     "(assumed; strata plan --pcie-gbps) that is >= {:.3g} s per step\n",
                     bytes(pcie.h2d_bytes()), bytes(pcie.d2h_bytes()), pcie.link_bytes_per_s / 1e9,
                     pcie.bound_s());
  out += fmt::format("  h2d: parameter gathers {} ({:.3g} per unit), gradient shards {}, optimizer "
                     "staging {}\n",
                     bytes(pcie.gather_h2d_bytes), pcie.gathers_per_unit,
                     bytes(pcie.grad_h2d_bytes), bytes(pcie.optimizer_h2d_bytes));
  out += fmt::format("  d2h: gradients {}, own parameter shards {}, optimizer staging {}\n",
                     bytes(pcie.grad_d2h_bytes), bytes(pcie.gather_d2h_bytes),
                     bytes(pcie.optimizer_d2h_bytes));
}

void render_traffic_section(const MemoryPlan& plan, std::string& out) {
  auto line = [&out](const std::string& text) { out += text + "\n"; };
  line("");
  line(fmt::format("NVMe per optimizer step: read {}, write {}",
                   format_decimal_bytes(static_cast<double>(plan.nvme_read_bytes_per_step)),
                   format_decimal_bytes(static_cast<double>(plan.nvme_write_bytes_per_step))));
  if (plan.pcie) render_pcie_lines(*plan.pcie, out);
  if (plan.ranks > 1) {
    line(fmt::format("communication per rank per step: {:.0f}Ψ = {:.4g} elements, {} (gradients "
                     "reduce-scattered in {}{})",
                     plan.comm_elements_per_rank / static_cast<double>(plan.params),
                     plan.comm_elements_per_rank,
                     format_decimal_bytes(static_cast<double>(plan.comm_bytes_per_rank)),
                     to_string(plan.reduce_dtype),
                     plan.micro_batches > 1
                         ? fmt::format(", once per micro-batch: {} per step", plan.micro_batches)
                         : std::string()));
  } else {
    line("communication per rank per step: none (one rank)");
  }
}

void render_verdict_section(const MemoryPlan& plan, std::string& out) {
  auto line = [&out](const std::string& text) { out += text + "\n"; };
  line("");
  if (plan.fits()) {
    line("the plan fits every tier");
  } else {
    for (const TierRow& row : plan.tiers) {
      if (!row.fits()) {
        line(fmt::format("does not fit: the {} tier is short by {}", to_string(row.tier),
                         format_binary_bytes(row.short_bytes())));
      }
    }
    for (const std::string& suggestion : plan.suggestions) line("  " + suggestion);
  }
}

}  // namespace

std::string render_plan_text(const MemoryPlan& plan, const Config& config) {
  std::string out;
  auto line = [&out](const std::string& text) { out += text + "\n"; };
  line(fmt::format("strata plan: {}", config.source));
  line(fmt::format("model: {} parameters ({:.3g}), {} rank{}, ZeRO stage {}, optimizer {}",
                   plan.params, static_cast<double>(plan.params), plan.ranks,
                   plan.ranks == 1 ? "" : "s", plan.stage, to_string(config.optimizer.type)));
  line("");
  render_state_section(plan, out);
  render_tier_section(plan, out);
  render_traffic_section(plan, out);
  render_verdict_section(plan, out);
  return out;
}

nlohmann::json plan_to_json(const MemoryPlan& plan, const Config& config) {
  nlohmann::json out;
  out["config"] = config.source;
  out["params"] = plan.params;
  out["ranks"] = plan.ranks;
  out["stage"] = plan.stage;
  out["unit_elements"] = plan.unit_elements;
  out["model_state_bytes_per_rank"] = plan.model_state_bytes_per_rank();
  for (const StateRow& state : plan.states) {
    out["states"].push_back({{"kind", to_string(state.kind)},
                             {"layout", state.layout},
                             {"bytes_per_param", state.bytes_per_param},
                             {"sharded", state.sharded},
                             {"home", to_string(state.home)},
                             {"elements_per_rank", state.elements_per_rank},
                             {"bytes_per_rank", state.bytes_per_rank},
                             {"host_bytes_per_rank", state.host_bytes_per_rank},
                             {"device_bytes_per_rank", state.device_bytes_per_rank}});
  }
  out["buffers"] = nlohmann::json::array();
  for (const BufferRow& buffer : plan.buffers) {
    out["buffers"].push_back(
        {{"purpose", buffer.purpose}, {"tier", to_string(buffer.tier)}, {"bytes", buffer.bytes}});
  }
  for (const TierRow& row : plan.tiers) {
    out["tiers"][std::string(to_string(row.tier))] = {{"state_bytes", row.state_bytes},
                                                      {"buffer_bytes", row.buffer_bytes},
                                                      {"total_bytes", row.total_bytes()},
                                                      {"budget_bytes", row.budget_bytes},
                                                      {"fits", row.fits()},
                                                      {"short_bytes", row.short_bytes()}};
  }
  out["nvme_read_bytes_per_step"] = plan.nvme_read_bytes_per_step;
  out["nvme_write_bytes_per_step"] = plan.nvme_write_bytes_per_step;
  out["comm_elements_per_rank"] = plan.comm_elements_per_rank;
  out["comm_bytes_per_rank"] = plan.comm_bytes_per_rank;
  out["reduce_dtype"] = to_string(plan.reduce_dtype);
  if (plan.pcie) {  // the CUDA data path only
    const PcieTraffic& pcie = *plan.pcie;
    out["pcie"] = {{"h2d_bytes_per_step", pcie.h2d_bytes()},
                   {"d2h_bytes_per_step", pcie.d2h_bytes()},
                   {"gather_h2d_bytes", pcie.gather_h2d_bytes},
                   {"grad_h2d_bytes", pcie.grad_h2d_bytes},
                   {"optimizer_h2d_bytes", pcie.optimizer_h2d_bytes},
                   {"gather_d2h_bytes", pcie.gather_d2h_bytes},
                   {"grad_d2h_bytes", pcie.grad_d2h_bytes},
                   {"optimizer_d2h_bytes", pcie.optimizer_d2h_bytes},
                   {"gathers_per_unit", pcie.gathers_per_unit},
                   {"link_bytes_per_s", pcie.link_bytes_per_s},
                   {"bound_s", pcie.bound_s()}};
  }
  out["fits"] = plan.fits();
  out["suggestions"] = plan.suggestions;
  return out;
}

}  // namespace strata::runtime
