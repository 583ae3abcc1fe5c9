// Proves the optimizer runs during the backward ([zero] overlap_optimizer) and that this changes
// no bit: each unit's update starts once its gradient is complete, before the backward of the
// first unit ends (structural, from the tracer's events, for NVMe, host and device placements;
// the serial step is shown to fail the same check), and the parameters, moments and losses are
// bitwise the serial step's whether the speculated updates are confirmed, undone because the
// global norm clips, or undone because a gradient overflowed and the step is skipped.
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/debug_knobs.hpp"
#include "runtime/comm/local_comm.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/engine/trace.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"
#include "tests/runtime/engine_test_model.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using testing::host_device;
using testing::kEngineTestWidths;
using testing::TinyMlp;

struct TrainedRun {
  std::vector<float> losses;
  std::vector<std::vector<float>> state;  // master, exp_avg, exp_avg_sq of every unit
  std::uint64_t speculated = 0, confirmed = 0, redone = 0, skipped = 0;
  std::uint64_t nvme_read = 0, fresh_params = 0, deferred = 0, pre_read = 0, device_updated = 0;
  std::vector<std::uint64_t> reads_per_step, fresh_per_step;  // StepStats::nvme, fresh_param_bytes
};

// An Engine over TinyMlp on the host device, finalized: what every test here trains.
struct TinyEngine {
  explicit TinyEngine(const Config& config, const EngineOptions& options = {})
      : device(host_device(config)), engine(config, *device, comm, options) {
    model.add_units(engine);
    engine.finalize();
  }
  std::unique_ptr<tiers::Device> device;
  comm::LocalComm comm;
  Engine engine;
  TinyMlp model{kEngineTestWidths, 16, /*data_seed=*/7};
};

Config config_for(const ScratchDir& dir, Tier params, Tier optimizer, bool overlap) {
  Config config = testing::engine_test_config(dir.path().string());
  config.zero.params = params;
  config.zero.grads = optimizer == Tier::kNvme ? Tier::kNvme : Tier::kHost;
  config.zero.optimizer = optimizer;
  config.zero.sub_group_size = 1024;  // several sub-groups per unit
  config.zero.overlap_optimizer = overlap;
  return config;
}

// Trains `steps` steps; `before_reduce` may change each gradient (e.g. make one overflow).
TrainedRun train(const Config& config, int steps,
                 const std::function<void(int step, std::vector<float>&)>& before_reduce = {},
                 const EngineOptions& options = {}) {
  TinyEngine tiny(config, options);
  Engine& engine = tiny.engine;
  TinyMlp& model = tiny.model;
  TrainedRun run;
  for (int step = 0; step < steps; ++step) {
    const auto hook = [&](std::vector<float>& grads) {
      if (before_reduce) before_reduce(step, grads);
    };
    run.losses.push_back(model.train_step(engine, 1.0, nullptr, hook));
    const StepStats stats = engine.step();
    run.speculated += stats.speculated_groups;
    run.confirmed += stats.confirmed_groups;
    run.redone += stats.redone_groups;
    run.skipped += stats.skipped ? 1 : 0;
    run.nvme_read += stats.nvme.read_bytes;
    run.fresh_params += stats.fresh_param_bytes;
    run.deferred += stats.deferred_groups;
    run.pre_read += stats.pre_read_groups;
    run.device_updated += stats.device_updated_groups;
    run.reads_per_step.push_back(stats.nvme.read_bytes);
    run.fresh_per_step.push_back(stats.fresh_param_bytes);
  }
  for (UnitId unit : model.units()) {
    run.state.push_back(engine.master_shard(unit));
    run.state.push_back(engine.state_shard(unit, OptimizerState::kExpAvg));
    run.state.push_back(engine.state_shard(unit, OptimizerState::kExpAvgSq));
  }
  return run;
}

void expect_bitwise(const TrainedRun& a, const TrainedRun& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  EXPECT_EQ(std::memcmp(a.losses.data(), b.losses.data(), a.losses.size() * sizeof(float)), 0)
      << what << ": losses differ";
  ASSERT_EQ(a.state.size(), b.state.size());
  for (std::size_t i = 0; i < a.state.size(); ++i) {
    ASSERT_EQ(a.state[i].size(), b.state[i].size());
    EXPECT_EQ(std::memcmp(a.state[i].data(), b.state[i].data(), a.state[i].size() * sizeof(float)),
              0)
        << what << ": state array " << i << " (unit " << i / 3 << ") differs";
  }
}

