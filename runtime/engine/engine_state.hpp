// The Engine's private state and the stages of its data path. Not a public header.
//
// One EngineState per Engine. Its member functions live in one file per stage, in data-path order:
//   engine_setup.cpp     construction (data path, debug knobs, element types), teardown, the
//                        narrow API that checkpoint.cpp and the Engine facade use
//   engine_finalize.cpp  finalize: plan -> check budgets -> allocate -> open or resume -> residency
//   shard_io.cpp         moving a sub-group of a shard in and out of its home (ShardHome); whole
//                        shards in fp32 (read_shard_fp32, write_shard)
//   gather.cpp           the ResidencyClient: units gathered on the device for compute
//   reduce_grads.cpp     gradients reduce-scattered into their home; the contracts of step()
//   optimizer_step.cpp   the pipelined optimizer step
//   speculation.cpp      the optimizer during the backward: updates started by reduce_grads,
//                        confirmed or undone by step() (runtime/engine/speculation.hpp)
//   device_lanes.cpp     the staged path to device memory: streams, events, pinned staging
// checkpoint.cpp (save, load, export, import) sees only the public part of EngineState.
//
// The private state is grouped by the stage that changes it; another stage may read it.
// Threading: one thread owns the Engine and calls everything, except the speculative updates,
// which run on the UpdateWorker's thread during the backward: the NVMe store is then reached
// under store_mutex_, and the units being updated are not touched by the owner until step()
// or an undo has waited for them.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <mutex>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <tbb/task_arena.h>

#include "base/debug_knobs.hpp"
#include "base/dtype.hpp"
#include "cpu_adam/typed_span.hpp"
#include "cpu_adam/grad_norm.hpp"
#include "cpu_adam/compressed_step.hpp"
#include "cpu_adam/optimizer.hpp"
#include "io/engine.hpp"
#include "runtime/plan/buffer_plan.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/gather_ahead.hpp"
#include "runtime/engine/gathered_copy.hpp"
#include "runtime/engine/grad_moves.hpp"
#include "runtime/plan/partition.hpp"
#include "runtime/engine/shard_home.hpp"
#include "runtime/engine/speculation.hpp"
#include "runtime/engine/stream_staging.hpp"
#include "tiers/device/device.hpp"
#include "tiers/nvme_store.hpp"
#include "tiers/pinned_pool.hpp"
#include "tiers/residency.hpp"

namespace strata::runtime::detail {

// A unit's deferred update ([zero] defer_update; deferred_update.cpp).
enum class DeferredState : std::uint8_t { kNone, kDue, kRunning, kFailed };

// What an optimizer update reads and what it writes, per sub-group.
inline constexpr std::array<Kind, 5> kUpdateReadKinds = {
    Kind::kMaster, Kind::kCompensation, Kind::kExpAvg, Kind::kExpAvgSq, Kind::kGrad};
inline constexpr std::array<Kind, 5> kUpdateWriteKinds = {
    Kind::kMaster, Kind::kCompensation, Kind::kExpAvg, Kind::kExpAvgSq, Kind::kParam};

struct UnitState {
  UnitSpec spec;
  UnitLayout layout;
  Fp32ViewPacking fp32_views;  // where each tensor lies in the gathered fp32 view (widens())
  std::vector<SubGroup> groups;
  std::array<std::optional<ShardHome>, kKindCount> homes;
  // KindPlacement::in_master: the parameters are read from the master's home (home(kParam) is
  // it), while has(kParam) is false, so nothing writes parameters of their own.
  bool params_in_master = false;
  std::uint32_t grad_calls = 0;  // reduce_grads calls since the last step (reduce_grads.cpp)
  UnitHyperparams hyper;         // optimizer overrides (set_unit_hyperparams; optimizer_step.cpp)
  GatheredCopy gathered;

  ShardHome& home(Kind kind) { return *homes[home_index(kind)]; }
  const ShardHome& home(Kind kind) const { return *homes[home_index(kind)]; }
  bool has(Kind kind) const { return homes[static_cast<std::size_t>(kind)].has_value(); }

