// Proves compressed optimizer state ([optimizer] state_dtype = "int8" / "bf16", master_dtype =
// "bf16") keeps the Engine's invariants: every placement is bitwise the all-on-device run of the
// same formats, bf16 parameters kept in a bf16 master's bytes are bitwise their own copy, the
// NVMe store's resume and checkpoint save/load continue bitwise, training still lowers the loss,
// NVMe traffic shrinks with the bytes, and bad values are errors naming the key; and the same of a
// Kahan-compensated bf16 master (master_rounding = "kahan"), which also tracks an fp32 master more
// closely than stochastic rounding.
#include <cmath>
#include <cstring>
#include <tuple>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/debug_knobs.hpp"
#include "base/float16.hpp"
#include "runtime/plan/buffer_plan.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/comm/local_comm.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/checkpoint_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using testing::engine_test_config;
using testing::expect_same_state;
using ::testing::HasSubstr;
using testing::TrainedModel;
using Access = EngineOptions::DeviceAccess;
using cpu_adam::StateDType;

Config compressed(const ScratchDir& dir, StateDType moments, StateDType master,
                  Tier params = Tier::kDevice, Tier grads = Tier::kDevice,
                  Tier optimizer = Tier::kDevice) {
  Config config = engine_test_config(dir.path().string());
  config.optimizer.state_dtype = moments;
  config.optimizer.master_dtype = master;
  config.zero.params = params;
  config.zero.grads = grads;
  config.zero.optimizer = optimizer;
  return config;
}

struct Trained {
  std::vector<float> losses;
  std::vector<std::vector<float>> state;
  std::uint64_t nvme_bytes = 0;
};

Trained train(const Config& config, int steps, Access access = Access::kAuto) {
  EngineOptions options;
  options.device_access = access;
  TrainedModel run(config, options);
  Trained out;
  for (int i = 0; i < steps; ++i) {
    const StepStats stats = run.train(1);
    out.nvme_bytes += stats.nvme.read_bytes + stats.nvme.written_bytes;
  }
  out.losses = run.losses;
  out.state = run.state();
  return out;
}

void expect_bitwise(const Trained& got, const Trained& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (std::size_t i = 0; i < got.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&got.losses[i], &want.losses[i], sizeof(float)), 0)
        << what << ": loss of step " << i;
  }
  expect_same_state(got.state, want.state, what);
}

class CompressedPlacement : public ::testing::TestWithParam<std::tuple<Tier, Tier, Tier, Access>> {
};

// int8 moments + bf16 master: every placement and data path is the all-on-device run bit for bit.
TEST_P(CompressedPlacement, IsBitwiseIdenticalToAllOnDevice) {
  ScratchDir reference_dir;
  const Trained reference =
      train(compressed(reference_dir, StateDType::kInt8, StateDType::kBf16), 4);
  const auto [params, grads, optimizer, access] = GetParam();
  ScratchDir dir;
  const Trained got = train(
      compressed(dir, StateDType::kInt8, StateDType::kBf16, params, grads, optimizer), 4, access);
  expect_bitwise(
      got, reference,
      fmt::format("params {} grads {} optimizer {} {}", to_string(params), to_string(grads),
                  to_string(optimizer), access == Access::kStaged ? "staged" : "direct"));
}

INSTANTIATE_TEST_SUITE_P(
    Int8Bf16, CompressedPlacement,
    ::testing::Combine(::testing::Values(Tier::kDevice, Tier::kNvme),
                       ::testing::Values(Tier::kDevice, Tier::kNvme),
                       ::testing::Values(Tier::kDevice, Tier::kHost, Tier::kNvme),
                       ::testing::Values(Access::kAuto, Access::kStaged)),
    [](const auto& param_info) {
      return fmt::format(
          "params_{}_grads_{}_optimizer_{}_{}", to_string(std::get<0>(param_info.param)),
          to_string(std::get<1>(param_info.param)), to_string(std::get<2>(param_info.param)),
          std::get<3>(param_info.param) == Access::kStaged ? "staged" : "direct");
    });