const std::vector<std::pair<Tier, Tier>> kPlacements = {
    {Tier::kNvme, Tier::kNvme}, {Tier::kHost, Tier::kHost}, {Tier::kDevice, Tier::kDevice},
    {Tier::kDevice, Tier::kNvme}};

std::string name_of(Tier params, Tier optimizer) {
  return "params " + std::string(to_string(params)) + ", optimizer " +
         std::string(to_string(optimizer));
}

TEST(SpeculativeStep, ConfirmedUpdatesAreBitwiseTheSerialStep) {
  for (const auto& [params, optimizer] : kPlacements) {
    ScratchDir serial_dir, overlap_dir;
    Config serial = config_for(serial_dir, params, optimizer, false);
    Config overlap = config_for(overlap_dir, params, optimizer, true);
    serial.optimizer.grad_clip = overlap.optimizer.grad_clip = 1e6;  // never clips
    const TrainedRun a = train(serial, 3);
    const TrainedRun b = train(overlap, 3);
    expect_bitwise(a, b, name_of(params, optimizer));
    EXPECT_EQ(a.speculated, 0u);
    EXPECT_GT(b.speculated, 0u) << name_of(params, optimizer);
    EXPECT_EQ(b.confirmed, b.speculated) << name_of(params, optimizer);
    EXPECT_EQ(b.redone, 0u);
  }
}

// A clip threshold between the first step's gradient norm of the last unit alone (the first
// reduced) and of the whole model, so speculation starts and the step then clips.
double clip_between_last_unit_and_total(Config config) {
  ScratchDir dir;
  config.tiers.nvme.paths = {dir.path().string()};
  TinyEngine tiny(config);
  Engine& engine = tiny.engine;
  TinyMlp& model = tiny.model;
  std::vector<std::vector<float>> grads;
  model.train_step(engine, 1.0, &grads);
  const auto squares = [](const std::vector<float>& values) {
    double sum = 0;
    for (float v : values) sum += static_cast<double>(v) * v;
    return sum;
  };
  double total = 0;
  for (const auto& unit : grads) total += squares(unit);
  const double last = std::sqrt(squares(grads.back()));
  return (last + std::sqrt(total)) / 2;
}

// The units the step updates itself (every unit when the steps clip, as early in a fine-tune with
// grad_clip = 1; otherwise those whose gradients completed too late to speculate: the first
// layers) are the first the next forward gathers; their loads take the new parameters from the
// step's pipeline, so exactly those bytes are not read back from NVMe, and nothing changes a bit.
TEST(SpeculativeStep, TheNextForwardTakesTheStepsNewParametersInsteadOfReadingThem) {
  for (const Tier optimizer : {Tier::kNvme, Tier::kHost}) {
    ScratchDir serial_dir, overlap_dir;
    Config serial = config_for(serial_dir, Tier::kNvme, optimizer, false);
    Config overlap = config_for(overlap_dir, Tier::kNvme, optimizer, true);
    // Every step clips, so none speculates after the first, none is undone (no redo reads), and
    // step() updates every unit itself.
    serial.optimizer.grad_clip = overlap.optimizer.grad_clip = 1e-3;
    const TrainedRun a = train(serial, 4);
    const TrainedRun b = train(overlap, 4);
    const std::string what = name_of(Tier::kNvme, optimizer);
    expect_bitwise(a, b, what);
    EXPECT_EQ(a.fresh_params, 0u) << what;
    EXPECT_GT(b.fresh_params, 0u) << what;
    EXPECT_EQ(a.nvme_read - b.nvme_read, b.fresh_params) << what;
  }
}