 private:
  std::size_t home_index(Kind kind) const {
    return static_cast<std::size_t>(kind == Kind::kParam && params_in_master ? Kind::kMaster
                                                                             : kind);
  }
};

// The streams and events of the staged data path (device memory not addressable by the CPU): one
// stream per direction of copy and one for kernels, each with an event the host or another
// stream waits on. Each set is used by one thread: lanes_ by the Engine's, update_lanes_ by the
// update worker's.
struct DeviceLanes {
  explicit DeviceLanes(tiers::Device& device);
  tiers::Stream h2d;
  tiers::Stream d2h;
  tiers::Stream compute;
  tiers::Event h2d_done;
  tiers::Event d2h_done;
  tiers::Event compute_done;
  // The optimizer's two staging slots: d2h into a slot done / h2d out of it done.
  std::array<tiers::Event, 2> staged_in;
  std::array<tiers::Event, 2> staged_out;
  // A gradient's d2h copy into grad_moves_.slot(slot) done (reduce_grads.cpp).
  std::array<tiers::Event, 2> grad_moved;
};

// The step counter and loss-scale state: advanced by the optimizer step, replaced by checkpoint
// load and safetensors import.
struct TrainingProgress {
  std::uint64_t step = 0;
  double loss_scale = 1.0;
  std::uint32_t clean_steps = 0;  // steps since the loss scale last changed (fp16)
};

class EngineState final : public tiers::ResidencyClient {
 public:
  EngineState(const Config& config, tiers::Device& device, comm::Communicator& comm,
              const EngineOptions& options);
  ~EngineState() override;

  // The Engine facade (engine.cpp) -------------------------------------------------------------
  UnitId add_unit(UnitSpec spec);
  void finalize();
  const float* gather(UnitId unit);  // the unit's fp32 view; a GatheredUnit holds it
  // The gathered unit's bf16 parameters (after gather(), while it is held); null unless the
  // parameter dtype is bf16.
  const std::uint16_t* gathered_bf16(UnitId unit) const;
  void release(UnitId unit);
  void set_compute_fence(tiers::ComputeFence* fence);
  DType param_dtype() const { return plan_.kind(Kind::kParam).dtype; }
  // Whether the gathered unit's fp32 view holds `tensor`: unless it asks for none
  // (TensorSpec::fp32_view) and has a bf16 view to be read from instead.
  bool widens(const TensorSpec& tensor) const {
    return tensor.fp32_view || param_dtype() != DType::kBf16;
  }
  void reduce_grads(UnitId unit, std::span<const float> full_grads);
  void optimizer_step(StepStats& stats);
  void set_optimizer_compute(EngineOptions::OptimizerCompute compute);
  void set_learning_rate(double lr) { config_.optimizer.lr = lr; }
  void set_unit_hyperparams(UnitId unit, const UnitHyperparams& hyper);
  void set_master(UnitId unit, std::span<const float> full_values);
  std::uint64_t device_high_water_bytes() const;
  std::uint64_t host_high_water_bytes() const;
  std::uint64_t stream_staging_high_water_bytes() const { return staging_meter_.high_water_bytes(); }
  std::string_view host_allocator_name() const;

  // What checkpoints and the facade use (engine_setup.cpp; the shard reads and writes are
  // shard_io.cpp's, gather_master gather.cpp's, all_gather_host device_lanes.cpp's) -------------
  const Config& config() const { return config_; }
  const BufferPlan& plan() const { return plan_; }
  comm::Communicator& comm() const { return *comm_; }
  std::uint32_t rank() const { return rank_; }
  std::uint32_t ranks() const { return ranks_; }
  bool finalized() const { return finalized_; }
  std::span<const UnitState> units() const { return units_; }
  const UnitState& unit(UnitId id) const;  // throws std::out_of_range naming the id
  TrainingProgress progress() const { return progress_; }
  // This rank's shard of `kind` (shard_numel values, padding included) in fp32.
  std::vector<float> read_shard_fp32(UnitId unit, Kind kind);
  // Sub-group `group` of this rank's shard of `kind` in fp32 (out: the sub-group's numel values),
  // through the staging free outside the step: what streaming checkpoints use, no allocation.
  void read_group_fp32(UnitId unit, Kind kind, std::size_t group, std::span<float> out);
  // The largest sub-group of any unit (elements): what one StreamStaging of a sub-group holds.
  std::uint64_t largest_group_numel() const;
  // What checkpoint streaming draws its staging from (stream_staging.hpp).
  StagingMeter& staging_meter() { return staging_meter_; }
  // The whole unit's fp32 master weights (numel values), gathered from every rank. Collective.
  std::vector<float> gather_master(UnitId unit);
  // A collective on host buffers over any backend (staged through device memory for NcclComm).
  void all_gather_host(comm::ConstBuffer send, comm::MutableBuffer recv);
  // Waits for the backward's gradient writes to NVMe (rethrowing their errors).
  void drain_gradient_writes();
  // Replacing state (checkpoint load, import, set_master): begin_replace() drops gathered copies,
  // gradients in flight and partial gradients; write_shard() then writes each kind (shard_numel
  // fp32 values, converted to the home's type; a kind the optimizer keeps not is skipped);
  // finish_replace() sets the progress and commits (the NVMe store's next step).
  void begin_replace();
  void write_shard(UnitId unit, Kind kind, std::span<const float> values);
  // The same for one sub-group (values: its numel fp32 values); a kind not kept is skipped.
  void write_group_fp32(UnitId unit, Kind kind, std::size_t group, std::span<const float> values);
  void finish_replace(const TrainingProgress& progress);

