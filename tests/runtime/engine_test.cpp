// Proves the Engine's central invariant: offloading changes where bytes live, not the mathematics.
// A small MLP trained for several steps gives bitwise identical parameters, optimizer state and
// losses for every tier placement, prefetch depth, buffer count and thread count; it matches an
// independent dense fp32 AdamW; and it runs within a host budget far below the model state. Each
// placement also runs on the staged data path (EngineOptions::DeviceAccess::kStaged: the code CUDA
// runs, every device access through streams and events) and must match the direct path bitwise.
#include "runtime/engine/engine.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <tuple>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/debug_knobs.hpp"
#include "runtime/comm/local_comm.hpp"
#include "runtime/plan/partition.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"
#include "tests/runtime/engine_test_model.hpp"
#include "tiers/device/device.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using ::testing::HasSubstr;
using testing::host_device;
using testing::kEngineTestWidths;
using testing::TinyMlp;

constexpr int kSteps = 4;

// STRATA_FORCE_NVME=1 re-runs the suite with every state kind on NVMe (docs/design.md); tests of
// placement-specific behaviour then have nothing to check.
bool nvme_forced() {
  return force_nvme_knob();
}

struct RunResult {
  std::vector<float> losses;
  std::vector<std::vector<float>> masters;
  std::vector<std::vector<float>> exp_avgs;
  std::vector<std::vector<float>> exp_avg_sqs;
  std::uint64_t host_high_water = 0;
  std::uint64_t nvme_bytes = 0;  // read + written over the run's steps
  std::uint64_t device_updated_groups = 0;  // sub-groups the device's optimizer op updated
};

Config base_config(const ScratchDir& dir) {
  return testing::engine_test_config(dir.path().string());
}

RunResult train(const Config& config, int steps = kSteps, const EngineOptions& options = {}) {
  auto device = host_device(config);
  comm::LocalComm comm;
  Engine engine(config, *device, comm, options);
  TinyMlp model(kEngineTestWidths, 16, /*data_seed=*/7);
  model.add_units(engine);
  engine.finalize();
  RunResult result;
  for (int step = 0; step < steps; ++step) {
    result.losses.push_back(model.train_step(engine));
    const StepStats stats = engine.step();
    result.nvme_bytes += stats.nvme.read_bytes + stats.nvme.written_bytes;
    result.device_updated_groups += stats.device_updated_groups;
    EXPECT_FALSE(stats.skipped);
    EXPECT_EQ(stats.step, static_cast<std::uint64_t>(step + 1));
  }
  for (UnitId unit : model.units()) {
    result.masters.push_back(engine.master_shard(unit));
    result.exp_avgs.push_back(engine.state_shard(unit, OptimizerState::kExpAvg));
    result.exp_avg_sqs.push_back(engine.state_shard(unit, OptimizerState::kExpAvgSq));
  }
  result.host_high_water = engine.host_high_water_bytes();
  return result;
}

void expect_bitwise_equal(const RunResult& a, const RunResult& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (std::size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&a.losses[i], &b.losses[i], sizeof(float)), 0)
        << what << ": loss of step " << i << " differs: " << a.losses[i] << " vs " << b.losses[i];
  }
  const auto same = [&](const std::vector<std::vector<float>>& x,
                        const std::vector<std::vector<float>>& y, const char* kind) {
    ASSERT_EQ(x.size(), y.size());
    for (std::size_t u = 0; u < x.size(); ++u) {
      ASSERT_EQ(x[u].size(), y[u].size());
      EXPECT_EQ(std::memcmp(x[u].data(), y[u].data(), x[u].size() * sizeof(float)), 0)
          << what << ": " << kind << " of unit " << u << " differs";
    }
  };
  same(a.masters, b.masters, "master");
  same(a.exp_avgs, b.exp_avgs, "exp_avg");
  same(a.exp_avg_sqs, b.exp_avg_sqs, "exp_avg_sq");
}

TEST(Engine, TrainingLowersTheLoss) {
  ScratchDir dir;
  const RunResult result = train(base_config(dir), 12);
  EXPECT_LT(result.losses.back(), 0.7f * result.losses.front());
}

using Access = EngineOptions::DeviceAccess;
EngineOptions with_access(Access access, EngineOptions options = {}) {
  options.device_access = access;
  return options;
}
std::string access_name(Access access) {
  return access == Access::kStaged ? "staged" : "direct";
}

// Every placement of params, grads and optimizer state on device / host / NVMe, on the direct and
// the staged data path; the reference is all on the device, direct.
class EnginePlacement : public ::testing::TestWithParam<std::tuple<Tier, Tier, Tier, Access>> {};

TEST_P(EnginePlacement, IsBitwiseIdenticalToAllOnDevice) {
  ScratchDir reference_dir;
  const RunResult reference = train(base_config(reference_dir));
  ScratchDir dir;
  Config config = base_config(dir);
  std::tie(config.zero.params, config.zero.grads, config.zero.optimizer, std::ignore) = GetParam();
  const Access access = std::get<3>(GetParam());
  const RunResult result = train(config, kSteps, with_access(access));
  const bool on_nvme = config.zero.params == Tier::kNvme || config.zero.grads == Tier::kNvme ||
                       config.zero.optimizer == Tier::kNvme;
  if (!nvme_forced()) {
    EXPECT_EQ(result.nvme_bytes > 0, on_nvme) << "NVMe traffic " << result.nvme_bytes;
  }
  expect_bitwise_equal(reference, result,
                       fmt::format("params {}, grads {}, optimizer {}, {} path",
                                   to_string(config.zero.params), to_string(config.zero.grads),
                                   to_string(config.zero.optimizer), access_name(access)));
}