TEST(SpeculativeStep, ClippedStepsUndoAndRedoBitwise) {
  for (const auto& [params, optimizer] : kPlacements) {
    ScratchDir serial_dir, overlap_dir;
    Config serial = config_for(serial_dir, params, optimizer, false);
    Config overlap = config_for(overlap_dir, params, optimizer, true);
    // Below the whole norm, above the last unit's alone: the first units speculate, then clip.
    const double clip = clip_between_last_unit_and_total(serial);
    serial.optimizer.grad_clip = overlap.optimizer.grad_clip = clip;
    const TrainedRun a = train(serial, 3);
    const TrainedRun b = train(overlap, 3);
    expect_bitwise(a, b, name_of(params, optimizer));
    EXPECT_GT(b.redone, 0u) << name_of(params, optimizer) << ": nothing was undone";
    EXPECT_EQ(b.confirmed + b.redone, b.speculated);
  }
}

// A Kahan-compensated bf16 master with int8 moments: the compensation is written by the update
// like the master, so the undo copies, the A/B slots and the deferred updates carry it too.
TEST(SpeculativeStep, AKahanMasterIsUndoneRedoneAndDeferredBitwise) {
  const auto kahan = [](Config config) {
    config.optimizer.state_dtype = cpu_adam::StateDType::kInt8;
    config.optimizer.master_dtype = cpu_adam::StateDType::kBf16;
    config.optimizer.master_rounding = MasterRounding::kKahan;
    return config;
  };
  for (const auto& [params, optimizer] : kPlacements) {
    ScratchDir serial_dir, overlap_dir, deferred_dir;
    Config serial = kahan(config_for(serial_dir, params, optimizer, false));
    Config overlap = kahan(config_for(overlap_dir, params, optimizer, true));
    Config deferred = kahan(config_for(deferred_dir, params, optimizer, false));
    deferred.zero.defer_update = true;
    const double clip = clip_between_last_unit_and_total(serial);
    serial.optimizer.grad_clip = overlap.optimizer.grad_clip = deferred.optimizer.grad_clip = clip;
    const TrainedRun a = train(serial, 3);
    const TrainedRun b = train(overlap, 3);
    const TrainedRun c = train(deferred, 3);
    const std::string what = "kahan, " + name_of(params, optimizer);
    expect_bitwise(a, b, what + ", overlap");
    expect_bitwise(a, c, what + ", deferred");
    EXPECT_GT(b.redone, 0u) << what << ": nothing was undone";
    EXPECT_GT(c.deferred, 0u) << what << ": nothing was deferred";
  }
}

TEST(SpeculativeStep, AnOverflowSkipsTheStepAndUndoesTheSpeculatedUnits) {
  for (const auto& [params, optimizer] : kPlacements) {
    ScratchDir serial_dir, overlap_dir;
    Config serial = config_for(serial_dir, params, optimizer, false);
    Config overlap = config_for(overlap_dir, params, optimizer, true);
    serial.optimizer.grad_clip = overlap.optimizer.grad_clip = 1e6;
    // Step 2's last gradient (the first unit's) overflows, after the others were speculated.
    const auto overflow = [](int step, std::vector<float>& grads) {
      static int calls = 0;
      if (step == 1 && ++calls % 3 == 0) grads[0] = std::numeric_limits<float>::infinity();
    };
    const TrainedRun a = train(serial, 3, overflow);
    const TrainedRun b = train(overlap, 3, overflow);
    expect_bitwise(a, b, name_of(params, optimizer));
    EXPECT_EQ(b.skipped, 1u);
    EXPECT_GT(b.redone, 0u) << name_of(params, optimizer);
  }
}

// Between the reduce_grads of the last unit and the backward of the first one, waits (up to 20 s)
// for the last unit's Adam to have run; true when it did. The serial step never runs it there.
bool last_units_update_runs_during_the_backward(Tier params, Tier optimizer, bool overlap) {
  ScratchDir dir;
  Config config = config_for(dir, params, optimizer, overlap);
  config.optimizer.grad_clip = 1e6;
  Tracer tracer;
  EngineOptions options;
  options.tracer = &tracer;
  TinyEngine tiny(config, options);
  Engine& engine = tiny.engine;
  TinyMlp& model = tiny.model;
  const std::string last = "adam layer" + std::to_string(kEngineTestWidths.size() - 2) + " ";
  int reduces = 0;
  bool seen = false;
  model.train_step(engine, 1.0, nullptr, [&](std::vector<float>&) {
    if (++reduces != static_cast<int>(kEngineTestWidths.size()) - 1) return;  // not the first unit
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!seen && std::chrono::steady_clock::now() < deadline) {
      for (const Tracer::Event& event : tracer.events()) {
        if (event.track == TraceTrack::kOptimizer && event.name.rfind(last, 0) == 0) seen = true;
      }
      if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (!overlap) break;  // nothing can run it: no need to wait out the deadline
    }
  });
  engine.step();
  return seen;
}

