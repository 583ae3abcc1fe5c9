// Proves ZeRO-3 across ranks (run under mpirun -np 1..4): training sharded over N ranks gives the
// parameters of plain data parallelism (full replicas, gradients all-reduced and averaged) within
// fp32 tolerance; every tier placement gives bitwise the same parameters at a fixed N; and each
// rank holds ~1/N of the unsharded state. The staged data path (the code CUDA runs: device memory
// through streams, collectives staged through pinned host buffers) matches the direct one bitwise.
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/debug_knobs.hpp"
#include "base/float16.hpp"
#include "runtime/comm/local_comm.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/engine/trace.hpp"
#include "tests/runtime/comm/mpi_test_main.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"
#include "tests/runtime/engine_test_model.hpp"
#include "tiers/device/device.hpp"

namespace strata::runtime {
namespace {

using comm::mpi_testing::world;
using io::testing::ScratchDir;
using testing::host_device;
using testing::TinyMlp;

const std::vector<std::uint32_t> kWidths = {20, 96, 33, 5};  // uneven: shards need padding

Config make_config(const ScratchDir& dir) {
  Config config = parse_config(R"(
[tiers.device]
kind = "host"
budget = "256MiB"
[tiers.host]
budget = "256MiB"
[zero]
stage = 3
sub_group_size = 2048
[optimizer]
lr = 1e-2
grad_clip = 1.0
[precision]
params = "fp32"
grads = "fp32"
)");
  config.tiers.nvme.paths = {dir.path().string()};
  return config;
}

// Trains 4 steps on this rank's own data; returns every unit's full master weights.
std::vector<std::vector<float>> train_sharded(const Config& config, comm::Communicator& comm,
                                              std::vector<std::uint32_t> widths = kWidths,
                                              std::uint64_t* host_high_water = nullptr,
                                              const EngineOptions& options = {}) {
  auto device = host_device(config);
  Engine engine(config, *device, comm, options);
  TinyMlp model(widths, 8, 100 + static_cast<std::uint32_t>(world().rank()));
  model.add_units(engine);
  engine.finalize();
  for (int step = 0; step < 4; ++step) {
    model.train_step(engine);
    engine.step();
  }
  std::vector<std::vector<float>> masters;
  for (UnitId unit : model.units()) masters.push_back(engine.gather_master(unit));
  if (host_high_water != nullptr) *host_high_water = engine.host_high_water_bytes();
  return masters;
}

TEST(EngineMpi, Zero3MatchesPlainDataParallelism) {
  ScratchDir dir;
  const Config config = make_config(dir);
  const std::vector<std::vector<float>> sharded = train_sharded(config, world());

  // Plain data parallelism: a full replica per rank (a one-rank Engine), the gradients all-reduced
  // and averaged over the real ranks before the update.
  comm::LocalComm local;
  auto device = host_device(config);
  // Rank 0's replica starts afresh in the NVMe path where the sharded run's rank 0 committed
  // (under STRATA_FORCE_NVME=1): on purpose.
  Engine replica(config, *device, local, EngineOptions{.overwrite = true});
  TinyMlp model(kWidths, 8, 100 + static_cast<std::uint32_t>(world().rank()));
  model.add_units(replica);
  replica.finalize();
  for (int step = 0; step < 4; ++step) {
    model.train_step(replica, 1.0, nullptr, [](std::vector<float>& grads) {
      world().all_reduce(std::span<float>(grads), comm::ReduceOp::kAvg);
    });
    replica.step();
  }
  for (std::size_t u = 0; u < model.units().size(); ++u) {
    const std::vector<float> expected = replica.gather_master(model.units()[u]);
    ASSERT_EQ(sharded[u].size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      // Only the order of the global-norm summation differs (per-shard partial sums): the clip
      // coefficients agree to ~1e-7 relative, so parameters agree to a few fp32 ulps of lr steps.
      ASSERT_NEAR(sharded[u][i], expected[i], 2e-6 + 2e-6 * std::fabs(expected[i]))
          << "unit " << u << " element " << i << " with " << world().size() << " ranks";
    }
  }
}

// [precision] reduce_dtype = "auto" with bf16 gradients and one micro-batch: the reduce-scatter
// moves bf16. Its result is plain data parallelism over gradients each rank rounds to bf16 first,
// all-reduced in bf16 (fp32 sums in rank order, the average rounded once; comm/reduction.hpp).
TEST(EngineMpi, SixteenBitReduceIsDataParallelismOverRoundedGradients) {
  ScratchDir dir;
  Config config = make_config(dir);
  config.precision.grads = DType::kBf16;
  ASSERT_EQ(gradient_reduce_dtype(config.precision, 1), DType::kBf16);
  const std::vector<std::vector<float>> sharded = train_sharded(config, world());

  comm::LocalComm local;
  auto device = host_device(config);
  Engine replica(config, *device, local, EngineOptions{.overwrite = true});
  TinyMlp model(kWidths, 8, 100 + static_cast<std::uint32_t>(world().rank()));
  model.add_units(replica);
  replica.finalize();
  for (int step = 0; step < 4; ++step) {
    model.train_step(replica, 1.0, nullptr, [](std::vector<float>& grads) {
      std::vector<Bf16> rounded(grads.size());
      for (std::size_t i = 0; i < grads.size(); ++i) rounded[i] = to_bf16(grads[i]);
      world().all_reduce(std::span<Bf16>(rounded), comm::ReduceOp::kAvg);
      for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = to_float(rounded[i]);
    });
    replica.step();
  }
  for (std::size_t u = 0; u < model.units().size(); ++u) {
    const std::vector<float> expected = replica.gather_master(model.units()[u]);
    ASSERT_EQ(sharded[u].size(), expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      // As in Zero3MatchesPlainDataParallelism: only the global norm's summation order differs.
      ASSERT_NEAR(sharded[u][i], expected[i], 2e-6 + 2e-6 * std::fabs(expected[i]))
          << "unit " << u << " element " << i << " with " << world().size() << " ranks";
    }
  }
}

TEST(EngineMpi, EveryPlacementIsBitwiseIdentical) {
  ScratchDir reference_dir;
  const std::vector<std::vector<float>> reference =
      train_sharded(make_config(reference_dir), world());
  struct Placement {
    Tier params, grads, optimizer;
  };
  const std::array<Placement, 3> placements = {Placement{Tier::kNvme, Tier::kNvme, Tier::kNvme},
                                               Placement{Tier::kHost, Tier::kNvme, Tier::kHost},
                                               Placement{Tier::kNvme, Tier::kHost, Tier::kDevice}};
  for (const auto& [params, grads, optimizer] : placements) {
    ScratchDir dir;
    Config config = make_config(dir);
    config.zero.params = params;
    config.zero.grads = grads;
    config.zero.optimizer = optimizer;
    const std::vector<std::vector<float>> result = train_sharded(config, world());
    for (std::size_t u = 0; u < reference.size(); ++u) {
      EXPECT_EQ(std::memcmp(result[u].data(), reference[u].data(), reference[u].size() * 4), 0)
          << fmt::format("unit {} differs with params {}, grads {}, optimizer {}", u,
                         to_string(params), to_string(grads), to_string(optimizer));
    }
  }
}

// int8 moments + a bf16 master with bf16 parameters: where the parameters are the master's own
// bytes (params and optimizer on one tier) each rank gathers its shard from the master's home;
// that is bitwise the run where they keep their own copy (params on another tier).
TEST(EngineMpi, ParamsInTheMasterAreBitwiseTheirOwnCopy) {
  const auto compressed = [](const ScratchDir& dir, Tier params, Tier grads, Tier optimizer) {
    Config config = make_config(dir);
    config.precision.params = config.precision.grads = DType::kBf16;
    config.optimizer.state_dtype = cpu_adam::StateDType::kInt8;
    config.optimizer.master_dtype = cpu_adam::StateDType::kBf16;
    config.zero.params = params;
    config.zero.grads = grads;
    config.zero.optimizer = optimizer;
    return config;
  };
  ScratchDir reference_dir;
  const std::vector<std::vector<float>> reference =
      train_sharded(compressed(reference_dir, Tier::kDevice, Tier::kDevice, Tier::kHost), world());
  struct Placement {
    Tier params, grads, optimizer;
  };
  for (const auto& [params, grads, optimizer] :
       {Placement{Tier::kNvme, Tier::kNvme, Tier::kNvme},
        Placement{Tier::kHost, Tier::kNvme, Tier::kHost},
        Placement{Tier::kDevice, Tier::kHost, Tier::kDevice}}) {
    for (EngineOptions::DeviceAccess access :
         {EngineOptions::DeviceAccess::kAuto, EngineOptions::DeviceAccess::kStaged}) {
      ScratchDir dir;
      const std::vector<std::vector<float>> result =
          train_sharded(compressed(dir, params, grads, optimizer), world(), kWidths, nullptr,
                        EngineOptions{.device_access = access});
      for (std::size_t u = 0; u < reference.size(); ++u) {
        EXPECT_EQ(std::memcmp(result[u].data(), reference[u].data(), reference[u].size() * 4), 0)
            << fmt::format("unit {} differs with params {}, grads {}, optimizer {}, {} ranks{}", u,
                           to_string(params), to_string(grads), to_string(optimizer),
                           world().size(),
                           access == EngineOptions::DeviceAccess::kStaged ? ", staged" : "");
      }
    }
  }
}

// The staged data path (EngineOptions::DeviceAccess::kStaged) on placements that exercise each
// staging: device-homed shards through streams, host and NVMe homes through pinned memory, the
// all-gather and reduce-scatter on the host between d2h and h2d copies; in bf16 (cast kernels)
// and fp32.
TEST(EngineMpi, StagedPathIsBitwiseIdenticalToTheDirectPath) {
  struct Placement {
    Tier params, grads, optimizer;
  };
  const std::array<Placement, 3> placements = {
      Placement{Tier::kDevice, Tier::kDevice, Tier::kDevice},
      Placement{Tier::kDevice, Tier::kHost, Tier::kNvme},
      Placement{Tier::kNvme, Tier::kNvme, Tier::kHost}};
  for (const DType dtype : {DType::kBf16, DType::kFp32}) {
    for (const auto& [params, grads, optimizer] : placements) {
      ScratchDir dir;
      Config config = make_config(dir);
      config.precision.params = config.precision.grads = dtype;
      config.zero.params = params;
      config.zero.grads = grads;
      config.zero.optimizer = optimizer;
      const std::vector<std::vector<float>> direct = train_sharded(config, world());
      ScratchDir staged_dir;
      config.tiers.nvme.paths = {staged_dir.path().string()};
      EngineOptions staged;
      staged.device_access = EngineOptions::DeviceAccess::kStaged;
      const std::vector<std::vector<float>> result =
          train_sharded(config, world(), kWidths, nullptr, staged);
      for (std::size_t u = 0; u < direct.size(); ++u) {
        EXPECT_EQ(std::memcmp(result[u].data(), direct[u].data(), direct[u].size() * 4), 0)
            << fmt::format(
                   "unit {} differs on the staged path with {} params {}, grads {}, "
                   "optimizer {}",
                   u, to_string(dtype), to_string(params), to_string(grads), to_string(optimizer));
      }
    }
  }
}

// A step mode of GathersStartAheadOfUseAcrossRanks.
struct Step {
  const char* name;
  bool overlap, defer;
};

// The gathers queued ahead over a run, and the master parameters after it.
using GatherRun = std::pair<std::uint64_t, std::vector<std::vector<float>>>;

// Four steps of the tiny MLP with every unit gathered and evicted every step, gathers started
// ahead of use across ranks or not.
GatherRun train_gathering(bool staged, const Step& mode, Tier params, DType dtype, bool ahead) {
  ScratchDir dir;
  Config config = make_config(dir);
  config.zero.params = params;
  config.zero.optimizer = Tier::kNvme;
  config.zero.persistence_threshold = 0;  // every unit gathered and evicted every step
  config.zero.prefetch_depth = 2;
  config.zero.overlap_optimizer = mode.overlap;
  config.zero.defer_update = mode.defer;
  config.precision.params = config.precision.grads = dtype;
  auto device = host_device(config);
  EngineOptions options;
  options.gathers_ahead_across_ranks = ahead;
  if (staged) options.device_access = EngineOptions::DeviceAccess::kStaged;
  Engine engine(config, *device, world(), options);
  TinyMlp model(kWidths, 8, 100 + static_cast<std::uint32_t>(world().rank()));
  model.add_units(engine);
  engine.finalize();
  std::uint64_t queued_ahead = 0;
  for (int step = 0; step < 4; ++step) {
    model.train_step(engine);
    queued_ahead += engine.step().gathers_queued_ahead;
  }
  std::vector<std::vector<float>> masters;
  for (UnitId unit : model.units()) masters.push_back(engine.gather_master(unit));
  return {queued_ahead, masters};
}

// #18: with several ranks a prefetched unit starts its all-gather at its load
// (EngineOptions::gathers_ahead_across_ranks): a shard in memory is sent then; one read from NVMe
// by the Engine's GatherSender once its reads are in, one a deferred update produces by the update
// worker when it is done (both when MPI runs at MPI_THREAD_MULTIPLE). On the staged path (the code
// CUDA runs with collectives on the host) into a pinned slot, h2d and cast at wait_load.
// Counted by StepStats::gathers_queued_ahead; the parameters stay bitwise those of gathers run at
// use, with the serial, overlapped and deferred steps, bf16 and fp32 parameters. The overlapped
// step prefetches the next iteration's first units under its updates: each starts its gather
// once its update is done (one rank on the staged path: queued), so it starts as many ahead as
// the serial step, which prefetches them after the updates.
TEST(EngineMpi, GathersStartAheadOfUseAcrossRanks) {
  std::map<std::tuple<bool, Tier, DType>, std::uint64_t> serial_ahead;
  for (const bool staged : {false, true}) {
    for (const Step& mode : {Step{"serial", false, false}, Step{"overlapped", true, false},
                             Step{"deferred", true, true}}) {
      for (const Tier params : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
        for (const DType dtype : {DType::kBf16, DType::kFp32}) {
          SCOPED_TRACE(fmt::format("{} path, {} step, params on {}, {}, {} ranks",
                                   staged ? "staged" : "direct", mode.name, to_string(params),
                                   to_string(dtype), world().size()));
          const auto [ahead_count, ahead] = train_gathering(staged, mode, params, dtype, true);
          const auto [at_use_count, at_use] = train_gathering(staged, mode, params, dtype, false);
          const bool read = params == Tier::kNvme || force_nvme_knob();
          // Shards read from NVMe, and on the staged path shards copied d2h from a device home,
          // are sent by another thread: MPI_THREAD_MULTIPLE.
          const bool staged_device = staged && params == Tier::kDevice && !force_nvme_knob();
          const bool sent_later = read || staged_device;
          const std::tuple key{staged, params, dtype};
          if (!mode.overlap) {
            serial_ahead[key] = ahead_count;
          } else if (!mode.defer &&
                     (world().size() > 1 ? !sent_later || world().sends_from_any_thread()
                                         : !read)) {
            // (NVMe shards with one rank queue once their reads land, which the serial step
            // sees at use as often as not; below MPI_THREAD_MULTIPLE the serial step gathers
            // NVMe shards, and staged device-homed ones, at use.)
            EXPECT_EQ(ahead_count, serial_ahead.at(key))
                << "the overlapped step starts fewer gathers ahead than the serial step";
          }
          if (!staged || world().size() > 1) {  // (one rank queues its staged gathers)
            EXPECT_EQ(at_use_count, 0u);
          }
          if (world().size() == 1) {
            if (!staged) {
              EXPECT_EQ(ahead_count, 0u);  // one rank gathers no collective
            }
          } else if (staged && mode.defer) {
            // The staged path's deferred updates run on the update worker, and a deferred unit's
            // gather runs at wait_load, once its update is done (gather.cpp, sends_after_update).
          } else if (!sent_later || world().sends_from_any_thread()) {
            EXPECT_GT(ahead_count, 0u);
          }
          for (std::size_t u = 0; u < at_use.size(); ++u) {
            EXPECT_EQ(std::memcmp(ahead[u].data(), at_use[u].data(), at_use[u].size() * 4), 0)
                << "unit " << u << " differs from gathers at use";
          }
        }
      }
    }
  }
}

Config ahead_config(const ScratchDir& dir, Tier params) {
  Config config = make_config(dir);
  config.zero.params = params;  // host or NVMe: every load starts its gather
  config.zero.persistence_threshold = 0;
  config.zero.prefetch_depth = 2;
  return config;
}

// #18: several ranks on the staged path (the code CUDA runs, collectives over MPI): a gather
// started ahead whose blocks are all in by the model's next gather() has its h2d copy and cast
// queued on the device streams then (the trace's "queue gather"), not at wait_load, and the
// parameters stay bitwise those of gathers at use, params on the device (copied d2h into the slot
// and sent by the GatherSender), the host and NVMe. The backward sleeps before each
// reduce_grads, so the blocks of the units prefetched at its gather() are in by the next one:
// MPI moves bytes only inside MPI calls, and the blocks here are small enough to go eagerly
// (under 4 KiB: a larger one takes a handshake, which needs more than one test on each side).
TEST(EngineMpi, StagedGathersQueueTheirCopyOnceTheBlocksAreIn) {
  if (world().size() == 1) {
    GTEST_SKIP() << "one rank has no collective: its staged gathers are queued at the load";
  }
  for (const Tier params : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
    if (params != Tier::kHost && !world().sends_from_any_thread()) {
      continue;  // below MPI_THREAD_MULTIPLE shards read from NVMe or a device home gather at use
    }
    SCOPED_TRACE(fmt::format("params on {}, {} ranks", to_string(params), world().size()));
    const auto run = [&](bool ahead, Tracer* tracer) {
      ScratchDir dir;
      const Config config = ahead_config(dir, params);
      auto device = host_device(config);
      EngineOptions options;
      options.gathers_ahead_across_ranks = ahead;
      options.device_access = EngineOptions::DeviceAccess::kStaged;
      options.tracer = tracer;
      Engine engine(config, *device, world(), options);
      TinyMlp model({20, 24, 9, 5}, 8, 100 + static_cast<std::uint32_t>(world().rank()));
      model.add_units(engine);
      engine.finalize();
      for (int step = 0; step < 6; ++step) {
        model.train_step(engine, 1.0, nullptr, [](std::vector<float>&) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        });
        engine.step();
      }
      std::vector<std::vector<float>> masters;
      for (UnitId unit : model.units()) masters.push_back(engine.gather_master(unit));
      return masters;
    };
    Tracer tracer;
    const auto ahead = run(true, &tracer);
    const auto at_use = run(false, nullptr);
    std::size_t queued = 0;
    for (const Tracer::Event& event : tracer.events()) {
      if (event.name.starts_with("queue gather ")) ++queued;
    }
    EXPECT_GT(queued, 0u) << "no staged gather had its copy queued before wait_load";
    for (std::size_t u = 0; u < at_use.size(); ++u) {
      EXPECT_EQ(std::memcmp(ahead[u].data(), at_use[u].data(), at_use[u].size() * 4), 0)
          << "unit " << u << " differs from gathers at use";
    }
  }
}

// Two Engines on one communicator, their steps interleaved, both with gathers started ahead (the
// same unit ids): each trains bitwise as it does alone (their gathers' keys never meet); and an
// Engine dropped at a different moment on each rank (as Python's collector does) ends without
// waiting for the peers' Engine calls, its unused prefetched gathers complete. Parameters on the
// host (sent at the start) and on NVMe (sent by the GatherSender when the reads are in).
class EngineMpiAhead : public ::testing::TestWithParam<Tier> {};

TEST_P(EngineMpiAhead, GathersOfEnginesSharingACommunicatorStayApart) {
  const Tier params = GetParam();
  const auto alone = [params](std::uint32_t seed) {
    ScratchDir dir;
    const Config config = ahead_config(dir, params);
    auto device = host_device(config);
    Engine engine(config, *device, world());
    TinyMlp model(kWidths, 8, seed + static_cast<std::uint32_t>(world().rank()));
    model.add_units(engine);
    engine.finalize();
    for (int step = 0; step < 3; ++step) {
      model.train_step(engine);
      engine.step();
    }
    std::vector<std::vector<float>> masters;
    for (UnitId unit : model.units()) masters.push_back(engine.gather_master(unit));
    return masters;
  };
  const auto expected_a = alone(100);
  const auto expected_b = alone(300);

  ScratchDir dir_a, dir_b;
  const Config config_a = ahead_config(dir_a, params), config_b = ahead_config(dir_b, params);
  auto device_a = host_device(config_a);
  auto device_b = host_device(config_b);
  auto engine_a = std::make_unique<Engine>(config_a, *device_a, world());
  Engine engine_b(config_b, *device_b, world());
  TinyMlp model_a(kWidths, 8, 100 + static_cast<std::uint32_t>(world().rank()));
  TinyMlp model_b(kWidths, 8, 300 + static_cast<std::uint32_t>(world().rank()));
  model_a.add_units(*engine_a);
  model_b.add_units(engine_b);
  engine_a->finalize();
  engine_b.finalize();
  std::uint64_t ahead = 0;
  for (int step = 0; step < 3; ++step) {
    model_a.train_step(*engine_a);
    model_b.train_step(engine_b);
    ahead += engine_a->step().gathers_queued_ahead;
    ahead += engine_b.step().gathers_queued_ahead;
  }
  const bool read = params == Tier::kNvme || force_nvme_knob();
  if (world().size() > 1 && (!read || world().sends_from_any_thread())) {
    EXPECT_GT(ahead, 0u);
  }
  for (std::size_t u = 0; u < expected_a.size(); ++u) {
    const std::vector<float> master_a = engine_a->gather_master(model_a.units()[u]);
    EXPECT_EQ(std::memcmp(master_a.data(), expected_a[u].data(), master_a.size() * 4), 0)
        << "engine A, unit " << u;
    const std::vector<float> master_b = engine_b.gather_master(model_b.units()[u]);
    EXPECT_EQ(std::memcmp(master_b.data(), expected_b[u].data(), master_b.size() * 4), 0)
        << "engine B, unit " << u;
  }
  // Engine A's next forward starts (its next units' gathers in flight), then A is dropped: on
  // rank 0 before B's next step, on the others after it. A hang here fails the test by timeout.
  { const GatheredUnit first = engine_a->gather(model_a.units()[0]); }
  if (world().rank() == 0) engine_a.reset();
  model_b.train_step(engine_b);
  engine_b.step();
  engine_a.reset();
  for (UnitId unit : model_b.units()) {
    for (float value : engine_b.gather_master(unit)) ASSERT_TRUE(std::isfinite(value));
  }
}

INSTANTIATE_TEST_SUITE_P(Params, EngineMpiAhead, ::testing::Values(Tier::kHost, Tier::kNvme),
                         [](const ::testing::TestParamInfo<Tier>& tier) {
                           return std::string(to_string(tier.param));
                         });

// `strata plan` for a CUDA device under mpirun counts the pinned slots the staged path's gathers
// started ahead receive into: the Engine on the staged path (the host device's emulation of it)
// allocates exactly the host memory the plan prints, with the slots and, under
// STRATA_GATHERS_AT_USE, without them.
TEST(EngineMpi, StagedPathAllocatesTheHostMemoryThePlanPrints) {
  if (force_nvme_knob()) GTEST_SKIP() << "STRATA_FORCE_NVME moves the state behind the plan's back";
  ScratchDir dir;
  Config config = make_config(dir);
  config.zero.params = Tier::kHost;
  config.zero.grads = Tier::kHost;
  config.zero.optimizer = Tier::kHost;
  config.zero.persistence_threshold = 0;
  config.zero.prefetch_depth = 2;
  PlanInputs inputs;
  inputs.ranks = static_cast<std::uint32_t>(world().size());
  for (std::size_t layer = 0; layer + 1 < kWidths.size(); ++layer) {
    const std::uint64_t numel =
        std::uint64_t{kWidths[layer]} * kWidths[layer + 1] + kWidths[layer + 1];
    inputs.unit_numels.push_back(numel);
    inputs.params += numel;
  }
  Config planned = config;
  planned.tiers.device.kind = DeviceKind::kCuda;  // the plan reads the data path from the kind
  const std::uint64_t planned_host =
      make_memory_plan(planned, inputs).tier(Tier::kHost).total_bytes();
  auto device = host_device(config);
  Engine engine(config, *device, world(),
                EngineOptions{.device_access = EngineOptions::DeviceAccess::kStaged});
  TinyMlp model(kWidths, 8, 100 + static_cast<std::uint32_t>(world().rank()));
  model.set_device(*device);
  model.add_units(engine);
  engine.finalize();
  std::uint64_t ahead = 0;
  for (int step = 0; step < 2; ++step) {
    model.train_step(engine);
    ahead += engine.step().gathers_queued_ahead;
  }
  EXPECT_EQ(engine.host_high_water_bytes(), planned_host);
  if (world().size() > 1 && !gathers_at_use_knob()) {
    EXPECT_GT(ahead, 0u);
  }
}

TEST(EngineMpi, EachRankHoldsAboutOneNthOfTheState) {
  if (force_nvme_knob()) {
    GTEST_SKIP() << "STRATA_FORCE_NVME moves the host-homed state this test measures";
  }
  ScratchDir dir;
  Config config = make_config(dir);
  config.zero.params = Tier::kHost;
  config.zero.grads = Tier::kHost;
  config.zero.optimizer = Tier::kHost;
  const std::vector<std::uint32_t> widths = {256, 512, 256};  // 2 units of 131k parameters
  std::uint64_t sharded_bytes = 0;
  train_sharded(config, world(), widths, &sharded_bytes);
  comm::LocalComm local;
  std::uint64_t unsharded_bytes = 0;
  {
    auto device = host_device(config);
    Engine engine(config, *device, local);
    TinyMlp model(widths, 8, 1);
    model.add_units(engine);
    engine.finalize();
    unsharded_bytes = engine.host_high_water_bytes();
  }
  const double ranks = world().size();
  // Host-homed state only (no NVMe staging): 16 B per parameter and as much again for the copies
  // that undo speculative updates ([zero] overlap_optimizer), each shard padded up to a multiple of
  // 2048 elements (at most 2048 · 32 B per unit and rank).
  const double padding = 2.0 * 2048 * 32;
  EXPECT_LE(static_cast<double>(sharded_bytes), unsharded_bytes / ranks + padding);
  EXPECT_GE(static_cast<double>(sharded_bytes), unsharded_bytes / ranks - padding);
}

// The communication tests' model: every unit padded to 2048 elements per rank, so each gather or
// reduce-scatter of a unit moves unit_bytes() in fp32.
std::uint64_t unit_bytes() {
  return 2048ull * world().size() * 4;
}

// The collective payload of the third step (`micro_batches` micro-batches each) with every kind in
// host memory, no prefetch, no persistent units, and device room besides the scratch (one padded
// unit and one shard of gradients in fp32, the all-gather's send copy of a shard) for
// `gathered_units` gathered units. `change` adjusts the config first.
std::uint64_t third_step_comm_bytes(std::uint32_t gathered_units, std::uint32_t micro_batches,
                                    const std::function<void(Config&)>& change = {}) {
  ScratchDir dir;
  Config config = make_config(dir);
  config.zero.persistence_threshold = 0;
  config.zero.prefetch_depth = 0;
  config.zero.params = Tier::kHost;
  config.zero.grads = Tier::kHost;
  config.zero.optimizer = Tier::kHost;
  const std::uint64_t scratch_bytes = unit_bytes() + 2 * 2048 * 4;
  config.tiers.device.budget_bytes = scratch_bytes + gathered_units * unit_bytes();
  if (change) change(config);
  auto device = host_device(config);
  Engine engine(config, *device, world(), EngineOptions{.grad_accumulation = micro_batches});
  TinyMlp model(kWidths, 8, 1);
  model.add_units(engine);
  engine.finalize();
  StepStats stats;
  for (int step = 0; step < 3; ++step) {
    for (std::uint32_t m = 0; m < micro_batches; ++m) model.train_step(engine);
    stats = engine.step();
  }
  return stats.comm_bytes;
}

// The measured collective volume per step follows the plan: stage 3 gathers a unit for the forward
// and again for the backward when the device has room for only one gathered unit (the last unit's
// forward and backward share one gather), and reduce-scatters every gradient: ~3Ψ. Stage 2 keeps
// the gathered parameters for the whole step: one gather per unit, 2Ψ. With two micro-batches
// each reduce-scatters every gradient (six unit reduce-scatters per step); stage 2 still gathers
// each unit once per step, stage 3 for each micro-batch's forward and backward (the plan's
// (1 + m)Ψ and 3mΨ; a unit still gathered across a backward/forward boundary, the first, is not
// gathered again: 9 rather than 10).
TEST(EngineMpi, CommunicationVolumeFollowsThePlanPerStageAndMicroBatch) {
  if (world().size() == 1) GTEST_SKIP() << "one rank communicates nothing";
  const std::uint64_t norm_bytes = 8ull * world().size();
  for (std::uint32_t stage : {2u, 3u}) {
    for (std::uint32_t micro_batches : {1u, 2u}) {
      const std::uint64_t bytes =
          third_step_comm_bytes(stage == 3 ? 1 : 3, micro_batches,
                                [stage](Config& config) { config.zero.stage = stage; });
      const std::uint64_t unit_gathers = stage == 2 ? 3 : micro_batches == 1 ? 5 : 9;
      const std::uint64_t reduce_scatters = 3 * micro_batches;
      EXPECT_EQ(bytes, (unit_gathers + reduce_scatters) * unit_bytes() + norm_bytes)
          << "stage " << stage << ", " << micro_batches << " micro-batch(es): "
          << bytes / unit_bytes() << " unit transfers";
    }
  }
}

// The same step with bf16 gradients: reduce_dtype "auto" reduce-scatters them in bf16, half the
// gradient bytes of "fp32"; the fp32 parameter gathers are unchanged.
TEST(EngineMpi, SixteenBitReduceHalvesTheGradientBytes) {
  if (world().size() == 1) GTEST_SKIP() << "one rank communicates nothing";
  const auto step_bytes = [](std::optional<DType> reduce_dtype) {
    return third_step_comm_bytes(1, 1, [reduce_dtype](Config& config) {
      config.precision.grads = DType::kBf16;
      config.precision.reduce_dtype = reduce_dtype;
    });
  };
  const std::uint64_t fp32 = step_bytes(DType::kFp32);
  const std::uint64_t automatic = step_bytes(std::nullopt);
  const std::uint64_t reduce_scatters = 3;
  EXPECT_EQ(fp32 - automatic, reduce_scatters * unit_bytes() / 2)
      << "fp32 " << fp32 << " B, auto " << automatic << " B per step";
}

}  // namespace
}  // namespace strata::runtime
