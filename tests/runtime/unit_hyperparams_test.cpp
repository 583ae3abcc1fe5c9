// Proves per-unit optimizer overrides (Engine::set_unit_hyperparams): two units with different lr,
// weight decay, betas and eps each match an independent scalar AdamW with their own values (the
// warm-up scaling each unit's lr), weight decay stays off tensors that do not ask for it, results
// are bitwise the same with optimizer state on host or NVMe, a unit without overrides is bitwise
// untouched, and out-of-range values are refused naming the unit and field, by the rule
// set_learning_rate follows too.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/comm/local_comm.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using ::testing::HasSubstr;
using testing::host_device;

constexpr int kSteps = 5;
constexpr std::uint64_t kWeights = 3000;  // > sub_group_size: the unit spans sub-groups
constexpr std::uint64_t kBiases = 37;

Config fp32_config(const ScratchDir& dir, Tier optimizer_tier) {
  Config config = testing::engine_test_config(dir.path().string());
  config.precision.params = DType::kFp32;
  config.precision.grads = DType::kFp32;
  config.zero.optimizer = optimizer_tier;
  config.optimizer.grad_clip = 0;  // each unit's reference is then independent of the other
  config.optimizer.warmup_steps = 3;
  return config;
}

UnitSpec unit_spec(const char* name) {
  return {name,
          {{"w", {kWeights}, TensorInit::normal(0.5f), /*weight_decay=*/true},
           {"b", {kBiases}, TensorInit::normal(0.5f), /*weight_decay=*/false}}};
}

// A deterministic gradient, different per unit, step and element.
std::vector<float> gradient(std::uint32_t unit, int step) {
  std::vector<float> grads(kWeights + kBiases);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    grads[i] =
        static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * step + 2.1 * unit));
  }
  return grads;
}

struct Hyper {
  double lr, beta1, beta2, eps, weight_decay;
};

// Scalar AdamW in double: decoupled decay on the "w" elements only, bias correction, the linear
// warm-up of `warmup` steps on the unit's own lr.
struct ReferenceAdamW {
  ReferenceAdamW(std::vector<float> initial, Hyper hyper, std::uint64_t warmup)
      : params(initial.begin(), initial.end()),
        m(initial.size()),
        v(initial.size()),
        h(hyper),
        warmup_steps(warmup) {}
  void step(int t, const std::vector<float>& grads) {
    const double lr =
        t <= static_cast<int>(warmup_steps) ? h.lr * t / static_cast<double>(warmup_steps) : h.lr;
    for (std::size_t i = 0; i < params.size(); ++i) {
      const double g = grads[i];
      if (i < kWeights) params[i] *= 1.0 - lr * h.weight_decay;
      m[i] = h.beta1 * m[i] + (1 - h.beta1) * g;
      v[i] = h.beta2 * v[i] + (1 - h.beta2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(h.beta1, t));
      const double v_hat = v[i] / (1 - std::pow(h.beta2, t));
      params[i] -= lr * m_hat / (std::sqrt(v_hat) + h.eps);
    }
  }
  std::vector<double> params, m, v;
  Hyper h;
  std::uint64_t warmup_steps;
};

struct TrainedRun {
  std::vector<std::vector<float>> initial;  // per unit, before the first step
  std::vector<std::vector<float>> masters;  // per unit, after every step (concatenated)
  std::vector<std::vector<float>> exp_avg_sqs;
};

// Unit 0 overrides every field; unit 1 overrides `second` (may be empty: the config's values).
TrainedRun train(const Config& config, const UnitHyperparams& first,
                 const UnitHyperparams& second) {
  auto device = host_device(config);
  comm::LocalComm comm;
  Engine engine(config, *device, comm);
  const UnitId a = engine.add_unit(unit_spec("a"));
  const UnitId b = engine.add_unit(unit_spec("b"));
  engine.set_unit_hyperparams(a, first);  // before finalize
  engine.finalize();
  engine.set_unit_hyperparams(b, second);  // after finalize
  TrainedRun run;
  for (UnitId unit : {a, b}) run.initial.push_back(engine.gather_master(unit));
  run.masters.resize(2);
  for (int step = 1; step <= kSteps; ++step) {
    for (UnitId unit : {a, b}) engine.reduce_grads(unit, gradient(unit, step));
    engine.step();
    for (UnitId unit : {a, b}) {
      const std::vector<float> master = engine.gather_master(unit);
      run.masters[unit].insert(run.masters[unit].end(), master.begin(), master.end());
    }
  }
  for (UnitId unit : {a, b}) {
    run.exp_avg_sqs.push_back(engine.state_shard(unit, OptimizerState::kExpAvgSq));
  }
  return run;
}