TEST(SpeculativeStep, TheLastUnitsUpdateRunsBeforeTheBackwardOfTheFirstUnitEnds) {
  for (const auto& [params, optimizer] : kPlacements) {
    EXPECT_TRUE(last_units_update_runs_during_the_backward(params, optimizer, true))
        << name_of(params, optimizer);
  }
}

TEST(SpeculativeStep, TheSerialStepFailsTheSameCheck) {
  EXPECT_FALSE(last_units_update_runs_during_the_backward(Tier::kNvme, Tier::kNvme, false));
}

// [zero] defer_update: the updates step() would run itself run when the next forward gathers each
// unit. The parameters, moments and losses are bitwise the serial step's, with and without the
// speculation during the backward, whether the steps clip (everything deferred) or not.
TEST(DeferredUpdate, IsBitwiseTheSerialStepInEveryPlacement) {
  for (const auto& [params, optimizer] : kPlacements) {
    for (const double clip : {1e-3, 1e6}) {
      for (const bool overlap : {false, true}) {
        ScratchDir serial_dir, deferred_dir;
        Config serial = config_for(serial_dir, params, optimizer, false);
        Config deferred = config_for(deferred_dir, params, optimizer, overlap);
        deferred.zero.defer_update = true;
        serial.optimizer.grad_clip = deferred.optimizer.grad_clip = clip;
        const TrainedRun a = train(serial, 4);
        const TrainedRun b = train(deferred, 4);
        const std::string what = name_of(params, optimizer) + ", grad_clip " +
                                 std::to_string(clip) + ", overlap " + std::to_string(overlap);
        expect_bitwise(a, b, what);
        EXPECT_EQ(a.deferred, 0u) << what;
        // Speculated units are not deferred: without clipping and with the overlap, (nearly)
        // everything runs during the backward.
        if (clip < 1 || !overlap) {
          EXPECT_GT(b.deferred, 0u) << what;
        }
      }
    }
  }
}

// The staged path (a CUDA device's; here the host device's streams, DeviceAccess::kStaged): the
// update worker stages device-homed state on streams of its own, so the deferred updates and the
// speculation run there too, bitwise the direct path's serial step. The placements are the GPU
// configs' (examples/configs/h200/): optimizer on the host, half of it on the device, on NVMe,
// parameters and optimizer on the host, everything on NVMe. A unit with state in device memory is
// never speculated; one the device updates in place is updated by step() itself, never deferred.
struct StagedPlacement {
  Tier params, grads, optimizer;
  double device_fraction;
};

std::string name_of(const StagedPlacement& p) {
  return fmt::format("params {}, grads {}, optimizer {} ({}% on device)", to_string(p.params),
                     to_string(p.grads), to_string(p.optimizer), p.device_fraction * 100);
}

Config staged_config(const ScratchDir& dir, const StagedPlacement& p, bool overlap, bool defer,
                     double clip) {
  Config config = config_for(dir, p.params, p.optimizer, overlap);
  config.zero.grads = p.grads;
  config.zero.optimizer_device_fraction = p.device_fraction;
  config.zero.defer_update = defer;
  config.optimizer.grad_clip = clip;
  return config;
}

EngineOptions staged_options() {
  EngineOptions options;
  options.device_access = EngineOptions::DeviceAccess::kStaged;
  return options;
}

const std::vector<StagedPlacement> kStagedPlacements = {
    {Tier::kDevice, Tier::kDevice, Tier::kHost, 0.0},
    {Tier::kDevice, Tier::kDevice, Tier::kHost, 0.5},
    {Tier::kDevice, Tier::kDevice, Tier::kNvme, 0.0},
    {Tier::kHost, Tier::kHost, Tier::kHost, 0.0},
    {Tier::kNvme, Tier::kNvme, Tier::kNvme, 0.0}};