INSTANTIATE_TEST_SUITE_P(
    AllTiers, EnginePlacement,
    ::testing::Combine(::testing::Values(Tier::kDevice, Tier::kHost, Tier::kNvme),
                       ::testing::Values(Tier::kDevice, Tier::kHost, Tier::kNvme),
                       ::testing::Values(Tier::kDevice, Tier::kHost, Tier::kNvme),
                       ::testing::Values(Access::kAuto, Access::kStaged)),
    [](const auto& param_info) {
      return fmt::format(
          "params_{}_grads_{}_optimizer_{}_{}", to_string(std::get<0>(param_info.param)),
          to_string(std::get<1>(param_info.param)), to_string(std::get<2>(param_info.param)),
          access_name(std::get<3>(param_info.param)));
    });

// [zero] optimizer_host_fraction keeps part of the NVMe-homed optimizer state in host memory:
// bitwise the same as all on the device for every fraction, and the NVMe traffic is gone when all
// of it stays on the host.
class EngineOptimizerHostFraction : public ::testing::TestWithParam<double> {};

TEST_P(EngineOptimizerHostFraction, IsBitwiseIdenticalToAllOnDevice) {
  ScratchDir reference_dir;
  const RunResult reference = train(base_config(reference_dir));
  ScratchDir dir;
  Config config = base_config(dir);
  config.zero.optimizer = Tier::kNvme;
  config.zero.optimizer_host_fraction = GetParam();
  const RunResult result = train(config);
  expect_bitwise_equal(reference, result,
                       fmt::format("optimizer_host_fraction {}", GetParam()));
  if (nvme_forced()) return;
  ScratchDir all_nvme_dir;
  Config all_nvme = base_config(all_nvme_dir);
  all_nvme.zero.optimizer = Tier::kNvme;
  const std::uint64_t all_nvme_bytes = train(all_nvme).nvme_bytes;
  EXPECT_LE(result.nvme_bytes, all_nvme_bytes);
  EXPECT_EQ(result.nvme_bytes == 0, GetParam() == 1.0) << result.nvme_bytes;
}

INSTANTIATE_TEST_SUITE_P(Fractions, EngineOptimizerHostFraction,
                         ::testing::Values(0.25, 0.5, 0.75, 1.0),
                         [](const auto& param_info) {
                           return fmt::format("percent_{}",
                                              static_cast<int>(param_info.param * 100));
                         });

// [zero] optimizer_device_fraction keeps the first units' optimizer state on the device, beside a
// host- or NVMe-homed rest (and optimizer_host_fraction's units after them): bitwise the same as
// all on the device, on both data paths. On the staged path (the code CUDA runs) the device's
// optimizer op updates those units in place, and the CPU the others.
struct DeviceFraction {
  Tier optimizer;
  double device, host;
  Access access;
};

class EngineOptimizerDeviceFraction : public ::testing::TestWithParam<DeviceFraction> {};

TEST_P(EngineOptimizerDeviceFraction, IsBitwiseIdenticalToAllOnDevice) {
  const DeviceFraction fraction = GetParam();
  ScratchDir reference_dir;
  const RunResult reference = train(base_config(reference_dir));
  ScratchDir dir;
  Config config = base_config(dir);
  config.zero.params = config.zero.grads = Tier::kDevice;
  config.zero.optimizer = fraction.optimizer;
  config.zero.optimizer_device_fraction = fraction.device;
  config.zero.optimizer_host_fraction = fraction.host;
  const RunResult result = train(config, kSteps, with_access(fraction.access));
  const std::string what =
      fmt::format("optimizer {}, optimizer_device_fraction {}, optimizer_host_fraction {}, {} path",
                  to_string(fraction.optimizer), fraction.device, fraction.host,
                  access_name(fraction.access));
  expect_bitwise_equal(reference, result, what);
  if (nvme_forced()) return;
  if (fraction.access == Access::kAuto) {
    EXPECT_EQ(result.device_updated_groups, 0u) << what << ": the CPU updates addressable state";
    return;
  }
  // Staged: the device share is updated by the device, the rest by the CPU.
  ScratchDir all_device_dir;
  Config all_device_config = base_config(all_device_dir);
  all_device_config.zero.optimizer = Tier::kDevice;
  const RunResult all_device = train(all_device_config, kSteps, with_access(Access::kStaged));
  ASSERT_GT(all_device.device_updated_groups, 0u);
  EXPECT_GT(result.device_updated_groups, 0u) << what;
  if (fraction.device < 1.0) {
    EXPECT_LT(result.device_updated_groups, all_device.device_updated_groups) << what;
  } else {
    EXPECT_EQ(result.device_updated_groups, all_device.device_updated_groups) << what;
  }
  // Every NVMe case below leaves the last unit (the model's third) on NVMe.
  EXPECT_EQ(result.nvme_bytes > 0, fraction.optimizer == Tier::kNvme)
      << what << ": NVMe traffic " << result.nvme_bytes;
}

INSTANTIATE_TEST_SUITE_P(
    Fractions, EngineOptimizerDeviceFraction,
    // The units' shards hold 2048, 4096 and 2048 of 8192 elements: 0.4 keeps the first on the
    // device (0.6 too: the second does not fit), 0.6 after it the second on the host.
    ::testing::Values(DeviceFraction{Tier::kHost, 0.4, 0.0, Access::kStaged},
                      DeviceFraction{Tier::kHost, 0.6, 0.0, Access::kAuto},
                      DeviceFraction{Tier::kHost, 1.0, 0.0, Access::kStaged},
                      DeviceFraction{Tier::kNvme, 0.6, 0.0, Access::kStaged},
                      DeviceFraction{Tier::kNvme, 0.4, 0.6, Access::kStaged},
                      DeviceFraction{Tier::kNvme, 0.4, 0.6, Access::kAuto}),
    [](const auto& param_info) {
      const DeviceFraction& f = param_info.param;
      return fmt::format("optimizer_{}_device_{}_host_{}_{}", to_string(f.optimizer),
                         static_cast<int>(f.device * 100), static_cast<int>(f.host * 100),
                         access_name(f.access));
    });

