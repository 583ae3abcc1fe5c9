// The per-rank memory plan: bytes per state kind per tier, working buffers, totals against the
// budgets, NVMe traffic, PCIe traffic (a CUDA device) and communication volume per optimizer
// step. Computed before anything is allocated (`strata plan`). The state rows follow the ZeRO
// paper's arithmetic (stage 1 shards optimizer state, stage 2 also gradients, stage 3 also
// parameters); the working buffers are the Engine's own buffer plan (runtime/plan/buffer_plan.hpp),
// so what is printed is what it allocates.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "runtime/config/config.hpp"
#include "runtime/plan/pcie_traffic.hpp"

namespace strata::runtime {

struct PlanInputs {
  PlanInputs() = default;
  PlanInputs(std::uint64_t params_in, std::uint32_t ranks_in,
             std::vector<std::uint64_t> unit_numels_in = {})
      : params(params_in), ranks(ranks_in), unit_numels(std::move(unit_numels_in)) {}

  std::uint64_t params = 0;  // Ψ, the model's parameter count
  std::uint32_t ranks = 1;   // N, data-parallel ranks
  // The model's units (real elements of each, in order), when known. The plan is then exact: state
  // in padded shards, the gathered units the Engine keeps (every unit, as far as the device budget
  // allows: the residency manager caches them), and tier totals equal to the Engine's high-water
  // marks. Empty: Ψ cut into units of the largest unit's size (estimated from [model]), state as
  // the ZeRO paper counts it, and at stage 3 only the working set of prefetch_depth + 1 units.
  std::vector<std::uint64_t> unit_numels;
  // With unit_numels and bf16 parameters: each unit's fp32 view as the Engine packs it (a model
  // that reads some tensors only in bf16: runtime::pack_fp32_views). Empty: whole units.
  std::vector<std::uint64_t> unit_fp32_view_numels;

  // Device memory the model's own compute takes (a micro-batch's activations, gradients and
  // workspaces, allocated before the Engine), when the model computes in the device tier's
  // memory (a CUDA device); 0 otherwise. The plan charges the device tier for it, and the
  // gathered units the residency manager caches get only what remains.
  std::uint64_t compute_device_bytes = 0;
  std::string compute_description;  // what those bytes are, for the plan's row
  // Settings that shrink the compute, offered when the device tier does not fit: the knob
  // ("--activation-checkpointing") and the compute bytes it would leave.
  struct ComputeAlternative {
    std::string knob;
    std::uint64_t bytes = 0;
  };
  std::vector<ComputeAlternative> compute_alternatives;

  // The PCIe link rate each way the plan's bound assumes (a CUDA device; `strata plan
  // --pcie-gbps`), in bytes per second.
  double pcie_bytes_per_s = kAssumedPcieBytesPerS;
};

enum class StateKind { kParams, kGrads, kOptimizer };
std::string_view to_string(StateKind kind);

struct StateRow {
  StateKind kind;
  std::string layout;  // e.g. "bf16" or "fp32 master + fp32 exp_avg + fp32 exp_avg_sq"
  double bytes_per_param;  // per parameter of the full model (int8 moments: with their scales)
  bool sharded;                   // divided over the ranks at this ZeRO stage
  Tier home;
  std::uint64_t elements_per_rank;
  std::uint64_t bytes_per_rank;
  // Of bytes_per_rank, kept in host memory by the kind's [zero] *_host_fraction (kind homed on
  // NVMe only): whole units, as the Engine splits them.
  std::uint64_t host_bytes_per_rank = 0;
  // Of bytes_per_rank, kept in device memory by [zero] optimizer_device_fraction (the optimizer
  // row only).
  std::uint64_t device_bytes_per_rank = 0;
};

struct BufferRow {
  std::string purpose;  // what the working buffer holds
  Tier tier;
  std::uint64_t bytes;
};

struct TierRow {
  Tier tier;
  std::uint64_t state_bytes = 0;
  std::uint64_t buffer_bytes = 0;
  std::uint64_t budget_bytes = 0;
  std::uint64_t total_bytes() const { return state_bytes + buffer_bytes; }
  bool fits() const { return total_bytes() <= budget_bytes; }
  std::uint64_t short_bytes() const { return fits() ? 0 : total_bytes() - budget_bytes; }
};

// NVMe bytes one state kind moves in one optimizer step (forward, backward and step).
struct NvmeTraffic {
  std::uint64_t read_bytes = 0;
  std::uint64_t write_bytes = 0;
};

struct MemoryPlan {
  std::uint64_t params = 0;
  std::uint32_t ranks = 1;
  std::uint32_t stage = 3;
  std::uint64_t unit_elements = 0;  // largest unit gathered at once (stage 3 working set)
  std::vector<StateRow> states;
  std::vector<BufferRow> buffers;
  std::array<TierRow, 3> tiers{};  // indexed by Tier
  std::uint64_t nvme_read_bytes_per_step = 0;
  std::uint64_t nvme_write_bytes_per_step = 0;
  std::array<NvmeTraffic, 3> nvme_traffic{};  // the two totals above per StateKind
  // Per step of `micro_batches` micro-batches: (1 + m)Ψ at stages 0-2 (one gather, a
  // reduce-scatter per micro-batch), 3mΨ at stage 3 (2Ψ at m = 1 and 3Ψ); 0 for one rank.
  double comm_elements_per_rank = 0;
  std::uint64_t comm_bytes_per_rank = 0;
  std::uint32_t micro_batches = 1;  // [model] grad_accumulation
  DType reduce_dtype = DType::kFp32;  // the gradient reduce-scatter's ([precision] reduce_dtype)
  // Host <-> device copies per step on the CUDA data path ([tiers.device] kind "cuda"); none on
  // the host device, whose memory is host memory.
  std::optional<PcieTraffic> pcie;
  std::vector<std::string> suggestions;  // when it does not fit: changes that would

  std::uint64_t model_state_bytes_per_rank() const;  // the seeds' "GB per GPU"
  const TierRow& tier(Tier t) const { return tiers[static_cast<std::size_t>(t)]; }
  const NvmeTraffic& traffic(StateKind k) const {
    return nvme_traffic[static_cast<std::size_t>(k)];
  }
  bool fits() const;
};

MemoryPlan make_memory_plan(const Config& config, const PlanInputs& inputs);
// The same plan without the suggestions (which search many other plans when it does not fit):
// for callers that search placements themselves (`strata tune`).
MemoryPlan make_memory_plan_unsuggested(const Config& config, const PlanInputs& inputs);

std::string render_plan_text(const MemoryPlan& plan, const Config& config);
nlohmann::json plan_to_json(const MemoryPlan& plan, const Config& config);

}  // namespace strata::runtime