TEST(DeferredUpdate, IsBitwiseTheSerialStepOnTheStagedPath) {
  for (const StagedPlacement& placement : kStagedPlacements) {
    for (const double clip : {1e-3, 1e6}) {
      ScratchDir serial_dir;
      const TrainedRun a = train(staged_config(serial_dir, placement, false, false, clip), 4);
      for (const bool overlap : {false, true}) {
        ScratchDir deferred_dir;
        const TrainedRun b = train(staged_config(deferred_dir, placement, overlap, true, clip), 4,
                                   {}, staged_options());
        const std::string what = fmt::format("{}, grad_clip {}, overlap {}", name_of(placement),
                                             clip, overlap);
        expect_bitwise(a, b, what);
        EXPECT_EQ(a.deferred, 0u) << what;
        if (force_nvme_knob()) continue;  // every placement is all-NVMe then: compared above
        const bool speculates = overlap && clip > 1 && placement.params != Tier::kDevice;
        if (!speculates) {
          EXPECT_GT(b.deferred, 0u) << what;
        }
        // The device's share is updated by step() itself, on the owner's streams.
        EXPECT_EQ(b.device_updated > 0, placement.device_fraction > 0) << what;
      }
    }
  }
}

TEST(SpeculativeStep, RunsOnTheStagedPathForUnitsWithNoStateInDeviceMemory) {
  for (const StagedPlacement& placement : kStagedPlacements) {
    ScratchDir serial_dir, overlap_dir;
    const TrainedRun a = train(staged_config(serial_dir, placement, false, false, 1e6), 3);
    const TrainedRun b = train(staged_config(overlap_dir, placement, true, false, 1e6), 3, {},
                               staged_options());
    expect_bitwise(a, b, name_of(placement));
    if (force_nvme_knob()) continue;  // every placement is all-NVMe then
    if (placement.params == Tier::kDevice) {
      EXPECT_EQ(b.speculated, 0u) << name_of(placement);  // its undo would need a device copy
    } else {
      EXPECT_GT(b.speculated, 0u) << name_of(placement);
      EXPECT_EQ(b.confirmed, b.speculated) << name_of(placement);
    }
  }
}

// With the parameters on NVMe, the forward's gathers take every deferred unit's new parameters
// from its update. With the rest in memory and a device budget that keeps every unit gathered from
// the forward to the backward, the serial step's NVMe reads after the first step are exactly the
// forward's parameter gathers; deferred, there are none. (Which step's StepStats counts a
// hand-over depends on when the worker gets to it, so the counts are compared in sum.)
TEST(DeferredUpdate, TheForwardReadsNoParameterTheStepWrote) {
  if (force_nvme_knob()) GTEST_SKIP() << "STRATA_FORCE_NVME puts the optimizer's reads on NVMe too";
  ScratchDir serial_dir, deferred_dir;
  Config serial = config_for(serial_dir, Tier::kNvme, Tier::kHost, false);
  Config deferred = config_for(deferred_dir, Tier::kNvme, Tier::kHost, false);
  deferred.zero.defer_update = true;
  const TrainedRun a = train(serial, 4);
  const TrainedRun b = train(deferred, 4);
  expect_bitwise(a, b, "params on NVMe");
  std::uint64_t serial_reads = 0;
  for (std::size_t step = 1; step < a.reads_per_step.size(); ++step) {
    EXPECT_GT(a.reads_per_step[step], 0u) << "step " << step + 1;
    EXPECT_EQ(b.reads_per_step[step], 0u) << "step " << step + 1;
    serial_reads += a.reads_per_step[step];
  }
  // Handed over instead: the serial reads of steps 2-4 (each forward's units are handed over
  // before its gathers finish), plus those of the prefetch step 4 starts, when the worker gets
  // to them before step 4 is counted (at most one forward's worth).
  EXPECT_GE(b.fresh_params, serial_reads);
  EXPECT_LE(b.fresh_params, serial_reads * 4 / 3);
}