// A unit whose optimizer state the device keeps is not updated by the CPU on the staged path: the
// all-host optimizer updates nothing on the device.
TEST(EngineOptimizerDeviceFractionCounts, NoDeviceUpdatesWithoutTheShare) {
  if (nvme_forced()) GTEST_SKIP() << "STRATA_FORCE_NVME homes the optimizer on NVMe";
  ScratchDir dir;
  Config config = base_config(dir);
  config.zero.optimizer = Tier::kHost;
  EXPECT_EQ(train(config, kSteps, with_access(Access::kStaged)).device_updated_groups, 0u);
}

// [zero] params_host_fraction and grads_host_fraction do the same for the parameters and the
// gradients (with the optimizer's share too in one case), on both data paths: bitwise the same as
// all on the device, and no NVMe traffic when every kind stays on the host.
struct HostFractions {
  double params, grads, optimizer;
  Access access;
};

class EngineParamsGradsHostFraction : public ::testing::TestWithParam<HostFractions> {};

TEST_P(EngineParamsGradsHostFraction, IsBitwiseIdenticalToAllOnDevice) {
  const HostFractions fractions = GetParam();
  ScratchDir reference_dir;
  const RunResult reference = train(base_config(reference_dir));
  ScratchDir dir;
  Config config = base_config(dir);
  config.zero.params = config.zero.grads = config.zero.optimizer = Tier::kNvme;
  config.zero.params_host_fraction = fractions.params;
  config.zero.grads_host_fraction = fractions.grads;
  config.zero.optimizer_host_fraction = fractions.optimizer;
  const RunResult result = train(config, kSteps, with_access(fractions.access));
  expect_bitwise_equal(reference, result,
                       fmt::format("params_host_fraction {}, grads_host_fraction {}, "
                                   "optimizer_host_fraction {}, {} path",
                                   fractions.params, fractions.grads, fractions.optimizer,
                                   access_name(fractions.access)));
  if (nvme_forced()) return;
  const bool all_on_host =
      fractions.params == 1.0 && fractions.grads == 1.0 && fractions.optimizer == 1.0;
  EXPECT_EQ(result.nvme_bytes == 0, all_on_host) << result.nvme_bytes;
}

INSTANTIATE_TEST_SUITE_P(
    Fractions, EngineParamsGradsHostFraction,
    ::testing::Values(HostFractions{0.25, 0.75, 0.0, Access::kAuto},
                      HostFractions{0.5, 0.5, 0.5, Access::kStaged},
                      HostFractions{0.75, 0.25, 0.0, Access::kStaged},
                      HostFractions{1.0, 0.0, 0.0, Access::kAuto},
                      HostFractions{0.0, 1.0, 0.0, Access::kAuto},
                      HostFractions{1.0, 1.0, 1.0, Access::kStaged}),
    [](const auto& param_info) {
      const HostFractions& f = param_info.param;
      return fmt::format("params_{}_grads_{}_optimizer_{}_{}", static_cast<int>(f.params * 100),
                         static_cast<int>(f.grads * 100), static_cast<int>(f.optimizer * 100),
                         access_name(f.access));
    });

// [tiers.host] nvme_read_cache: spare host memory serves the NVMe reads from copies, every write
// still goes to the drives. Bitwise the same as all on the device, and with room for everything
// no NVMe read at all (every extent is written before it is first read), while the writes remain.
TEST(Engine, NvmeReadCacheServesReadsAndWritesStillReachTheDrives) {
  ScratchDir reference_dir;
  const RunResult reference = train(base_config(reference_dir));
  const auto all_nvme = [](const ScratchDir& dir, bool cache) {
    Config config = base_config(dir);
    config.zero.params = config.zero.grads = config.zero.optimizer = Tier::kNvme;
    config.tiers.host.nvme_read_cache = cache;
    return config;
  };
  const auto read_bytes = [](const Config& config) {
    auto device = host_device(config);
    comm::LocalComm comm;
    Engine engine(config, *device, comm);
    TinyMlp model(kEngineTestWidths, 16, /*data_seed=*/7);
    model.add_units(engine);
    engine.finalize();
    std::uint64_t read = 0;
    for (int step = 0; step < kSteps; ++step) {
      model.train_step(engine);
      read += engine.step().nvme.read_bytes;
    }
    return read;
  };
  ScratchDir uncached_dir, cached_dir, cached_run_dir;
  const std::uint64_t uncached_reads = read_bytes(all_nvme(uncached_dir, false));
  ASSERT_GT(uncached_reads, 0u);
  // Without clipping no speculative update is undone ([zero] overlap_optimizer; an undone one
  // drops its extents' cached copies, NvmeStore::discard, and they are read from the drive).
  Config unclipped = all_nvme(cached_dir, true);
  unclipped.optimizer.grad_clip = 0;
  EXPECT_EQ(read_bytes(unclipped), 0u) << "the 64 MiB budget holds every extent";
  const RunResult cached = train(all_nvme(cached_run_dir, true));
  expect_bitwise_equal(reference, cached, "nvme_read_cache");
  EXPECT_GT(cached.nvme_bytes, 0u);  // the writes
}

