// Engine: the public API a training loop calls. ZeRO-3 over a Communicator, with each state kind
// (16-bit parameters, gradients, fp32 master weights and optimizer moments) homed on the tier the
// config gives it: the device, pinned host memory, or the crash-safe NVMe store.
//
//   Engine engine(config, device, comm);
//   UnitId block = engine.add_unit({"h.0", {{"attn.w", {d, 3 * d}, TensorInit::normal(0.02f)}}});
//   engine.finalize();                          // partition, place, initialise (or resume)
//   for each step:
//     for each micro-batch:
//       forward:  { auto unit = engine.gather(block); model.forward(unit.tensor(0), ...); }
//       backward: { auto unit = engine.gather(block); ...; engine.reduce_grads(block, grads); }
//     StepStats stats = engine.step();
//
// Offloading changes where bytes live, never the mathematics: for a fixed config, seed and rank
// count, parameters, optimizer state and losses are bitwise the same for every tier placement,
// prefetch depth, buffer count and thread count.
//
// Threading: one thread owns the Engine and calls everything; the Engine runs I/O on io/'s
// threads and Adam on its own oneTBB arena.
//
// Contracts of step(), checked (std::logic_error naming the unit): every GatheredUnit has been
// destroyed (a live one would keep viewing the weights from before the update), and every unit got
// exactly grad_accumulation reduce_grads calls since the previous step (none would update it with
// a stale gradient; fewer would leave it out of the clip norm).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "runtime/config/config.hpp"
#include "runtime/engine/trace.hpp"
#include "runtime/config/unit_hyperparams.hpp"
#include "runtime/engine/unit_spec.hpp"
#include "tiers/device/compute_fence.hpp"

namespace strata::tiers {
class Device;
}
namespace strata::io {
class FaultInjector;
}
namespace strata::runtime::comm {
class Communicator;
}