// A step whose updates were deferred is not lost when the Engine goes before the next forward:
// the Engine runs them and commits, and a resumed Engine continues bitwise.
TEST(DeferredUpdate, TheEngineCommitsADeferredStepWhenItGoes) {
  ScratchDir serial_dir, deferred_dir;
  Config serial = config_for(serial_dir, Tier::kNvme, Tier::kNvme, false);
  Config deferred = config_for(deferred_dir, Tier::kNvme, Tier::kNvme, false);
  deferred.zero.defer_update = true;
  const TrainedRun a = train(serial, 3);
  {
    TinyEngine tiny(deferred);
    Engine& engine = tiny.engine;
    TinyMlp& model = tiny.model;
    for (int step = 0; step < 2; ++step) {
      model.train_step(engine, 1.0);
      EXPECT_GT(engine.step().deferred_groups, 0u);
    }
  }  // step 2's updates are still due here
  deferred.tiers.nvme.on_existing = OnExistingStore::kResume;
  TinyEngine tiny(deferred);
  Engine& engine = tiny.engine;
  TinyMlp& model = tiny.model;
  ASSERT_EQ(engine.step_count(), 2u);
  model.train_step(engine, 1.0);  // the data of step 3 (TinyMlp draws batches from the step)
  engine.step();
  std::size_t i = 0;
  for (UnitId unit : model.units()) {
    const std::vector<float> master = engine.master_shard(unit);
    ASSERT_EQ(master.size(), a.state[i].size());
    EXPECT_EQ(std::memcmp(master.data(), a.state[i].data(), master.size() * sizeof(float)), 0)
        << "unit " << unit;
    i += 3;
  }
}

// A step that updates every unit itself (overlap off, or after a clipped step) reads the master
// and moments of its first buffer_count - 1 sub-groups during the backward (#18 item 4): the
// pipeline's first update then waits only for its gradient. Nothing changes a bit.
TEST(PreRead, AStepThatUpdatesEverythingItselfReadsItsFirstSubGroupsDuringTheBackward) {
  // TinyMlp's units have 2, 3 and 1 sub-groups of 1024; buffer_count 4 pre-reads 3 of them.
  const std::uint64_t per_step = 3;
  ScratchDir host_dir;
  Config host = config_for(host_dir, Tier::kHost, Tier::kHost, false);
  const TrainedRun reference = train(host, 3);
  EXPECT_EQ(reference.pre_read, 0u) << "no NVMe state, nothing to read";
  for (const Tier params : {Tier::kNvme, Tier::kDevice}) {
    ScratchDir dir;
    Config serial = config_for(dir, params, Tier::kNvme, false);
    ASSERT_EQ(serial.zero.buffer_count, 4u);
    const TrainedRun run = train(serial, 3);
    const std::string what = name_of(params, Tier::kNvme);
    expect_bitwise(reference, run, what);
    EXPECT_EQ(run.pre_read, 3 * per_step) << what;
  }
  // The overlap on and every step clipped: the first may speculate (its first gradient already
  // clips here), the next two update everything in step() and read ahead.
  ScratchDir clip_dir, clip_host_dir;
  Config clipped = config_for(clip_dir, Tier::kNvme, Tier::kNvme, true);
  Config clipped_host = config_for(clip_host_dir, Tier::kHost, Tier::kHost, false);
  clipped.optimizer.grad_clip = clipped_host.optimizer.grad_clip = 1e-3;
  const TrainedRun run = train(clipped, 3);
  expect_bitwise(train(clipped_host, 3), run, "overlap on, clipped");
  EXPECT_EQ(run.pre_read, 2 * per_step);
  // defer_update: the step hands what was read to its deferred updates, which run under the next
  // forward (or before the next step): the same sub-groups read ahead, the same bits.
  for (const Tier params : {Tier::kNvme, Tier::kDevice}) {
    ScratchDir defer_dir;
    Config deferred = config_for(defer_dir, params, Tier::kNvme, false);
    deferred.zero.defer_update = true;
    const TrainedRun deferred_run = train(deferred, 3);
    const std::string what = name_of(params, Tier::kNvme) + ", deferred";
    expect_bitwise(reference, deferred_run, what);
    EXPECT_EQ(deferred_run.pre_read, 3 * per_step) << what;
    EXPECT_GT(deferred_run.deferred, 0u) << what;
  }
}