  // ResidencyClient: gathered units on the device (gather.cpp) ---------------------------------
  void start_load(tiers::UnitId unit) override;
  bool load_complete(tiers::UnitId unit) override;
  void wait_load(tiers::UnitId unit) override;
  void write_back(tiers::UnitId unit) override;
  void evict(tiers::UnitId unit) override;

 private:
  // engine_finalize.cpp: the steps of finalize().
  std::vector<tiers::ExtentSpec> plan_homes();
  void check_budgets(const std::vector<tiers::ExtentSpec>& extents) const;
  void allocate();
  std::shared_ptr<tiers::PinnedAllocator> host_allocator() const;  // [tiers.host] pinned
  // Whether open_store resumes; throws CommittedStoreExists when policy refuses a fresh start.
  bool resume_decided() const;
  // Opens the NVMe store when state is homed there; true when it resumed a committed step.
  bool open_store(std::vector<tiers::ExtentSpec> extents);
  // The staging the NVMe I/O goes through, registered with io_uring (fixed buffers: the optimizer
  // pipeline's buffers, then the gradient staging), and the hand-off queue sized to what that
  // staging can have submitted at once, so no submitting thread (Adam's above all) ever blocks.
  void lend_staging_to_io(io::IoEngineOptions& options) const;
  void initialise_fresh();
  void rebuild_params_from_master();
  void build_residency();

  // shard_io.cpp: a sub-group of one kind, synchronously, through the staging free outside the
  // optimizer step (slot 0 of the device staging; the first pipeline buffer).
  std::byte* window(UnitState& unit, Kind kind, std::size_t group, const GroupStaging& staging);
  void fill(UnitState& unit, Kind kind, std::size_t group, std::byte* window);
  void flush(UnitState& unit, Kind kind, std::size_t group, const std::byte* window);
  GroupStaging staging_outside_step(Kind kind) const;
  void read_group(UnitState& unit, Kind kind, std::size_t group, std::span<std::byte> out);
  void write_group(UnitState& unit, Kind kind, std::size_t group, std::span<const std::byte> data);
  void wait_timed(tiers::StoreRead& read);
  void wait_timed(const io::Ticket& ticket);