// Prefetch depth, buffer count, sub-group size, persistence and thread count change nothing.
TEST(Engine, KnobsDoNotChangeTheResult) {
  ScratchDir reference_dir;
  Config reference_config = base_config(reference_dir);
  reference_config.zero.params = Tier::kNvme;
  reference_config.zero.optimizer = Tier::kNvme;
  const RunResult reference = train(reference_config);
  struct Knobs {
    std::uint32_t prefetch_depth, buffer_count, threads;
    std::uint64_t sub_group_size, persistence_threshold;
  };
  for (const Knobs& knobs : {Knobs{0, 2, 1, 2048, 0}, Knobs{1, 3, 2, 4096, 0},
                             Knobs{3, 5, 2, 1 << 20, 100000}, Knobs{8, 2, 1, 6144, 500}}) {
    ScratchDir dir;
    Config config = base_config(dir);
    config.zero.params = Tier::kNvme;
    config.zero.optimizer = Tier::kNvme;
    config.zero.prefetch_depth = knobs.prefetch_depth;
    config.zero.buffer_count = knobs.buffer_count;
    config.optimizer.threads = knobs.threads;
    config.zero.sub_group_size = knobs.sub_group_size;
    config.zero.persistence_threshold = knobs.persistence_threshold;
    for (Access access : {Access::kAuto, Access::kStaged}) {
      // The second access path starts afresh over the first one's store, on purpose.
      expect_bitwise_equal(
          reference, train(config, kSteps, with_access(access, EngineOptions{.overwrite = true})),
          fmt::format("prefetch {} buffers {} threads {} sub-group {} persist {} {} path",
                      knobs.prefetch_depth, knobs.buffer_count, knobs.threads, knobs.sub_group_size,
                      knobs.persistence_threshold, access_name(access)));
    }
  }
}

// An independent dense fp32 AdamW over the same gradients (with the same global-norm clipping).
TEST(Engine, MatchesAPlainDenseAdamW) {
  ScratchDir dir;
  Config config = base_config(dir);
  config.precision.params = DType::kFp32;
  config.precision.grads = DType::kFp32;
  config.zero.optimizer = Tier::kNvme;
  auto device = host_device(config);
  comm::LocalComm comm;
  Engine engine(config, *device, comm);
  TinyMlp model(kEngineTestWidths, 16, 7);
  model.add_units(engine);
  engine.finalize();

  std::vector<std::vector<double>> params, m, v;
  for (UnitId unit : model.units()) {
    const std::vector<float> initial = engine.gather_master(unit);
    params.emplace_back(initial.begin(), initial.end());
    m.emplace_back(initial.size(), 0.0);
    v.emplace_back(initial.size(), 0.0);
  }
  const OptimizerConfig& opt = config.optimizer;
  for (int step = 1; step <= 6; ++step) {
    std::vector<std::vector<float>> grads;
    model.train_step(engine, 1.0, &grads);
    engine.step();
    double sum = 0;
    for (const auto& unit_grads : grads) {
      for (float g : unit_grads) sum += static_cast<double>(g) * g;
    }
    const double clip = std::min(1.0, opt.grad_clip / (std::sqrt(sum) + 1e-6));
    for (std::size_t u = 0; u < params.size(); ++u) {
      for (std::size_t i = 0; i < params[u].size(); ++i) {
        const double g = grads[u][i] * clip;
        params[u][i] *= 1.0 - opt.lr * opt.weight_decay;
        m[u][i] = opt.beta1 * m[u][i] + (1 - opt.beta1) * g;
        v[u][i] = opt.beta2 * v[u][i] + (1 - opt.beta2) * g * g;
        const double m_hat = m[u][i] / (1 - std::pow(opt.beta1, step));
        const double v_hat = v[u][i] / (1 - std::pow(opt.beta2, step));
        params[u][i] -= opt.lr * m_hat / (std::sqrt(v_hat) + opt.eps);
      }
    }
    for (std::size_t u = 0; u < params.size(); ++u) {
      const std::vector<float> engine_params = engine.gather_master(model.units()[u]);
      ASSERT_EQ(engine_params.size(), params[u].size());
      for (std::size_t i = 0; i < params[u].size(); ++i) {
        // fp32 rounding of the update (a few ulps of lr-sized steps) plus the fp32 forward/backward
        // feeding the next step: 1e-5 absolute is ~100x the per-step rounding of lr = 1e-2.
        ASSERT_NEAR(engine_params[i], params[u][i], 1e-5 + 1e-5 * std::fabs(params[u][i]))
            << "step " << step << " unit " << u << " element " << i;
      }
    }
  }
}

TEST(Engine, HostBudgetFarBelowTheModelStateHolds) {
  ScratchDir dir;
  Config config = base_config(dir);
  config.zero.params = Tier::kNvme;
  config.zero.grads = Tier::kNvme;
  config.zero.optimizer = Tier::kNvme;
  config.zero.buffer_count = 3;
  config.tiers.host.budget_bytes = 160 * 1024;
  // 24*72+72 + 72*40+40 + 40*8+8 = 5128 parameters: 82 KB of state at 16 B/parameter, padded to
  // 3 units x 2048 elements each = 98 KB; the host holds only staging buffers.
  const RunResult result = train(config);
  EXPECT_LE(result.host_high_water, config.tiers.host.budget_bytes);
  EXPECT_GT(result.host_high_water, 0u);
  ScratchDir reference_dir;
  expect_bitwise_equal(train(base_config(reference_dir)), result, "host budget 160 KiB");
}