// From the tracer: the NVMe read of the first unit's first sub-group starts before the backward
// of the first unit (the last reduce_grads); with state read between the backward and the step
// (master_shard, which drops the reads) the step reads it itself, and the same check fails.
// Deferred ([zero] defer_update), the update that reads it runs after step() (here at the
// master_shard that follows, which completes the step), from the reads the step handed it.
bool first_state_read_starts_during_the_backward(bool read_state_before_step, bool defer) {
  ScratchDir dir;
  Config config = config_for(dir, Tier::kNvme, Tier::kNvme, false);
  config.zero.defer_update = defer;
  Tracer tracer;
  EngineOptions options;
  options.tracer = &tracer;
  TinyEngine tiny(config, options);
  Engine& engine = tiny.engine;
  TinyMlp& model = tiny.model;
  int reduces = 0;
  Tracer::Clock::time_point first_unit_reduce{};
  model.train_step(engine, 1.0, nullptr, [&](std::vector<float>&) {
    if (++reduces == static_cast<int>(kEngineTestWidths.size()) - 1) {
      first_unit_reduce = Tracer::Clock::now();
    }
  });
  if (read_state_before_step) engine.master_shard(model.units().front());
  const StepStats stats = engine.step();
  EXPECT_EQ(stats.pre_read_groups, read_state_before_step ? 0u : 3u);
  EXPECT_EQ(stats.deferred_groups > 0, defer);
  engine.master_shard(model.units().front());  // a deferred step's updates run first
  for (const Tracer::Event& event : tracer.events()) {
    if (event.track == TraceTrack::kIo && event.name == "NVMe read layer0 [0]") {
      return event.start < first_unit_reduce;
    }
  }
  ADD_FAILURE() << "no trace of the first sub-group's read";
  return false;
}

TEST(PreRead, TheFirstStateReadStartsBeforeTheBackwardOfTheFirstUnit) {
  for (const bool defer : {false, true}) {
    EXPECT_TRUE(first_state_read_starts_during_the_backward(false, defer)) << "defer " << defer;
    EXPECT_FALSE(first_state_read_starts_during_the_backward(true, defer)) << "defer " << defer;
  }
}

// State replaced between a backward and the step (here a checkpoint loaded, then a new backward)
// drops what was read ahead: the step updates the loaded state, bitwise as a host run does.
TEST(PreRead, StateReplacedAfterTheReadsStartIsWhatTheStepUpdates) {
  const auto run = [](Tier tier) {
    ScratchDir dir, checkpoint;
    Config config = config_for(dir, tier, tier, false);
    TinyEngine tiny(config);
    Engine& engine = tiny.engine;
    TinyMlp& model = tiny.model;
    model.train_step(engine, 1.0);
    engine.step();
    engine.save(checkpoint.path() / "step1");
    model.train_step(engine, 1.0);
    engine.step();
    model.train_step(engine, 1.0);  // its reads of step 2's state start here
    engine.load(checkpoint.path() / "step1");
    model.train_step(engine, 1.0);
    const StepStats stats = engine.step();
    std::vector<std::vector<float>> masters;
    for (UnitId unit : model.units()) masters.push_back(engine.master_shard(unit));
    return std::pair(masters, stats.pre_read_groups);
  };
  const auto [host, host_pre_read] = run(Tier::kHost);
  const auto [nvme, nvme_pre_read] = run(Tier::kNvme);
  EXPECT_EQ(nvme_pre_read, 3u) << "the second backward reads the loaded state ahead";
  ASSERT_EQ(host.size(), nvme.size());
  for (std::size_t u = 0; u < host.size(); ++u) {
    ASSERT_EQ(host[u].size(), nvme[u].size());
    EXPECT_EQ(std::memcmp(host[u].data(), nvme[u].data(), host[u].size() * sizeof(float)), 0)
        << "unit " << u;
  }
}

}  // namespace
}  // namespace strata::runtime