  // gather.cpp
  void finish_gather(UnitState& unit);
  void finish_gather_in_place(UnitState& unit);
  // The gathered buffer in the parameter dtype (what the all-gather fills; full32 for fp32).
  tiers::DeviceBuffer& gathered_params(GatheredCopy& copy) const;
  // Device memory the CPU addresses: this rank's shard in its place in gathered_params (copied
  // from a home in memory; NVMe reads land there themselves). Returns where it is.
  std::byte* place_own_shard(UnitState& unit);
  // 16-bit parameters: full16 cast to full32 on the CPU.
  void cast_gathered_to_fp32(UnitState& unit);
  void finish_gather_staged(UnitState& unit);
  // Where this rank's parameter shard lands for a gather (in place, or the pinned staging).
  std::byte* own_shard_destination(UnitState& unit);
  void read_param_shard(UnitState& unit, std::byte* shard);
  // The staged path with one rank: a gather needs no collective, so its h2d copy and cast can go
  // on the device streams ahead of use (start_load, or load_complete once the reads landed).
  bool gathers_ahead() const { return !device_addressable_ && ranks_ == 1; }
  bool may_queue_gather(UnitId unit) const;
  // Several ranks with device memory the CPU addresses and a backend with pending gathers
  // (EngineOptions::gathers_ahead_across_ranks): a load whose shard is in memory and final starts
  // its all-gather.
  // (Also a unit the running step has yet to update: its gather starts once the update is done,
  // start_gather_once_updated.)
  bool may_start_pending_gather(UnitId unit) const;
  // A step running now ([zero] overlap_optimizer) has yet to update the unit's home.
  bool update_due(UnitId unit) const {
    return unit < update_due_.size() && update_due_[unit] != 0;
  }
  // The running step has updated a unit the next iteration's prefetch loaded under it (its home
  // holds the new parameters, or they were handed to its gathered buffer): its gather starts
  // now (queued on the streams, or all-gathered ahead) instead of at use.
  void start_gather_once_updated(UnitId unit);
  // `own`: how the own block is sent (gathered_copy.hpp).
  void start_pending_gather(UnitState& unit, OwnSend own = OwnSend::kNow);
  void start_gather_of_final_shard(UnitState& unit, bool after_h2d = false);
  // Several ranks, a communicator with PendingAllGather, not switched off: the Engine may start
  // gathers ahead (it does when finalize reserves their keys: ahead_.across_ranks()).
  bool gathers_ahead_across_ranks() const {
    return ranks_ > 1 && options_.gathers_ahead_across_ranks && !gathers_at_use_knob() &&
           comm_->has_pending_all_gathers();
  }
  // Where a gather started ahead receives the unit: the gathered buffer in place, or the pinned
  // slot on the staged path (claim_gather_slot).
  std::byte* gather_target(GatheredCopy& copy) const;
  // True when the unit may receive its gather ahead: in place always, on the staged path when a
  // slot is free (the same on every rank: slots follow the rank-independent loads).
  bool claim_gather_slot(UnitState& unit);
  // The staged path's end of a gather: the gathered unit h2d (from `host_full`, or already on the
  // device when null), the cast on the compute stream, both waited for; the staging released.
  void finish_staged_copy(UnitState& unit, const std::byte* host_full);
  // Gathers whose own block another thread sends (MPI at MPI_THREAD_MULTIPLE).
  bool sends_from_threads() const {
    return ahead_.across_ranks() && comm_->sends_from_any_thread();
  }
  bool sends_after_update(UnitId unit);  // a gather may start whose update sends the own block
  void send_after_update(UnitId unit);   // on the update worker's thread
  void finish_pending_gather(UnitState& unit);
  void finish_send_job(GatheredCopy& gathered);  // waits for the sender to have run it
  // Tests the gathers started ahead; queues the staged h2d and cast of those complete.
  void advance_gathers_ahead();
  void queue_gather(UnitState& unit);
  void queue_gathered_copy(UnitState& unit);
  void queue_cast(UnitState& unit);
  void wait_queued_gather(UnitState& unit);
  void queue_fp32_view_casts(UnitState& unit);
  // The step just updated `group` of `unit` (its new parameters at `params`): a load waiting for
  // them takes them (optimizer_step.cpp).
  void hand_fresh_params(UnitId unit, std::size_t group, const std::byte* params);

  // reduce_grads.cpp
  void check_step_contracts() const;
  const float* reduce_to_shard(UnitState& unit, std::span<const float> full_grads,
                               tiers::DeviceSpan& device_shard);
  void reduce_scatter_on_host(const UnitLayout& layout, std::byte* full, std::byte* shard);
  void store_grad_on_device(UnitState& unit, const float* host_shard,
                            tiers::DeviceSpan device_shard, bool accumulate, bool last);
  void store_grad_in_host(UnitState& unit, const float* host_shard, bool accumulate, bool last);
  // The staged path, gradients homed in host memory or on NVMe: reduce_grads queues the unit's
  // copy to the host and returns; the host part (reduce-scatter with several ranks, store, norm)
  // runs at the next reduce_grads, under whose backward the copy ran, or when anything else needs
  // the gradients (finish_grad_moves: step(), cancel_speculation(), the other paths). Homed on
  // the device (store_grad_on_device), the cast and the norm's sum of squares run on, on the device.
  bool queues_grad_moves(const UnitState& unit) const;
  void queue_grad_move(UnitState& unit, std::span<const float> full_grads, bool accumulate,
                       bool last);
  tiers::DeviceSpan copy_to_grad_scratch(const UnitLayout& layout,
                                         std::span<const float> full_grads);
  void push_grad_move(tiers::DeviceSpan source, const GradMoves::Move& move);
  void finish_grad_moves(std::size_t keep = 0);  // all but the last `keep` queued, in call order
  void discard_grad_moves() noexcept;            // waits for their copies, stores nothing