TEST(CompressedState, EveryFormatLowersTheLoss) {
  for (StateDType moments : {StateDType::kBf16, StateDType::kInt8}) {
    for (StateDType master : {StateDType::kFp32, StateDType::kBf16}) {
      ScratchDir dir;
      const Trained run = train(compressed(dir, moments, master), 12);
      EXPECT_LT(run.losses.back(), 0.7f * run.losses.front())
          << cpu_adam::state_dtype_name(moments) << " moments, "
          << cpu_adam::state_dtype_name(master) << " master";
    }
  }
}

// Adagrad (no exp_avg) and Lion (no exp_avg_sq) keep their one moment in int8 too, on NVMe.
TEST(CompressedState, AdagradAndLionTrainWithInt8State) {
  for (OptimizerType type : {OptimizerType::kAdagrad, OptimizerType::kLion}) {
    ScratchDir dir;
    Config config = compressed(dir, StateDType::kInt8, StateDType::kBf16, Tier::kDevice,
                               Tier::kDevice, Tier::kNvme);
    config.optimizer.type = type;
    if (type == OptimizerType::kLion) config.optimizer.lr = 1e-3;
    const Trained run = train(config, 12);
    EXPECT_LT(run.losses.back(), 0.8f * run.losses.front()) << to_string(type);
  }
}

// The NVMe optimizer traffic per step is exactly the encoded sub-groups: this model's sub-groups
// are all 2048 elements, fp32 master + moments 3 x 8 KiB each; bf16 master 4 KiB and each int8
// moment 3 blocks padded to one 4 KiB page, so exactly half (at huge.toml's 1e7-element sub-groups
// the padding vanishes and the ratio is 0.334: CompressedStatePlan below).
TEST(CompressedState, NvmeTrafficShrinksWithTheBytes) {
  if (force_nvme_knob()) GTEST_SKIP() << "STRATA_FORCE_NVME moves every kind to NVMe";
  ScratchDir fp32_dir, int8_dir;
  const Trained fp32 = train(compressed(fp32_dir, StateDType::kFp32, StateDType::kFp32,
                                        Tier::kDevice, Tier::kDevice, Tier::kNvme),
                             2);
  const Trained int8 = train(compressed(int8_dir, StateDType::kInt8, StateDType::kBf16,
                                        Tier::kDevice, Tier::kDevice, Tier::kNvme),
                             2);
  const double ratio = static_cast<double>(int8.nvme_bytes) / static_cast<double>(fp32.nvme_bytes);
  std::printf("NVMe bytes over 2 steps: fp32 %llu, int8 + bf16 master %llu (ratio %.3f)\n",
              static_cast<unsigned long long>(fp32.nvme_bytes),
              static_cast<unsigned long long>(int8.nvme_bytes), ratio);
  EXPECT_GT(int8.nvme_bytes, 0u);
  EXPECT_DOUBLE_EQ(ratio, 0.5);
}

// Every unit gathered (its tensors concatenated: the flattened unit) after `steps` steps.
std::vector<std::vector<float>> gathered_params(TrainedModel& run) {
  std::vector<std::vector<float>> out;
  for (UnitId unit : run.model->units()) {
    const GatheredUnit gathered = run.engine->gather(unit);
    std::vector<float> values;
    for (std::size_t t = 0; t < gathered.tensor_count(); ++t) {
      const std::span<const float> tensor = gathered.tensor(t);
      values.insert(values.end(), tensor.begin(), tensor.end());
    }
    out.push_back(std::move(values));
  }
  return out;
}