TEST(Engine, BudgetTooSmallIsRefusedBeforeAllocation) {
  ScratchDir dir;
  Config config = base_config(dir);
  config.zero.optimizer = Tier::kHost;
  config.tiers.host.budget_bytes = 4096;
  try {
    train(config, 1);
    FAIL() << "a host budget of 4 KiB was accepted";
  } catch (const std::runtime_error& error) {
    EXPECT_THAT(error.what(), HasSubstr("[tiers.host] budget 4.00 KiB is too small"));
    EXPECT_THAT(error.what(), HasSubstr("short by"));
  }
}

// Warm-up scales the learning rate of step s by s / warmup_steps: with fp32 state, the first
// AdamW step moves every weight by about lr (bias-corrected m / sqrt(v) = sign(g)), so the step
// size itself shows the schedule.
TEST(Engine, WarmupScalesTheLearningRate) {
  const auto first_step_change = [](std::uint64_t warmup) {
    ScratchDir dir;
    Config config = base_config(dir);
    config.optimizer.weight_decay = 0;
    config.optimizer.grad_clip = 0;
    config.optimizer.warmup_steps = warmup;
    const RunResult before = train(config, 0);
    const RunResult after = train(config, 1);
    double largest = 0;
    for (std::size_t u = 0; u < before.masters.size(); ++u) {
      for (std::size_t i = 0; i < before.masters[u].size(); ++i) {
        largest = std::max(
            largest, std::fabs(static_cast<double>(after.masters[u][i]) - before.masters[u][i]));
      }
    }
    return largest;
  };
  const double full = first_step_change(0);
  EXPECT_NEAR(full, 1e-2, 1e-4);  // lr
  EXPECT_NEAR(first_step_change(4), full / 4, 1e-4);
}

// set_learning_rate replaces [optimizer] lr from the next step: a run told 4e-3 before its steps
// is bitwise the run configured with 4e-3, and its steps report that rate. Bad rates are refused.
TEST(Engine, SetLearningRateActsLikeTheConfiguredRate) {
  ScratchDir configured_dir;
  Config config = base_config(configured_dir);
  config.optimizer.lr = 4e-3;
  const RunResult configured = train(config);

  ScratchDir told_dir;
  config = base_config(told_dir);
  auto device = host_device(config);
  comm::LocalComm comm;
  Engine engine(config, *device, comm);
  TinyMlp model(kEngineTestWidths, 16, /*data_seed=*/7);
  model.add_units(engine);
  engine.finalize();
  EXPECT_THROW(engine.set_learning_rate(-1e-3), std::invalid_argument);
  EXPECT_THROW(engine.set_learning_rate(std::nan("")), std::invalid_argument);
  engine.set_learning_rate(4e-3);
  RunResult told;
  for (int step = 0; step < kSteps; ++step) {
    told.losses.push_back(model.train_step(engine));
    EXPECT_DOUBLE_EQ(engine.step().lr, 4e-3);
  }
  for (UnitId unit : model.units()) {
    told.masters.push_back(engine.master_shard(unit));
    told.exp_avgs.push_back(engine.state_shard(unit, OptimizerState::kExpAvg));
    told.exp_avg_sqs.push_back(engine.state_shard(unit, OptimizerState::kExpAvgSq));
  }
  expect_bitwise_equal(configured, told, "set_learning_rate(4e-3)");
}

TEST(Engine, NvmeBudgetCountsBothSlots) {
  if (nvme_forced()) GTEST_SKIP() << "STRATA_FORCE_NVME changes the placement under test";
  ScratchDir dir;
  Config config = base_config(dir);
  config.zero.optimizer = Tier::kNvme;
  // Shards of 2048 + 4096 + 2048 elements (1800, 2920 and 328 real), 12 optimizer bytes each:
  // 96 KiB, twice over for the A/B slots.
  config.tiers.nvme.budget_bytes = 100 * 1024;
  try {
    train(config, 1);
    FAIL() << "an NVMe budget below two slots was accepted";
  } catch (const std::runtime_error& error) {
    EXPECT_THAT(error.what(), HasSubstr("[tiers.nvme] budget 100.00 KiB is too small"));
    EXPECT_THAT(error.what(), HasSubstr("needs 192.00 KiB"));
  }
  config.tiers.nvme.budget_bytes = 192 * 1024;
  EXPECT_NO_THROW(train(config, 1));
}

class EngineAccess : public ::testing::TestWithParam<Access> {};

TEST_P(EngineAccess, ResumesFromTheNvmeStoresCommittedStep) {
  const Access access = GetParam();
  ScratchDir dir;
  Config config = base_config(dir);
  config.zero.params = Tier::kNvme;
  config.zero.optimizer = Tier::kNvme;
  const RunResult straight = train(config, 4);
  ScratchDir resume_dir;
  Config resume_config = base_config(resume_dir);
  resume_config.zero.params = Tier::kNvme;
  resume_config.zero.optimizer = Tier::kNvme;
  const RunResult first_half = train(resume_config, 2, with_access(access));
  // A new process: resume at step 2 and train the last two steps.
  auto device = host_device(resume_config);
  comm::LocalComm comm;
  Engine engine(resume_config, *device, comm, with_access(access, EngineOptions{.resume = true}));
  TinyMlp model(kEngineTestWidths, 16, 7);
  model.add_units(engine);
  engine.finalize();
  EXPECT_EQ(engine.step_count(), 2u);
  for (int step = 2; step < 4; ++step) {
    const float loss = model.train_step(engine);
    EXPECT_EQ(loss, straight.losses[step]) << "step " << step;
    engine.step();
  }
  for (std::size_t u = 0; u < model.units().size(); ++u) {
    const std::vector<float> master = engine.master_shard(model.units()[u]);
    EXPECT_EQ(std::memcmp(master.data(), straight.masters[u].data(), master.size() * 4), 0);
  }
  static_cast<void>(first_half);
}