  // optimizer_step.cpp
  struct StepMarks;
  class OptimizerPipeline;
  double global_sum_of_squares();
  void skip_step(StepStats& stats);
  void drain_backward_writes();
  void update_remaining(const std::vector<UnitId>& remaining, const cpu_adam::Hyperparams& hyper,
                        const cpu_adam::GradScaling& scaling, StepStats& stats);
  cpu_adam::Hyperparams next_step_hyperparams() const;  // the global ones of the next step
  cpu_adam::Hyperparams unit_step_hyper(const UnitState& unit,
                                        const cpu_adam::Hyperparams& hyper) const;
  double run_optimizer(std::span<const UnitId> units, const cpu_adam::Hyperparams& hyper,
                       const cpu_adam::GradScaling& scaling);
  // The step's first sub-groups read before step() (#18 item 4). A step that neither speculates
  // nor defers updates every unit itself, in unit order, after the last gradient; the master and
  // moments its pipeline reads first do not depend on the gradients, and the pipeline buffers sit
  // idle until then. So the backward's first reduce_grads starts those reads (everything the
  // pipeline reads of them but the gradient) into the buffers the pipeline will use, and the
  // step's pipeline adopts them. Anything that reads or replaces state outside the step drops
  // them first (cancel_speculation), so the step reads what is there then. A step that defers
  // ([zero] defer_update) hands them to its deferred updates instead (hand_pre_reads_to_deferred):
  // the next forward's first units, prefetched at step() and started as one batch
  // (CollectedStarts), are the same pipeline items in the same buffers.
  struct PreRead {
    std::size_t item;  // the pipeline item (and so buffer item % buffer_count)
    UnitId unit;
    std::size_t group;
    std::vector<tiers::StoreRead> reads;
    std::chrono::steady_clock::time_point issued;
  };
  void start_pre_reads();    // reduce_grads, the step's first gradient
  void discard_pre_reads();  // waits for them (their errors dropped: the step reads again)
  static void drop_pre_reads(std::vector<PreRead>& pre_reads);  // waits, then clears
  // step(), deferring: pre_reads_ go to deferred_pre_reads_; returns the sub-groups handed over.
  std::uint64_t hand_pre_reads_to_deferred();
  // Where `kind` of pipeline item `item` lands in the pipeline buffers (its NVMe staging).
  std::byte* pipeline_slot(std::size_t item, Kind kind) const;
  std::optional<std::uint32_t> pipeline_fixed_buffer(std::size_t item) const;
  // The pipeline over every sub-group of `units`; before_update (if set) sees each sub-group
  // just before its update, after_update just after it, with where its new parameters are when
  // they go to NVMe (else null); unit_done sees each unit once its last sub-group's new state is
  // on its way home (device homes: queued on the h2d stream; NVMe: its writes issued). `lanes`
  // stage device-homed state on the staged path (null on the direct path): the owner's lanes_,
  // or the update worker's update_lanes_, after whose use a unit's new device state has arrived
  // before after_update sees its last sub-group (the owner's streams are not ordered after them).
  // Returns the seconds spent in the CPU optimizer.
  using AfterUpdate = std::function<void(UnitId, std::size_t, const std::byte*)>;
  double run_pipeline(DeviceLanes* lanes, std::span<const UnitId> units,
                      const cpu_adam::GradScaling& scaling,
                      const std::function<cpu_adam::Hyperparams(UnitId)>& hyper_of,
                      const std::function<void(UnitId, std::size_t)>& before_update = {},
                      const AfterUpdate& after_update = {},
                      std::vector<PreRead>* pre_reads = nullptr,
                      std::size_t* adopted = nullptr,
                      const std::function<void(UnitId)>& unit_done = {});
  void update_sub_group(UnitState& unit, std::size_t group, const cpu_adam::ParamSpans& spans,
                        std::byte* param_out, const cpu_adam::Hyperparams& hyper,
                        const cpu_adam::GradScaling& scaling);
  void update_compressed(UnitState& unit, std::size_t group, const cpu_adam::CompressedSpans& spans,
                         std::byte* param_out, const cpu_adam::Hyperparams& hyper,
                         const cpu_adam::GradScaling& scaling);
  std::uint64_t unit_index(const UnitState& unit) const {
    return static_cast<std::uint64_t>(&unit - units_.data());
  }
  void finish_step(StepStats& stats, const StepMarks& marks);