// bf16 parameters and a bf16 master on the same tier share the master's bytes (no param16 copy):
// what the forward gathers is bitwise what a separate copy, written by the optimizer as the
// rounded master, holds (parameters on the device keep their own copy), is the master itself,
// and the shared layout writes no parameter bytes to NVMe.
TEST(CompressedState, ParamsInTheMasterAreTheSeparateCopyBitwise) {
  if (force_nvme_knob()) GTEST_SKIP() << "STRATA_FORCE_NVME homes the params on NVMe too";
  ScratchDir shared_dir, separate_dir;
  TrainedModel shared(compressed(shared_dir, StateDType::kInt8, StateDType::kBf16, Tier::kNvme,
                                 Tier::kNvme, Tier::kNvme));
  TrainedModel separate(compressed(separate_dir, StateDType::kInt8, StateDType::kBf16,
                                   Tier::kDevice, Tier::kNvme, Tier::kNvme));
  for (int step = 0; step < 3; ++step) {
    const StepStats shared_stats = shared.train(1);
    const StepStats separate_stats = separate.train(1);
    // The separate copy lives on the device: both runs write only grads, master and moments.
    EXPECT_EQ(shared_stats.nvme.written_bytes, separate_stats.nvme.written_bytes)
        << "step " << step;
    EXPECT_GT(shared_stats.nvme.read_bytes, separate_stats.nvme.read_bytes)
        << "step " << step << ": the shared run gathers its parameters from NVMe";
    const std::vector<std::vector<float>> shared_params = gathered_params(shared);
    const std::vector<std::vector<float>> separate_params = gathered_params(separate);
    ASSERT_EQ(shared_params.size(), separate_params.size());
    for (std::size_t u = 0; u < shared_params.size(); ++u) {
      const std::vector<float> master = shared.engine->gather_master(shared.model->units()[u]);
      ASSERT_EQ(shared_params[u].size(), master.size());
      ASSERT_EQ(separate_params[u].size(), master.size());
      EXPECT_EQ(std::memcmp(shared_params[u].data(), separate_params[u].data(),
                            master.size() * sizeof(float)),
                0)
          << "unit " << u << " after step " << step + 1 << ": shared vs separate parameters";
      EXPECT_EQ(std::memcmp(shared_params[u].data(), master.data(), master.size() * sizeof(float)),
                0)
          << "unit " << u << " after step " << step + 1 << ": parameters vs bf16 master";
    }
  }
  expect_bitwise(Trained{shared.losses, shared.state(), 0},
                 Trained{separate.losses, separate.state(), 0}, "shared vs separate parameters");
}

// optimizer_host_fraction keeps some units' master on the host: their parameters are gathered
// from there, the rest from NVMe, still bitwise the all-on-device run.
TEST(CompressedState, ParamsInAMasterSplitOverHostAndNvmeAreBitwise) {
  ScratchDir reference_dir, dir;
  const Trained reference =
      train(compressed(reference_dir, StateDType::kInt8, StateDType::kBf16), 3);
  Config config = compressed(dir, StateDType::kInt8, StateDType::kBf16, Tier::kNvme, Tier::kNvme,
                             Tier::kNvme);
  config.zero.optimizer_host_fraction = 0.5;
  for (Access access : {Access::kAuto, Access::kStaged}) {
    ScratchDir run_dir;
    config.tiers.nvme.paths = {run_dir.path().string()};
    expect_bitwise(train(config, 3, access), reference,
                   access == Access::kStaged ? "half on host, staged" : "half on host, direct");
  }
}

// The buffer plan of the shared layout: no parameter extents (both A/B slots of 2 bytes per
// element gone), no parameter room in the optimizer's pipeline buffers.
TEST(CompressedState, ParamsInTheMasterTakeNoNvmeOrPipelineBytes) {
  ScratchDir dir;
  BufferPlanInputs inputs;
  inputs.unit_numels = {1800, 2920, 328};  // shards of 2048, 4096 and 2048 elements
  const Config shared_config = compressed(dir, StateDType::kInt8, StateDType::kBf16, Tier::kNvme,
                                          Tier::kNvme, Tier::kNvme);
  Config separate_config = shared_config;
  separate_config.precision.params = DType::kFp16;  // a rounding of the master: its own copy
  const BufferPlan shared = make_buffer_plan(shared_config, inputs);
  const BufferPlan separate = make_buffer_plan(separate_config, inputs);
  EXPECT_TRUE(shared.kind(ShardKind::kParam).in_master);
  EXPECT_FALSE(shared.kind(ShardKind::kParam).kept);
  EXPECT_FALSE(separate.kind(ShardKind::kParam).in_master);
  EXPECT_EQ(shared.nvme_state_bytes, separate.nvme_state_bytes - 2 * 8192u * 2);
  EXPECT_EQ(shared.pipeline_buffer_bytes, separate.pipeline_buffer_bytes - 2048u * 2);
  // Parameters on another tier than the master keep their copy.
  Config other_tier = shared_config;
  other_tier.zero.params = Tier::kDevice;
  EXPECT_FALSE(make_buffer_plan(other_tier, inputs).kind(ShardKind::kParam).in_master);
}