namespace strata::runtime {

using UnitId = std::uint32_t;
class Engine;

namespace detail {
class EngineState;
}

struct EngineOptions {
  // Resume from the NVMe store's committed step (state homed on NVMe), instead of starting afresh.
  bool resume = false;
  // Start afresh even over a store that holds a committed step (that state is lost). With neither
  // resume nor overwrite, [tiers.nvme] on_existing decides (default: refuse with
  // CommittedStoreExists, runtime/checkpoint/checkpoint.hpp). Both set is an error.
  bool overwrite = false;
  // Micro-batches per optimizer step: gradients are summed in fp32 over this many reduce_grads
  // calls per unit (scale the loss by 1 / grad_accumulation for an average).
  std::uint32_t grad_accumulation = 1;
  // Benchmarks only (`strata bench step`): kSkip moves every byte of the optimizer step but does
  // no arithmetic, to time the I/O pipeline alone.
  enum class OptimizerCompute : std::uint8_t { kRun, kSkip };
  OptimizerCompute optimizer_compute = OptimizerCompute::kRun;
  // When set, the Engine records its work (gathers, gradient moves, NVMe waits, optimizer
  // sub-groups) on this timeline; it must outlive the Engine.
  Tracer* tracer = nullptr;
  // How the Engine reaches device memory. kAuto: directly (memcpy, CPU loops, collectives in
  // place) when the device's memory is host memory (the host device), else through the device's
  // streams and events, with collectives staged through pinned host buffers unless the
  // Communicator takes device memory (NcclComm). kStaged (tests only): the staged path on any
  // device, so the host device runs exactly the code CUDA runs; results are bitwise the same.
  enum class DeviceAccess : std::uint8_t { kAuto, kStaged };
  DeviceAccess device_access = DeviceAccess::kAuto;
  // Several ranks, device memory the CPU addresses: a prefetched unit whose shard is in host or
  // device memory starts its all-gather at its load (Communicator::start_all_gather), so it runs
  // under the compute of the units before it. false (tests, to compare): every all-gather runs
  // when its unit is needed, as it does for shards read from NVMe and on backends without
  // pending gathers.
  bool gathers_ahead_across_ranks = true;
  // Tests only: injects I/O faults into the NVMe store's I/O engine (io/fault_injector.hpp).
  io::FaultInjector* faults = nullptr;
};

// The optimizer-state arrays of a shard that state_shard reads.
enum class OptimizerState : std::uint8_t { kMaster, kExpAvg, kExpAvgSq };
// "master", "exp_avg", "exp_avg_sq" (the names checkpoints use).
std::string_view to_string(OptimizerState state);

struct TierTraffic {
  std::uint64_t read_bytes = 0;
  std::uint64_t written_bytes = 0;
};

struct StepStats {
  std::uint64_t step = 0;    // the step just taken (1-based); unchanged when skipped
  double grad_norm = 0;      // global L2 norm of the (unscaled) gradients
  double lr = 0;             // learning rate of the update (skipped: the one it would have used)
  bool skipped = false;      // non-finite gradients: no update (fp16 overflow)
  double loss_scale = 1;     // the loss scale in force for the next step
  TierTraffic nvme;          // since the previous step (the backward's gradient writes included)
  TierTraffic nvme_in_step;  // within step() alone (not the updates run during the backward)
  double io_wait_s = 0;      // time blocked on NVMe during the optimizer step and gathers
  double adam_s = 0;         // time in the CPU optimizer
  double step_s = 0;         // wall time of step()
  std::uint64_t comm_bytes = 0;  // payload bytes of collectives since the previous step
  // [zero] overlap_optimizer: parameter bytes the step handed to the next iteration's first
  // gathers, NVMe reads of what it had just written saved (units it updated itself).
  std::uint64_t fresh_param_bytes = 0;
  // [zero] overlap_optimizer (runtime/engine/speculation.hpp): sub-groups updated during the backward,
  // of which the step confirmed these and undid and updated again (or, skipped, undid) these.
  std::uint64_t speculated_groups = 0;
  std::uint64_t confirmed_groups = 0;
  std::uint64_t redone_groups = 0;
  // [zero] defer_update (runtime/engine/deferred_update.cpp): sub-groups whose update this step left to
  // the next forward's gathers (its commit follows the last of them).
  std::uint64_t deferred_groups = 0;
  // The last step's deferred updates as the model met them since: seconds the Engine's thread
  // waited for one (a gather of a unit whose update was still running, the completion before
  // this step or a gradient). The exposed part of the deferred optimizer; zero when the next
  // forward's compute hid them.
  double deferred_wait_s = 0;
  // A step that did not speculate: sub-groups whose master and moments were read from NVMe during
  // the backward, before step() was called (the pipeline's first buffer_count - 1), so its first
  // update waits only for the gradient. With defer_update: the reads it handed to the updates it
  // deferred (the next forward's first).
  std::uint64_t pre_read_groups = 0;
  // Gathers since the previous step started before their unit was used (a prefetch), so they
  // ran under the compute of the units before it: with one rank on the staged device path (a
  // CUDA device), the h2d copy and cast queued on the device streams; with several ranks on the
  // host device, the all-gather of a shard in memory (EngineOptions::gathers_ahead_across_ranks).
  std::uint64_t gathers_queued_ahead = 0;
  // The staged device path, gradients homed in host memory or on NVMe: reduce_grads calls since
  // the previous step that returned with their gradient's copy to the host still queued on the
  // d2h stream (its reduce-scatter, store and norm ran at the next call, or in step()).
  std::uint64_t grad_moves_queued = 0;
  // The staged device path with master, moments, gradients and parameters all homed on the
  // device ([zero] optimizer = grads = params = "device"): sub-groups the device's own optimizer
  // op updated in place, none of their bytes staged through host memory.
  std::uint64_t device_updated_groups = 0;
};

// The full tensors of one unit, gathered for compute. Views are fp32 in device memory (host memory
// on the host device; CUDA device pointers on a CudaDevice), complete when gather() returns.
// Destroying the handle releases the unit (it may stay cached).
class GatheredUnit {
 public:
  GatheredUnit(GatheredUnit&& other) noexcept;
  GatheredUnit& operator=(GatheredUnit&& other) noexcept;
  GatheredUnit(const GatheredUnit&) = delete;
  GatheredUnit& operator=(const GatheredUnit&) = delete;
  ~GatheredUnit();

  // Empty for a tensor registered with fp32_view = false under 16-bit parameters.
  std::span<const float> tensor(std::size_t index) const;
  std::span<const float> tensor(std::string_view name) const;
  std::size_t tensor_count() const;
  UnitId unit() const { return unit_; }
  // With [precision] params = "bf16": the gathered bf16 parameters themselves, which the fp32
  // views above are widened from (the same values): a model that computes in bf16 reads them
  // instead of rounding the fp32 views again. Empty with other parameter dtypes.
  std::span<const std::uint16_t> tensor_bf16(std::size_t index) const;