  // speculation.cpp: the optimizer during the backward.
  void start_speculation();            // end of finalize: the worker, when the data path allows
  void speculate(UnitId unit);          // reduce_grads, once the unit's gradient is complete
  bool may_speculate(const UnitState& unit);
  std::uint64_t kept_bytes(const UnitState& unit) const;  // in-memory state an undo restores
  void run_speculated(std::span<const UnitId> units);     // on the worker's thread
  void keep_for_undo(UnitId unit, std::size_t group);     // on the worker's thread
  void undo_speculated(UnitId unit);                      // owner thread, worker idle
  double finish_speculation();  // waits for the worker; its Adam seconds since the last step
  // After the norm: confirms the speculated units `check` allows (nullptr: none), undoes the
  // others, counts both in `stats`; returns the units step() must still update.
  std::vector<UnitId> settle_speculation(const SpeculationCheck* check, StepStats& stats);
  // Undoes every speculated update (they run again in step()): before state is read or
  // replaced outside the step, and before a speculated unit is gathered again.
  void cancel_speculation();
  void cancel_speculation(UnitId unit);

  // deferred_update.cpp: the step's own updates under the next forward ([zero] defer_update).
  bool defers() const { return config_.zero.defer_update && worker_ != nullptr; }
  // step(): `units` are updated when next gathered (or at complete_deferred), with these.
  void defer_updates(std::span<const UnitId> units, const cpu_adam::Hyperparams& hyper,
                     const cpu_adam::GradScaling& scaling, StepStats& stats);
  bool deferred_pending(UnitId unit);     // due or running
  void start_deferred(UnitId unit);       // owner: hands a due unit to the worker
  // While one is alive, start_deferred collects the units it starts; they go to the worker as one
  // batch (one pipeline) when it ends, or before anything waits for one of them.
  class CollectedStarts {
   public:
    explicit CollectedStarts(EngineState& engine);
    ~CollectedStarts();
    CollectedStarts(const CollectedStarts&) = delete;
    CollectedStarts& operator=(const CollectedStarts&) = delete;

   private:
    EngineState& engine_;
  };
  void submit_collected_starts();
  std::optional<std::vector<UnitId>> collected_starts_;  // owner thread only
  void wait_deferred(UnitId unit);        // owner: until its update is done; rethrows a failure
  void run_deferred(std::span<const UnitId> units);  // on the worker's thread
  void run_on_worker(std::span<const SpeculatedUnitId> units);  // deferred first, then speculated
  // Runs every deferred update still due, waits for them and commits the step they belong to:
  // before anything else reads, writes or updates the state.
  void complete_deferred();
  void commit_if_deferred_done();  // after a gather: commits once the last deferred unit is done