// int8 moments and a bf16 master, rounded stochastically or with its Kahan compensation (whose
// joined value a checkpoint holds and splits back into the very same weights and low parts).
Config int8_bf16(const ScratchDir& dir, MasterRounding rounding, Tier params = Tier::kDevice,
                 Tier grads = Tier::kDevice, Tier optimizer = Tier::kDevice) {
  Config config = compressed(dir, StateDType::kInt8, StateDType::kBf16, params, grads, optimizer);
  config.optimizer.master_rounding = rounding;
  return config;
}

constexpr MasterRounding kRoundings[] = {MasterRounding::kStochastic, MasterRounding::kKahan};

TEST(CompressedState, ResumesFromTheNvmeStoreBitwise) {
  for (MasterRounding rounding : kRoundings) {
    ScratchDir straight_dir, dir;
    const Trained straight =
        train(int8_bf16(straight_dir, rounding, Tier::kNvme, Tier::kDevice, Tier::kNvme), 4);
    const Config config = int8_bf16(dir, rounding, Tier::kNvme, Tier::kDevice, Tier::kNvme);
    train(config, 2);
    TrainedModel resumed(config, EngineOptions{.resume = true});
    EXPECT_EQ(resumed.engine->step_count(), 2u);
    resumed.train(2);
    const std::string what = fmt::format("{}: resumed at step 2", to_string(rounding));
    EXPECT_EQ(resumed.losses[0], straight.losses[2]) << what;
    EXPECT_EQ(resumed.losses[1], straight.losses[3]) << what;
    expect_same_state(resumed.state(), straight.state, what);
  }
}

TEST(CompressedState, CheckpointSaveLoadContinuesBitwise) {
  for (MasterRounding rounding : kRoundings) {
    ScratchDir straight_dir, first_dir, second_dir, checkpoint_dir;
    const Trained straight = train(int8_bf16(straight_dir, rounding), 5);
    const auto checkpoint = checkpoint_dir.path() / "ckpt";
    {
      TrainedModel first(int8_bf16(first_dir, rounding, Tier::kNvme, Tier::kDevice, Tier::kNvme));
      first.train(3);
      first.engine->save(checkpoint);
    }
    // Loaded into another placement: the values re-encode to the very same bytes.
    TrainedModel second(int8_bf16(second_dir, rounding, Tier::kDevice, Tier::kHost, Tier::kHost));
    second.engine->load(checkpoint);
    EXPECT_EQ(second.engine->step_count(), 3u);
    second.train(2);
    const std::string what =
        fmt::format("{}: saved at step 3, loaded, 2 more steps", to_string(rounding));
    EXPECT_EQ(second.losses[0], straight.losses[3]) << what;
    EXPECT_EQ(second.losses[1], straight.losses[4]) << what;
    expect_same_state(second.state(), straight.state, what);
  }
}

// ---- Kahan-compensated bf16 master ([optimizer] master_rounding = "kahan") -------------------

Config kahan(Config config) {
  config.optimizer.master_dtype = StateDType::kBf16;
  config.optimizer.master_rounding = MasterRounding::kKahan;
  return config;
}

class KahanPlacement : public ::testing::TestWithParam<std::tuple<Tier, Tier, Access>> {};

// The compensation is state like the moments: every placement of it and of the rest, on both data
// paths, is the all-on-device run bit for bit.
TEST_P(KahanPlacement, IsBitwiseIdenticalToAllOnDevice) {
  ScratchDir reference_dir;
  const Trained reference = train(int8_bf16(reference_dir, MasterRounding::kKahan), 4);
  const auto [params, optimizer, access] = GetParam();
  ScratchDir dir;
  const Trained got =
      train(int8_bf16(dir, MasterRounding::kKahan, params, Tier::kDevice, optimizer), 4, access);
  expect_bitwise(got, reference,
                 fmt::format("kahan: params {} optimizer {} {}", to_string(params),
                             to_string(optimizer), access == Access::kStaged ? "staged" : "direct"));
}