 private:
  friend class Engine;
  GatheredUnit(Engine* engine, UnitId unit, const float* data, const std::uint16_t* bf16)
      : engine_(engine), unit_(unit), data_(data), bf16_(bf16) {}
  Engine* engine_ = nullptr;
  UnitId unit_ = 0;
  const float* data_ = nullptr;
  const std::uint16_t* bf16_ = nullptr;  // null unless the parameters are bf16
};

class Engine {
 public:
  Engine(const Config& config, tiers::Device& device, comm::Communicator& comm,
         const EngineOptions& options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  UnitId add_unit(UnitSpec spec);
  // Partitions every unit, allocates each state kind on its home tier (budgets checked first),
  // and initialises it (or resumes it from the NVMe store).
  void finalize();

  GatheredUnit gather(UnitId unit);
  // The compute that reads gathered units may still run when their handles are released (a
  // model whose unit calls return once queued, the CUDA decoder's asynchronous calls): the Engine
  // takes a ticket from `fence` at each release and waits on it before it frees that unit's
  // buffers. Set before the first gather; the fence outlives the Engine, or is reset here to
  // nullptr (the default: a released unit's compute is done) once its compute is waited for.
  void set_compute_fence(tiers::ComputeFence* fence);
  // `full_grads`: the unit's gradient, numel fp32 values in tensor order, in device memory
  // (a CUDA device pointer on a CudaDevice), complete when called; it may be reused on return.
  // Reduce-scatters it (average over ranks) into this rank's gradient shard on its home tier,
  // summed in fp32 over the micro-batches of the step.
  void reduce_grads(UnitId unit, std::span<const float> full_grads);
  StepStats step();
  // Benchmarks only: switch the optimizer's arithmetic off (kSkip) or on between steps.
  void set_optimizer_compute(EngineOptions::OptimizerCompute compute);
  // Replaces [optimizer] lr from the next step on, between steps (for callers that schedule the
  // rate themselves, e.g. PyTorch's LR schedulers); the config's warm-up and decay still apply on
  // top. Throws std::invalid_argument for a negative or non-finite rate, or one below min_lr
  // under a decaying schedule (validate_peak_lr: the rule a unit's lr override follows too).
  void set_learning_rate(double lr);
  // Replaces the unit's optimizer overrides (lr, weight decay, betas, eps; unset fields take the
  // config's value) from the next step on; before or after finalize(), between steps. The rules
  // (the schedule scales a unit's lr as it scales the global one; weight decay only on tensors
  // that ask for it; not saved in checkpoints) are in runtime/config/unit_hyperparams.hpp. Throws
  // std::invalid_argument naming the unit and field for an out-of-range value, std::out_of_range
  // for an unknown unit. Without overrides a unit's update is bitwise what it was.
  void set_unit_hyperparams(UnitId unit, const UnitHyperparams& hyper);
  const UnitHyperparams& unit_hyperparams(UnitId unit) const;

  // Replaces the unit's weights (fine-tuning from a checkpoint): `full_values` is the whole unit
  // (numel fp32 values in tensor order); this rank keeps its shard of master weights and 16-bit
  // parameters, and its optimizer moments restart from zero. Call after finalize(), before
  // training; the NVMe store commits it with the next step.
  void set_master(UnitId unit, std::span<const float> full_values);
  // This rank's fp32 master shard of `unit` (real elements only), read from wherever it lives.
  std::vector<float> master_shard(UnitId unit);
  // One optimizer-state array of this rank's shard (real elements only); std::invalid_argument
  // when the optimizer keeps no such array (Adagrad has no exp_avg, Lion no exp_avg_sq).
  std::vector<float> state_shard(UnitId unit, OptimizerState state);
  // The whole unit's fp32 master weights, gathered from every rank (for export and tests).
  std::vector<float> gather_master(UnitId unit);

  // Checkpoints (runtime/checkpoint/checkpoint.hpp, docs/reliability.md), after finalize and between steps.
  // Collective: every rank calls them with a directory every rank sees. save() is atomic; load()
  // reshards to this run's rank count and restores the step and the loss scale.
  void save(const std::filesystem::path& dir);
  void load(const std::filesystem::path& dir);
  // One safetensors file of the full fp32 master weights (written as `dtype`), tensors named
  // "<unit>.<tensor>"; import sets master and parameters from one, moments zero, step 0.
  void export_safetensors(const std::filesystem::path& file, DType dtype = DType::kFp32);
  void import_safetensors(const std::filesystem::path& file);

  std::uint64_t step_count() const;
  // The loss scale to multiply the next step's loss by (1 unless fp16; restored by load()).
  double loss_scale() const;
  std::size_t unit_count() const;
  const UnitSpec& unit_spec(UnitId unit) const;
  std::uint64_t unit_numel(UnitId unit) const;
  const Config& config() const;
  // High-water marks of the tiers' budgets (bytes), for memory tests and reports.
  std::uint64_t device_high_water_bytes() const;
  std::uint64_t host_high_water_bytes() const;
  // High-water mark of the host staging save / load / export / import stream through, outside the
  // host budget (bytes): a few sub-groups' worth, never O(model) (docs/reliability.md).
  std::uint64_t stream_staging_high_water_bytes() const;
  // Where the host pool's memory comes from, after finalize ([tiers.host] pinned): "cudaHostRegister"
  // or "mmap" (page-locked when the process may), or "mmap (pageable)" with pinned = false.
  std::string_view host_allocator_name() const;
  // Where each state kind lives, one line, for logs: "params device, grads host, optimizer nvme".
  std::string placement_summary() const;

 private:
  friend class GatheredUnit;
  void release(UnitId unit);
  std::unique_ptr<detail::EngineState> state_;
};

}  // namespace strata::runtime