const UnitHyperparams kFirst{
    .lr = 3e-2, .weight_decay = 0.2, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6};
const UnitHyperparams kSecond{
    .lr = 5e-3, .weight_decay = 0.0, .beta1 = 0.85, .beta2 = 0.99, .eps = 1e-7};

TEST(UnitHyperparams, EachUnitMatchesAScalarAdamWWithItsOwnValues) {
  ScratchDir dir;
  const Config config = fp32_config(dir, Tier::kHost);
  const TrainedRun run = train(config, kFirst, kSecond);
  std::vector<ReferenceAdamW> refs;
  for (const UnitHyperparams* h : {&kFirst, &kSecond}) {
    refs.emplace_back(run.initial[refs.size()],
                      Hyper{*h->lr, *h->beta1, *h->beta2, *h->eps, *h->weight_decay},
                      config.optimizer.warmup_steps);
  }
  const std::size_t numel = kWeights + kBiases;
  for (int step = 1; step <= kSteps; ++step) {
    for (std::uint32_t u = 0; u < 2; ++u) {
      refs[u].step(step, gradient(u, step));
      for (std::size_t i = 0; i < numel; ++i) {
        const double expected = refs[u].params[i];
        ASSERT_NEAR(run.masters[u][(step - 1) * numel + i], expected,
                    1e-6 + 1e-6 * std::fabs(expected))
            << "step " << step << " unit " << u << " element " << i;
      }
    }
  }
}

TEST(UnitHyperparams, OverridesAreBitwiseTheSameWithOptimizerStateOnHostOrNvme) {
  ScratchDir host_dir, nvme_dir;
  const TrainedRun host = train(fp32_config(host_dir, Tier::kHost), kFirst, kSecond);
  const TrainedRun nvme = train(fp32_config(nvme_dir, Tier::kNvme), kFirst, kSecond);
  EXPECT_EQ(host.masters, nvme.masters);
  EXPECT_EQ(host.exp_avg_sqs, nvme.exp_avg_sqs);
}

// Unit 1 without overrides is bitwise what an Engine without any overrides computes; an override
// equal to the config's values changes no bits either.
TEST(UnitHyperparams, AUnitWithoutOverridesIsBitwiseUntouched) {
  ScratchDir dir_plain, dir_mixed, dir_same;
  const TrainedRun plain =
      train(fp32_config(dir_plain, Tier::kNvme), UnitHyperparams{}, UnitHyperparams{});
  const TrainedRun mixed = train(fp32_config(dir_mixed, Tier::kNvme), kFirst, UnitHyperparams{});
  EXPECT_EQ(plain.masters[1], mixed.masters[1]);
  EXPECT_NE(plain.masters[0], mixed.masters[0]);  // the override did change unit 0
  const OptimizerConfig& opt = fp32_config(dir_same, Tier::kNvme).optimizer;
  const UnitHyperparams same{.lr = opt.lr,
                             .weight_decay = opt.weight_decay,
                             .beta1 = opt.beta1,
                             .beta2 = opt.beta2,
                             .eps = opt.eps};
  const TrainedRun explicit_same = train(fp32_config(dir_same, Tier::kNvme), same, same);
  EXPECT_EQ(plain.masters, explicit_same.masters);
}

// Overrides of one field alone.
UnitHyperparams only(std::optional<double> UnitHyperparams::*field, double value) {
  UnitHyperparams hyper;
  hyper.*field = value;
  return hyper;
}