INSTANTIATE_TEST_SUITE_P(
    Int8Kahan, KahanPlacement,
    ::testing::Combine(::testing::Values(Tier::kDevice, Tier::kNvme),
                       ::testing::Values(Tier::kHost, Tier::kNvme),
                       ::testing::Values(Access::kAuto, Access::kStaged)),
    [](const auto& param_info) {
      return fmt::format("params_{}_optimizer_{}_{}", to_string(std::get<0>(param_info.param)),
                         to_string(std::get<1>(param_info.param)),
                         std::get<2>(param_info.param) == Access::kStaged ? "staged" : "direct");
    });

// The masters' movement over a run (final - start), every third state array (state(): per unit
// master, exp_avg, exp_avg_sq).
std::vector<double> master_moves(const Config& config, int steps) {
  const Trained start = train(config, 0);
  ScratchDir dir;
  Config again = config;
  again.tiers.nvme.paths = {dir.path().string()};
  const Trained end = train(again, steps);
  std::vector<double> moves;
  for (std::size_t s = 0; s < end.state.size(); s += 3) {
    for (std::size_t i = 0; i < end.state[s].size(); ++i) {
      moves.push_back(double{end.state[s][i]} - start.state[s][i]);
    }
  }
  return moves;
}

double mean_abs_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += std::fabs(a[i] - b[i]);
  return sum / static_cast<double>(a.size());
}

// Twelve steps with fp32 moments: how far the compensated master moves stays nearer to how far the
// fp32 master moves than the stochastically rounded one's does, and it holds values no bf16 can
// (the master the Engine reports is weights + compensation).
TEST(CompressedState, KahanMasterTracksTheFp32MasterCloserThanStochasticRounding) {
  ScratchDir fp32_dir, stochastic_dir, kahan_dir;
  const std::vector<double> fp32 =
      master_moves(compressed(fp32_dir, StateDType::kFp32, StateDType::kFp32), 12);
  const std::vector<double> stochastic =
      master_moves(compressed(stochastic_dir, StateDType::kFp32, StateDType::kBf16), 12);
  const Config kahan_config = kahan(compressed(kahan_dir, StateDType::kFp32, StateDType::kBf16));
  const std::vector<double> compensated = master_moves(kahan_config, 12);
  ScratchDir loss_dir;
  Config loss_config = kahan_config;
  loss_config.tiers.nvme.paths = {loss_dir.path().string()};
  const Trained run = train(loss_config, 12);
  EXPECT_LT(run.losses.back(), 0.7f * run.losses.front());
  const double stochastic_error = mean_abs_difference(stochastic, fp32);
  const double kahan_error = mean_abs_difference(compensated, fp32);
  std::printf("12 steps, mean |master's move - fp32 master's move|: stochastic %.3g, kahan %.3g, "
              "mean |fp32 move| %.3g\n",
              stochastic_error, kahan_error, mean_abs_difference(fp32, std::vector<double>(fp32.size())));
  EXPECT_LT(kahan_error, 0.5 * stochastic_error);
  std::size_t beyond_bf16 = 0;
  for (float v : run.state[0]) beyond_bf16 += to_float(to_bf16(v)) != v ? 1 : 0;
  EXPECT_GT(beyond_bf16, 0u);
}