  // device_lanes.cpp: device memory access. Each returns once the bytes have arrived: a memcpy or
  // CPU loop when device memory is addressable, else stream work waited on.
  void copy_to_device(tiers::DeviceSpan dst, const void* host_src);
  void copy_to_host(void* host_dst, tiers::DeviceSpan src);
  // The optimizer's device-homed sub-groups go through the device staging, two slots so the d2h of
  // the next sub-group overlaps Adam on this one: stage_in (d2h, returns at once), wait_staged_in
  // before Adam, stage_out (h2d, returns at once) after it, finish_staging at the step's end. On
  // the streams of `lanes` (lanes_ in step(), update_lanes_ on the update worker); each does
  // nothing when it is null (the direct path). One pipeline at a time uses the slots.
  void stage_in(DeviceLanes* lanes, UnitState& unit, std::size_t group, std::size_t slot,
                std::span<const Kind> kinds);
  void wait_staged_in(DeviceLanes* lanes, std::size_t slot);
  void stage_out(DeviceLanes* lanes, UnitState& unit, std::size_t group, std::size_t slot,
                 std::span<const Kind> kinds);
  void finish_staging(DeviceLanes* lanes);
  std::byte* device_staging_at(Kind kind, std::size_t slot) const;
  // The staged path with every kind a sub-group's update reads and writes homed on the device
  // ([zero] optimizer = grads = params = "device"): the device's own optimizer op updates it in
  // place (tiers::OptimizerOp, bitwise cpu_adam's), and stage_in / stage_out leave it alone. Such
  // units are updated by step() itself (a few milliseconds on a GPU), never by the update worker.
  bool updates_on_device(const UnitState& unit) const;
  // That update of one sub-group on the compute stream, waited for; with fp32 parameters, the
  // new master copied (or cast) into them. hyper and scaling as for update_sub_group.
  void update_on_device(UnitState& unit, std::size_t group, const cpu_adam::Hyperparams& hyper,
                        const cpu_adam::GradScaling& scaling);

  // Fixed at construction (engine_setup.cpp).
  Config config_;  // with the debug knobs applied (STRATA_FORCE_NVME)
  EngineOptions options_;
  tiers::ComputeFence* compute_fence_ = nullptr;  // Engine::set_compute_fence
  tiers::Device* device_;
  comm::Communicator* comm_;
  std::uint32_t rank_ = 0;
  std::uint32_t ranks_ = 1;
  // The data path (EngineOptions::DeviceAccess): whether the CPU addresses device memory, and
  // whether collectives of device data take device memory directly.
  bool device_addressable_ = true;
  bool comm_on_device_ = true;
  // The gradient reduce-scatter's dtype (gradient_reduce_dtype; fp32 with NcclComm).
  DType reduce_dtype_ = DType::kFp32;
  std::unique_ptr<tbb::task_arena> arena_;

  // Set by add_unit and finalize (engine_finalize.cpp).
  std::vector<UnitState> units_;
  BufferPlan plan_;
  bool finalized_ = false;
  std::unique_ptr<tiers::PinnedPool> host_pool_;
  std::unique_ptr<io::IoEngine> io_engine_;
  std::unique_ptr<tiers::NvmeStore> store_;
  std::unique_ptr<tiers::ResidencyManager> residency_;

  // The optimizer step's (optimizer_step.cpp). The first pipeline buffer is also shard_io.cpp's
  // NVMe staging outside the step.
  TrainingProgress progress_;
  std::vector<tiers::PinnedBuffer> pipeline_buffers_;  // fixed buffers 0 .. n-1 when registered
  std::atomic<double> io_wait_s_ = 0;  // since the last step (shard_io.cpp adds to it)
  std::mutex store_mutex_;  // store_ calls while the UpdateWorker runs
  // One sub-group's, reused (update_compressed, update_on_device: copied to the device into
  // grad_full_scratch_, free during the step on the staged path).
  std::vector<cpu_adam::DecayRun> decay_runs_;
  std::uint64_t nvme_read_mark_ = 0;
  // Units the running step has yet to update (their gathers take the fresh parameters), and the
  // parameter bytes so handed over since the last step.
  std::vector<std::uint8_t> update_due_;
  std::atomic<std::uint64_t> fresh_param_bytes_ = 0;  // the worker adds to it too
  std::uint64_t nvme_written_mark_ = 0;
  std::vector<PreRead> pre_reads_;  // owner thread only
  // Handed to the deferred updates at step(); the worker's first deferred pipeline adopts (and
  // clears) them. The owner touches them again only with the worker idle or gone.
  std::vector<PreRead> deferred_pre_reads_;
  bool pre_reads_tried_ = false;    // this step's backward has decided on them
  std::size_t pre_read_groups_ = 0;  // adopted by the running step
  std::uint64_t device_updated_groups_ = 0;  // this step's (update_on_device)