TEST(UnitHyperparams, OutOfRangeValuesAreRefusedNamingUnitAndField) {
  ScratchDir dir;
  Config config = fp32_config(dir, Tier::kHost);
  auto device = host_device(config);
  comm::LocalComm comm;
  Engine engine(config, *device, comm);
  const UnitId a = engine.add_unit(unit_spec("attn"));
  const auto message = [&](const UnitHyperparams& hyper) -> std::string {
    try {
      engine.set_unit_hyperparams(a, hyper);
    } catch (const std::invalid_argument& error) {
      return error.what();
    }
    return "accepted";
  };
  EXPECT_THAT(message(only(&UnitHyperparams::lr, -1.0)), HasSubstr("unit 'attn': lr = -1"));
  EXPECT_THAT(message(only(&UnitHyperparams::lr, std::nan(""))), HasSubstr("lr = nan"));
  EXPECT_THAT(message(only(&UnitHyperparams::weight_decay, -0.1)),
              HasSubstr("weight_decay = -0.1"));
  EXPECT_THAT(message(only(&UnitHyperparams::beta1, 1.0)), HasSubstr("beta1 = 1 is not in [0, 1)"));
  EXPECT_THAT(message(only(&UnitHyperparams::beta2, -0.5)), HasSubstr("beta2 = -0.5"));
  EXPECT_THAT(message(only(&UnitHyperparams::eps, INFINITY)), HasSubstr("eps = inf"));
  EXPECT_THROW(engine.set_unit_hyperparams(7, UnitHyperparams{}), std::out_of_range);
  // A refused call leaves the previous overrides in force.
  engine.set_unit_hyperparams(a, only(&UnitHyperparams::lr, 0.5));
  EXPECT_EQ(message(only(&UnitHyperparams::lr, -2.0)).find("accepted"), std::string::npos);
  EXPECT_EQ(engine.unit_hyperparams(a).lr, 0.5);

  config.optimizer.schedule = LrScheduleKind::kCosine;
  config.optimizer.lr_decay_steps = 10;
  config.optimizer.min_lr = 1e-3;
  Engine decaying(config, *device, comm);
  const UnitId u = decaying.add_unit(unit_spec("mlp"));
  EXPECT_THROW(
      {
        try {
          decaying.set_unit_hyperparams(u, only(&UnitHyperparams::lr, 1e-4));
        } catch (const std::invalid_argument& error) {
          EXPECT_THAT(error.what(), HasSubstr("below [optimizer] min_lr"));
          throw;
        }
      },
      std::invalid_argument);
}

// set_learning_rate and a unit's lr override follow one rule (validate_peak_lr): under a decaying
// schedule both refuse a rate below min_lr and accept min_lr itself; both refuse negative rates.
TEST(UnitHyperparams, GlobalAndUnitLearningRatesFollowOneRule) {
  ScratchDir dir;
  Config config = fp32_config(dir, Tier::kHost);
  config.optimizer.schedule = LrScheduleKind::kLinear;
  config.optimizer.lr_decay_steps = 10;
  config.optimizer.min_lr = 1e-3;
  auto device = host_device(config);
  comm::LocalComm comm;
  Engine engine(config, *device, comm);
  const UnitId u = engine.add_unit(unit_spec("mlp"));
  const auto refusal = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const std::invalid_argument& error) {
      return error.what();
    }
    return "accepted";
  };
  const auto set_global = [&](double lr) { return refusal([&] { engine.set_learning_rate(lr); }); };
  const auto set_unit = [&](double lr) {
    return refusal([&] { engine.set_unit_hyperparams(u, only(&UnitHyperparams::lr, lr)); });
  };
  const std::string below =
      "lr = 0.0001 is below [optimizer] min_lr = 0.001 of the linear schedule";
  EXPECT_EQ(set_global(1e-4), "set_learning_rate: " + below);
  EXPECT_EQ(set_unit(1e-4), "set_unit_hyperparams: unit 'mlp': " + below);
  EXPECT_EQ(set_global(-1.0), "set_learning_rate: lr = -1 is not finite and >= 0");
  EXPECT_EQ(set_unit(-1.0), "set_unit_hyperparams: unit 'mlp': lr = -1 is not finite and >= 0");
  EXPECT_EQ(set_global(1e-3), "accepted");
  EXPECT_EQ(set_unit(1e-3), "accepted");
}

}  // namespace
}  // namespace strata::runtime