// Two micro-batches, one step; checks the norm and returns the master shards.
std::vector<std::vector<float>> accumulate_and_check(Tier grads_tier, Access access) {
  ScratchDir dir;
  Config config = base_config(dir);
  config.zero.grads = grads_tier;
  auto device = host_device(config);
  comm::LocalComm comm;
  Engine engine(config, *device, comm, with_access(access, EngineOptions{.grad_accumulation = 2}));
  TinyMlp model(kEngineTestWidths, 16, 7);
  model.add_units(engine);
  engine.finalize();
  std::vector<std::vector<float>> first, second;
  model.train_step(engine, 1.0, &first);
  model.train_step(engine, 1.0, &second);
  // A third micro-batch in the same step is an error.
  EXPECT_THROW(model.train_step(engine), std::logic_error);
  const StepStats stats = engine.step();
  double sum = 0;
  for (std::size_t u = 0; u < first.size(); ++u) {
    for (std::size_t i = 0; i < first[u].size(); ++i) {
      const double g = static_cast<double>(first[u][i]) + second[u][i];
      sum += g * g;
    }
  }
  EXPECT_NEAR(stats.grad_norm, std::sqrt(sum), 1e-5 * std::sqrt(sum));
  std::vector<std::vector<float>> masters;
  for (UnitId unit : model.units()) masters.push_back(engine.master_shard(unit));
  return masters;
}

// Accumulation in fp32 on every gradient home: on the device (an accumulate kernel on the staged
// path), in host memory and on NVMe.
TEST_P(EngineAccess, GradientAccumulationSumsMicroBatches) {
  const Access access = GetParam();
  for (Tier grads : {Tier::kNvme, Tier::kDevice, Tier::kHost}) {
    SCOPED_TRACE(fmt::format("grads on {}, {} path", to_string(grads), access_name(access)));
    const auto masters = accumulate_and_check(grads, access);
    const auto direct = accumulate_and_check(grads, Access::kAuto);
    ASSERT_EQ(masters.size(), direct.size());
    for (std::size_t u = 0; u < masters.size(); ++u) {
      EXPECT_EQ(std::memcmp(masters[u].data(), direct[u].data(), masters[u].size() * 4), 0)
          << "unit " << u << " differs from the direct path";
    }
  }
}

// The device pool (tiers/device/device.hpp): after the first step, gathers, evictions and gradient
// moves reuse pooled device memory, so later steps make no backend allocation (cudaMalloc on a
// GPU); the pooled bytes stay within the device budget.
TEST_P(EngineAccess, SteadyStateStepsMakeNoBackendAllocation) {
  const Access access = GetParam();
  for (Tier params : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
    SCOPED_TRACE(fmt::format("params on {}, {} path", to_string(params), access_name(access)));
    ScratchDir dir;
    Config config = base_config(dir);
    config.zero.params = params;
    config.zero.grads = params;
    config.zero.persistence_threshold = 0;  // every unit is gathered and evicted every step
    config.tiers.device.budget_bytes = 1ull << 20;
    auto device = host_device(config);
    comm::LocalComm comm;
    Engine engine(config, *device, comm, with_access(access));
    TinyMlp model(kEngineTestWidths, 16, 7);
    model.add_units(engine);
    engine.finalize();
    model.train_step(engine);
    engine.step();
    const std::uint64_t after_first_step = device->backend_allocation_count();
    EXPECT_GT(after_first_step, 0u);
    for (int step = 1; step < 5; ++step) {
      model.train_step(engine);
      engine.step();
      EXPECT_EQ(device->backend_allocation_count(), after_first_step) << "step " << step;
      EXPECT_LE(device->in_use_bytes() + device->pooled_bytes(), device->budget_bytes());
      EXPECT_LE(device->high_water_bytes(), device->budget_bytes());
    }
  }
}

// The staged path (a CUDA device's) with one rank: a prefetched unit's h2d copy and cast are
// queued on the device streams when its shard is in memory (at once from a device or host home,
// once its NVMe reads land), so they run under the compute of the units before it; the direct
// path has nothing to queue, and without prefetching every gather is queued when it is needed.
// Either way the parameters are bitwise the direct path's.
TEST_P(EngineAccess, PrefetchedGathersAreQueuedOnTheStreamsAheadOfUse) {
  const Access access = GetParam();
  for (Tier params : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
    for (std::uint32_t prefetch_depth : {0u, 2u}) {
      SCOPED_TRACE(fmt::format("params on {}, prefetch_depth {}, {} path", to_string(params),
                               prefetch_depth, access_name(access)));
      const auto run = [&](Access path) {
        ScratchDir dir;
        Config config = base_config(dir);
        config.zero.params = params;
        config.zero.persistence_threshold = 0;  // every unit is gathered and evicted every step
        config.zero.prefetch_depth = prefetch_depth;
        auto device = host_device(config);
        comm::LocalComm comm;
        Engine engine(config, *device, comm, with_access(path));
        TinyMlp model(kEngineTestWidths, 16, 7);
        model.add_units(engine);
        engine.finalize();
        std::uint64_t ahead = 0;
        for (int step = 0; step < 3; ++step) {
          model.train_step(engine);
          ahead += engine.step().gathers_queued_ahead;
        }
        std::vector<std::vector<float>> masters;
        for (UnitId unit : model.units()) masters.push_back(engine.master_shard(unit));
        return std::pair(ahead, masters);
      };
      const auto [ahead, masters] = run(access);
      if (access == Access::kStaged && prefetch_depth > 0) {
        EXPECT_GT(ahead, 0u);
      } else {
        EXPECT_EQ(ahead, 0u);
      }
      const auto direct = run(Access::kAuto).second;
      ASSERT_EQ(masters.size(), direct.size());
      for (std::size_t u = 0; u < masters.size(); ++u) {
        EXPECT_EQ(std::memcmp(masters[u].data(), direct[u].data(), masters[u].size() * 4), 0)
            << "unit " << u << " differs from the direct path";
      }
    }
  }
}