TEST(CompressedState, ConfigErrorsNameTheKeyAndValue) {
  const auto error_of = [](const char* text) {
    try {
      parse_config(text);
    } catch (const std::exception& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  const std::string bad_state = error_of("[optimizer]\nstate_dtype = \"int4\"\n");
  EXPECT_THAT(bad_state, HasSubstr("state_dtype"));
  EXPECT_THAT(bad_state, HasSubstr("int4"));
  const std::string bad_master = error_of("[optimizer]\nmaster_dtype = \"int8\"\n");
  EXPECT_THAT(bad_master, HasSubstr("master_dtype"));
  EXPECT_THAT(bad_master, HasSubstr("int8"));
  const Config good =
      parse_config("[optimizer]\nstate_dtype = \"int8\"\nmaster_dtype = \"bf16\"\n");
  EXPECT_EQ(good.optimizer.state_dtype, StateDType::kInt8);
  EXPECT_EQ(good.optimizer.master_dtype, StateDType::kBf16);
  EXPECT_EQ(good.optimizer.master_rounding, MasterRounding::kStochastic);
  const std::string kahan_fp32 = error_of("[optimizer]\nmaster_rounding = \"kahan\"\n");
  EXPECT_THAT(kahan_fp32, HasSubstr("master_rounding"));
  EXPECT_THAT(kahan_fp32, HasSubstr("master_dtype = \"bf16\""));
  EXPECT_THAT(kahan_fp32, HasSubstr(":2:"));  // the line of the key
  const std::string bad_rounding =
      error_of("[optimizer]\nmaster_dtype = \"bf16\"\nmaster_rounding = \"nearest\"\n");
  EXPECT_THAT(bad_rounding, HasSubstr("master_rounding"));
  EXPECT_THAT(bad_rounding, HasSubstr("nearest"));
  EXPECT_EQ(parse_config("[optimizer]\nmaster_dtype = \"bf16\"\nmaster_rounding = \"kahan\"\n")
                .optimizer.master_rounding,
            MasterRounding::kKahan);
}

// `strata plan`'s arithmetic for the example configs: the optimizer row is 2 + 2 x 1024/1020 bytes
// per parameter with int8 moments and a bf16 master, NVMe traffic per step follows it, and
// huge-4b.toml (>= 4e9 parameters) fits 70 GB of disk with its A/B slots.
MemoryPlan plan_of(const Config& config) {
  return make_memory_plan(config, PlanInputs(config.parameter_count(), 1));
}

std::uint64_t nvme_bytes_per_step(const MemoryPlan& plan) {
  return plan.nvme_read_bytes_per_step + plan.nvme_write_bytes_per_step;
}

TEST(CompressedStatePlan, HugeTomlNvmeTrafficFollowsTheStateBytes) {
  const Config fp32 = load_config(std::string(STRATA_SOURCE_DIR) + "/examples/configs/huge.toml");
  Config int8 = fp32;
  int8.optimizer.state_dtype = StateDType::kInt8;
  int8.optimizer.master_dtype = StateDType::kBf16;
  const MemoryPlan fp32_plan = plan_of(fp32);
  const MemoryPlan int8_plan = plan_of(int8);
  const StateRow& optimizer = int8_plan.states.back();
  ASSERT_EQ(optimizer.kind, StateKind::kOptimizer);
  EXPECT_EQ(optimizer.layout, "bf16 master + int8 exp_avg + int8 exp_avg_sq");
  EXPECT_DOUBLE_EQ(optimizer.bytes_per_param, 2.0 + 2.0 * 1024 / 1020);
  EXPECT_DOUBLE_EQ(fp32_plan.states.back().bytes_per_param, 12.0);
  // huge.toml keeps params (read twice, written once), grads (written, read) and the optimizer
  // state (read, written) on NVMe: 2x3 + 2x2 + 2 x optimizer bytes per parameter. With a bf16
  // master the bf16 params are the master's bytes: read twice, never written, stored nowhere else.
  const StateRow& params = int8_plan.states.front();
  ASSERT_EQ(params.kind, StateKind::kParams);
  EXPECT_EQ(params.bytes_per_rank, 0u);
  EXPECT_EQ(int8_plan.traffic(StateKind::kParams).write_bytes, 0u);
  EXPECT_EQ(int8_plan.traffic(StateKind::kParams).read_bytes, 2 * 2 * params.elements_per_rank);
  const double ratio = static_cast<double>(nvme_bytes_per_step(int8_plan)) /
                       static_cast<double>(nvme_bytes_per_step(fp32_plan));
  const double optimizer_ratio = static_cast<double>(optimizer.bytes_per_rank) /
                                 static_cast<double>(fp32_plan.states.back().bytes_per_rank);
  std::printf(
      "huge.toml NVMe bytes per step: fp32 %.2f GB, int8 moments + bf16 master %.2f GB "
      "(ratio %.3f; optimizer state alone %.3f)\n",
      static_cast<double>(nvme_bytes_per_step(fp32_plan)) / 1e9,
      static_cast<double>(nvme_bytes_per_step(int8_plan)) / 1e9, ratio, optimizer_ratio);
  EXPECT_NEAR(ratio, (4 + 4 + 2 * optimizer.bytes_per_param) / (6 + 4 + 2 * 12.0), 1e-3);
  EXPECT_LE(optimizer_ratio, 0.45);
}

// fp16 parameters are a rounding of the master, not its bytes: they keep their own copy.
// The compensation is 2 more bytes per parameter of optimizer state, read and written each step;
// the parameters stay the weights' own bytes.
TEST(CompressedStatePlan, KahanAddsTwoBytesPerParameterOfOptimizerState) {
  Config stochastic =
      load_config(std::string(STRATA_SOURCE_DIR) + "/examples/configs/huge.toml");
  stochastic.optimizer.state_dtype = StateDType::kInt8;
  stochastic.optimizer.master_dtype = StateDType::kBf16;
  Config compensated = stochastic;
  compensated.optimizer.master_rounding = MasterRounding::kKahan;
  const MemoryPlan a = plan_of(stochastic);
  const MemoryPlan b = plan_of(compensated);
  const StateRow& optimizer = b.states.back();
  EXPECT_EQ(optimizer.layout, "bf16 master + bf16 compensation + int8 exp_avg + int8 exp_avg_sq");
  EXPECT_DOUBLE_EQ(optimizer.bytes_per_param - a.states.back().bytes_per_param, 2.0);
  EXPECT_EQ(b.states.front().bytes_per_rank, 0u);  // parameters still in the master's bytes
  const std::uint64_t compensation = 2 * optimizer.elements_per_rank;
  EXPECT_EQ(b.traffic(StateKind::kOptimizer).read_bytes,
            a.traffic(StateKind::kOptimizer).read_bytes + compensation);
  EXPECT_EQ(b.traffic(StateKind::kOptimizer).write_bytes,
            a.traffic(StateKind::kOptimizer).write_bytes + compensation);
}

TEST(CompressedStatePlan, Fp16ParamsKeepTheirOwnCopy) {
  Config config = load_config(std::string(STRATA_SOURCE_DIR) + "/examples/configs/huge.toml");
  config.optimizer.state_dtype = StateDType::kInt8;
  config.optimizer.master_dtype = StateDType::kBf16;
  config.precision.params = DType::kFp16;
  const MemoryPlan plan = plan_of(config);
  const StateRow& params = plan.states.front();
  EXPECT_EQ(params.layout, "fp16");
  EXPECT_EQ(params.bytes_per_rank, 2 * params.elements_per_rank);
  EXPECT_EQ(plan.traffic(StateKind::kParams).write_bytes, params.bytes_per_rank);
}

TEST(CompressedStatePlan, Huge4bFitsSeventyGigabytesOfDisk) {
  const Config config =
      load_config(std::string(STRATA_SOURCE_DIR) + "/examples/configs/huge-4b.toml");
  EXPECT_GE(config.parameter_count(), 4'000'000'000u);
  const MemoryPlan plan = plan_of(config);
  const TierRow& nvme = plan.tier(Tier::kNvme);
  std::printf("huge-4b.toml: %.3g parameters, NVMe %.1f GB of %.1f GB budget, fits: %s\n",
              static_cast<double>(config.parameter_count()),
              static_cast<double>(nvme.total_bytes()) / 1e9,
              static_cast<double>(nvme.budget_bytes) / 1e9, plan.fits() ? "yes" : "no");
  EXPECT_TRUE(plan.fits()) << render_plan_text(plan, config);
  EXPECT_LE(nvme.total_bytes(), 70'000'000'000u);
  EXPECT_LE(nvme.budget_bytes, 70'000'000'000u);
  // The same model with fp32 state would not fit that disk.
  Config fp32 = config;
  fp32.optimizer.state_dtype = StateDType::kFp32;
  fp32.optimizer.master_dtype = StateDType::kFp32;
  EXPECT_GT(plan_of(fp32).tier(Tier::kNvme).total_bytes(), 70'000'000'000u);
}

}  // namespace
}  // namespace strata::runtime