  // Gradient reduction's (reduce_grads.cpp): the padded fp32 gradient of one unit and this rank's
  // reduced shard (device memory); NVMe write staging, two so one drains while the next fills.
  tiers::DeviceBuffer grad_full_scratch_;
  tiers::DeviceBuffer grad_shard_scratch_;
  std::array<tiers::PinnedBuffer, 2> grad_buffers_;
  std::array<std::vector<io::Ticket>, 2> grad_buffer_writes_;
  std::size_t next_grad_buffer_ = 0;
  cpu_adam::GradNormAccumulator norm_;
  // Every gradient homed on the device, staged path (BufferPlan::norm_device_bytes): each stored
  // shard's sum of squares is added to norm_device_sum_ on the compute stream, in call order (the
  // bits of norm_.add), and the sum is read back once, at the step, through norm_readback_.
  tiers::DeviceBuffer norm_device_sum_;
  tiers::DeviceBuffer norm_device_scratch_;
  tiers::PinnedBuffer norm_readback_;
  // The staged path's gradient moves in flight (queue_grad_move; grad_moves.hpp).
  GradMoves grad_moves_;

  // Gathering's (gather.cpp): a copy of this rank's parameter shard for the all-gather's send
  // side; pinned slots the NVMe parameter reads land in on the staged path.
  tiers::DeviceBuffer gather_send_scratch_;
  std::optional<tiers::PinnedSlab> param_read_slab_;
  // Gathers started ahead of use: their keys, the GatherSender, the staged path's slots they
  // receive into (BufferPlan::gather_slots), the unit gather() is acquiring, the count
  // (gather_ahead.hpp). After host_pool_, whose memory the slots are.
  GatherAhead ahead_;

  // The staged path's (device_lanes.cpp): streams and events; pinned staging of device-homed
  // sub-groups (two slots), of one gradient shard in fp32 and of one padded unit in fp32.
  std::unique_ptr<DeviceLanes> lanes_;
  tiers::PinnedBuffer device_staging_;
  tiers::PinnedBuffer shard_staging_;
  tiers::PinnedBuffer full_staging_;

  // Checkpoint streaming's host staging outside the budget (checkpoint.cpp).
  StagingMeter staging_meter_;

  // The speculative updates' (speculation.cpp). The worker is the last member, so it stops
  // before anything it uses is destroyed.
  std::vector<SpeculatedUnit> speculated_;  // one per unit
  bool speculation_stopped_ = false;  // this step: the norm passed the clip threshold, or overflowed
  // The last step clipped or skipped: the next one most likely does too, and a speculated update
  // would only be undone, its NVMe bytes moved twice; so it is not tried.
  bool last_step_clipped_ = false;
  tiers::PinnedBuffer undo_copies_;  // BufferPlan::undo_bytes, carved per unit
  double speculated_adam_s_ = 0;  // the worker's, since the last step

  // The deferred updates' (deferred_update.cpp): per unit kNone / kDue / kRunning / kFailed,
  // written by the owner (due, running) and the worker (none, failed) under deferred_mutex_.
  std::vector<DeferredState> deferred_;
  std::vector<cpu_adam::Hyperparams> deferred_hyper_;  // per unit, fixed by the step
  cpu_adam::GradScaling deferred_scaling_;
  bool commit_due_ = false;  // the last step deferred updates and commits when they are done
  double deferred_wait_s_ = 0;  // the owner's, blocked on them since the last step (StepStats)
  std::mutex deferred_mutex_;
  std::condition_variable deferred_done_;
  // The update worker's streams on the staged path: its stage_in / stage_out run beside the
  // owner's gathers and gradient moves on lanes_, which belong to the owner's thread.
  std::unique_ptr<DeviceLanes> update_lanes_;
  std::unique_ptr<UpdateWorker> worker_;
};

double seconds_since(std::chrono::steady_clock::time_point start);
// Parameters or gradients in fp16: the loss is scaled ([precision] loss_scale; engine_setup.cpp).
bool uses_fp16(const Config& config);
// Master weights or moments in a format other than fp32: the step goes through step_compressed.
inline bool compressed_state(const Config& config) {
  return config.optimizer.state_dtype != cpu_adam::StateDType::kFp32 ||
         config.optimizer.master_dtype != cpu_adam::StateDType::kFp32;
}

}  // namespace strata::runtime::detail