// The staged path with gradients homed in host memory or on NVMe: every reduce_grads call returns
// with its gradient's copy to the host queued on the d2h stream (its store and norm run at the
// next call, which the backward reaches after computing the next gradient, or in step()). Homed
// on the device, nothing leaves the device: the call that completes a gradient adds its sum of
// squares to the norm on the device, read back once by step(), bit for bit the host's sum. With
// micro-batches, speculative updates and a state read between the backward and step() (which
// needs the gradients stored), the parameters stay bitwise the direct path's.
TEST_P(EngineAccess, GradientMovesAreQueuedOnTheStreamsAndStoredInCallOrder) {
  const Access access = GetParam();
  for (Tier grads : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
    for (std::uint32_t micro_batches : {1u, 2u}) {
      for (bool overlap : {false, true}) {
        SCOPED_TRACE(fmt::format("grads on {}, {} micro-batch(es), overlap_optimizer {}, {} path",
                                 to_string(grads), micro_batches, overlap, access_name(access)));
        const auto run = [&](Access path) {
          ScratchDir dir;
          Config config = base_config(dir);
          config.zero.grads = grads;
          config.zero.optimizer = grads == Tier::kDevice ? Tier::kDevice : Tier::kHost;
          config.zero.overlap_optimizer = overlap;
          auto device = host_device(config);
          comm::LocalComm comm;
          EngineOptions options = with_access(path);
          options.grad_accumulation = micro_batches;
          Engine engine(config, *device, comm, options);
          TinyMlp model(kEngineTestWidths, 16, 7);
          model.add_units(engine);
          engine.finalize();
          std::uint64_t queued = 0;
          std::vector<float> read_mid_backward;
          for (int step = 0; step < 3; ++step) {
            for (std::uint32_t m = 0; m < micro_batches; ++m) model.train_step(engine);
            // The committed state, read before step(): the gradients still queued are stored first.
            if (step == 1) {
              read_mid_backward = engine.state_shard(model.units()[0], OptimizerState::kExpAvg);
            }
            queued += engine.step().grad_moves_queued;
          }
          std::vector<std::vector<float>> masters;
          for (UnitId unit : model.units()) masters.push_back(engine.master_shard(unit));
          masters.push_back(read_mid_backward);
          return std::pair(queued, masters);
        };
        const auto [queued, masters] = run(access);
        const std::uint64_t gradients = 3ull * (kEngineTestWidths.size() - 1);  // steps x units
        if (nvme_forced()) {
          // Every tier is forced onto NVMe: the counts follow that placement, not this one.
        } else if (access == Access::kAuto) {
          EXPECT_EQ(queued, 0u);
        } else if (grads == Tier::kDevice) {
          EXPECT_EQ(queued, 0u) << "a device-homed gradient's norm is summed on the device";
        } else {
          EXPECT_EQ(queued, gradients * micro_batches)
              << "every reduce_grads call queues its gradient's copy";
        }
        const auto direct = run(Access::kAuto).second;
        ASSERT_EQ(masters.size(), direct.size());
        for (std::size_t u = 0; u < masters.size(); ++u) {
          ASSERT_EQ(masters[u].size(), direct[u].size());
          EXPECT_EQ(std::memcmp(masters[u].data(), direct[u].data(), masters[u].size() * 4), 0)
              << "array " << u << " differs from the direct path";
        }
      }
    }
  }
}

// GatheredUnit::tensor_bf16: with bf16 parameters the gathered bf16 copy itself, whose widening
// is the fp32 view bit for bit, wherever the parameters live and on either path; nothing with
// fp32 parameters.
TEST_P(EngineAccess, Bf16ViewsHoldTheBitsTheFp32ViewsWiden) {
  const Access access = GetParam();
  for (Tier params : {Tier::kDevice, Tier::kHost, Tier::kNvme}) {
    for (const DType dtype : {DType::kBf16, DType::kFp32}) {
      SCOPED_TRACE(fmt::format("params {} on {}, {} path", dtype_name(dtype), to_string(params),
                               access_name(access)));
      ScratchDir dir;
      Config config = base_config(dir);
      config.zero.params = params;
      config.precision.params = dtype;
      auto device = host_device(config);
      comm::LocalComm comm;
      Engine engine(config, *device, comm, with_access(access));
      TinyMlp model(kEngineTestWidths, 16, 7);
      model.add_units(engine);
      engine.finalize();
      model.train_step(engine);
      engine.step();  // parameters an update wrote, not the initial ones
      for (const UnitId id : model.units()) {
        const GatheredUnit unit = engine.gather(id);
        for (std::size_t t = 0; t < unit.tensor_count(); ++t) {
          const std::span<const float> fp32 = unit.tensor(t);
          const std::span<const std::uint16_t> bf16 = unit.tensor_bf16(t);
          if (dtype != DType::kBf16) {
            EXPECT_TRUE(bf16.empty());
            continue;
          }
          ASSERT_EQ(bf16.size(), fp32.size());
          for (std::size_t i = 0; i < fp32.size(); ++i) {
            std::uint32_t bits = 0;
            std::memcpy(&bits, &fp32[i], sizeof(bits));
            ASSERT_EQ(bits, std::uint32_t{bf16[i]} << 16) << "unit " << id << " tensor " << t
                                                            << " element " << i;
          }
        }
      }
    }
  }
}

