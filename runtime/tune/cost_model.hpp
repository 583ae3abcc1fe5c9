// The cost model of one training step: bytes per tier per step (runtime/plan/memory_plan.hpp, the same
// arithmetic `strata plan` prints) over the bandwidths a MachineProfile measured, plus CPU Adam
// time and a compute estimate. Pure arithmetic: same inputs, same prediction.
//
//   forward + backward = max(compute, NVMe parameter reads and gradient writes + host<->device
//                            copies)             (prefetch_depth 0: their sum, nothing overlaps)
//   optimizer          = max(t_io, t_adam) + min(t_io, t_adam) / sub-groups
//                        + sub-groups x t_sub_group + t_commit
//                                                 (buffer_count 2: t_io + t_adam, no read ahead)
//   step               = forward + backward + optimizer
//
// t_io moves the optimizer phase's NVMe bytes at the mixed (read + write) bandwidth (times the
// profile's engine_io_scale, calibrated on the Engine's own step), slowed when
// the sub-groups in flight (buffer_count - 1 of them) hold fewer bytes than the engine's queues
// (block x depth x rings): then the rate measured at the depth those bytes amount to applies. The
// store's checksum thread hashes every byte read and written alongside: a lane of its own, so an
// NVMe phase takes at least its bytes over the measured XXH3 rate. t_commit is the fsync that
// makes the step durable ([tiers.nvme] fsync): every byte the step wrote over the measured flush
// rate (flush_mb_per_s). t_sub_group is what each streamed sub-group costs beyond its bytes
// (thread hand-offs), calibrated on the Engine by `strata tune` (MachineProfile). t_adam is the
// optimizer elements over the measured rate of the update the config runs: cpu_adam::step for
// fp32 state, cpu_adam::step_compressed in the config's formats otherwise (AdamUpdate); the NVMe
// bytes are the plan's, in those formats.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/config/config.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/tune/machine_profile.hpp"

namespace strata::runtime::tune {

struct StepPrediction {
  MemoryPlan plan;
  double nvme_forward_backward_s = 0;  // parameter reads (two gathers) and gradient writes
  double transfer_s = 0;               // host <-> device copies of shards not homed on the device
  double compute_s = 0;                // 6 Ψ tokens / compute_flops; 0 when not modelled
  double forward_backward_s = 0;
  double nvme_optimizer_s = 0;  // the optimizer phase's reads and writes
  double checksum_s = 0;        // the checksum thread's hashing of those bytes
  double commit_s = 0;          // the fsync of the step's writes before the manifest names them
  double overhead_s = 0;        // sub-groups x the profile's calibrated sub_group_overhead_s
  double adam_s = 0;
  double optimizer_s = 0;
  std::uint64_t sub_groups = 0;  // per step, over every unit
  double io_fill = 1;            // fraction of the engine's queues a sub-group's I/O fills
  double step_s = 0;
};

// The measured point nearest the config's (block_size, queue_depth, rings), by log2 distance.
// The profile must hold at least one point.
const IoPoint& nearest_io_point(const MachineProfile& profile, const NvmeTierConfig& nvme);

// The drives' flush rate: the median over the measured points (the fsync's cost is the drive's,
// not the queue depth's, so every point is a sample of it); 0 when none was measured.
double flush_mb_per_s(const MachineProfile& profile);

// The update the Engine runs for `config`'s [optimizer] master_dtype and state_dtype.
AdamUpdate adam_update(const Config& config);

// "cpu_adam::step (fp32 master and moments)" or "cpu_adam::step_compressed (bf16 master, int8
// moments)": which update a rate belongs to, for the printed tables.
std::string describe_adam_update(const AdamUpdate& update);

// Adam rate of `update` at `threads` (0: every hardware thread, the best measured); the nearest
// thread count measured otherwise. Only points of `update` count: 0 when the profile holds none
// (the rate of another update would misprice the step; predict_step then predicts no finite time).
double adam_params_per_s(const MachineProfile& profile, std::uint32_t threads,
                         const AdamUpdate& update);

StepPrediction predict_step(const Config& config, const PlanInputs& inputs,
                            const MachineProfile& profile);

// The MachineProfile::engine_io_scale at which predict_step gives `config` over `inputs` an
// optimizer phase of `optimizer_s` (bisection in log space over [1/8, 8]), every other figure of
// `profile` as it is. The scale multiplies every rate the optimizer's NVMe term uses, the one
// interpolated at a shallow in-flight depth included. at_bound: no scale in that range predicts
// `optimizer_s` (the other terms alone exceed it, or even 1/8 of the rates predicts less); the
// bound returned is the nearest.
struct EngineIoFit {
  double scale = 1;
  bool at_bound = false;
};
EngineIoFit fit_engine_io_scale(const Config& config, const PlanInputs& inputs,
                                MachineProfile profile, double optimizer_s);

}  // namespace strata::runtime::tune