// TensorSpec::fp32_view = false: with bf16 parameters the Engine casts only the other tensors
// into the fp32 view; the tensor's fp32 view is empty, its bf16 view and the others' fp32 views
// are those of an Engine that widens everything (same config, same seed). With fp16 parameters
// there is no bf16 view to read instead: the flag is ignored and every fp32 view is there.
TEST_P(EngineAccess, TensorsWithoutAnFp32ViewAreLeftToTheirBf16View) {
  const Access access = GetParam();
  for (const auto& [params, dtype] : {std::pair(Tier::kDevice, DType::kBf16),
                                     std::pair(Tier::kHost, DType::kBf16),
                                     std::pair(Tier::kNvme, DType::kBf16),
                                     std::pair(Tier::kDevice, DType::kFp16)}) {
    SCOPED_TRACE(fmt::format("{} params on {}, {} path", dtype_name(dtype), to_string(params),
                             access_name(access)));
    const bool bf16 = dtype == DType::kBf16;
    ScratchDir dir_all, dir_some;
    Config config_all = base_config(dir_all);
    Config config_some = base_config(dir_some);
    for (Config* config : {&config_all, &config_some}) {
      config->zero.params = params;
      config->precision.params = dtype;
    }
    auto device_all = host_device(config_all);
    auto device_some = host_device(config_some);
    comm::LocalComm comm_all, comm_some;
    Engine all(config_all, *device_all, comm_all, with_access(access));
    Engine some(config_some, *device_some, comm_some, with_access(access));
    TinyMlp model(kEngineTestWidths, 16, 7);
    model.add_units(all);
    std::vector<UnitId> ids;
    for (std::size_t layer = 0; layer + 1 < kEngineTestWidths.size(); ++layer) {
      UnitSpec unit;  // TinyMlp's units, the matrix without its fp32 view
      unit.name = "layer" + std::to_string(layer);
      const std::uint32_t in = kEngineTestWidths[layer], out = kEngineTestWidths[layer + 1];
      const float std = 1.0f / std::sqrt(static_cast<float>(in));
      unit.tensors.push_back({"w", {in, out}, TensorInit::normal(std)});
      unit.tensors.back().fp32_view = false;
      unit.tensors.push_back({"b", {out}, TensorInit::zeros()});
      ids.push_back(some.add_unit(unit));
    }
    all.finalize();
    some.finalize();
    std::mt19937 random(11);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (std::size_t u = 0; u < ids.size(); ++u) {  // every element distinct from its neighbours
      std::vector<float> values(all.unit_numel(model.units()[u]));
      for (float& value : values) value = normal(random);
      all.set_master(model.units()[u], values);
      some.set_master(ids[u], values);
    }
    for (std::size_t u = 0; u < ids.size(); ++u) {
      const GatheredUnit reference = all.gather(model.units()[u]);
      const GatheredUnit unit = some.gather(ids[u]);
      if (bf16) {
        EXPECT_TRUE(unit.tensor(0).empty()) << "unit " << u;
        ASSERT_EQ(unit.tensor_bf16(0).size(), reference.tensor_bf16(0).size());
        EXPECT_EQ(std::memcmp(unit.tensor_bf16(0).data(), reference.tensor_bf16(0).data(),
                              reference.tensor_bf16(0).size_bytes()),
                  0)
            << "unit " << u << ": the matrix's bf16 view";
      } else {
        EXPECT_TRUE(unit.tensor_bf16(0).empty()) << "unit " << u;
        ASSERT_EQ(unit.tensor(0).size(), reference.tensor(0).size());
        EXPECT_EQ(std::memcmp(unit.tensor(0).data(), reference.tensor(0).data(),
                              reference.tensor(0).size_bytes()),
                  0)
            << "unit " << u << ": the matrix's fp32 view (fp16 parameters)";
      }
      ASSERT_EQ(unit.tensor(1).size(), reference.tensor(1).size());
      EXPECT_EQ(std::memcmp(unit.tensor(1).data(), reference.tensor(1).data(),
                            reference.tensor(1).size_bytes()),
                0)
          << "unit " << u << ": the bias's fp32 view";
    }
    // Both keep every unit gathered (the budget allows it): the fp32 views left out take no
    // memory, but for the packed views' alignment slack (256 bytes per unit at most).
    std::uint64_t matrices = 0;
    for (std::size_t layer = 0; layer + 1 < kEngineTestWidths.size(); ++layer) {
      matrices += std::uint64_t{kEngineTestWidths[layer]} * kEngineTestWidths[layer + 1];
    }
    const std::uint64_t saved = device_all->in_use_bytes() - device_some->in_use_bytes();
    if (bf16) {
      EXPECT_GE(saved + 256 * ids.size(), matrices * 4);
      EXPECT_LE(saved, matrices * 4 + (kShardGranuleElements * 4) * ids.size())
          << "at most the matrices and each unit's padding";
    } else {
      EXPECT_EQ(saved, 0u) << "fp16 parameters widen every tensor";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, EngineAccess, ::testing::Values(Access::kAuto, Access::kStaged),
                         [](const auto& param_info) { return access_name(param_info.param); });

}  // namespace
}  // namespace strata::runtime
