// Proves the Engine trains the GPT as the plain reference AdamW does: with fp32 state, weight decay
// on matrices and embeddings only and a warm-up + cosine schedule, GptTrainer's losses and weights
// follow a ParameterStore stepped by ReferenceAdamW, and decaying every tensor would not.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "models/training/gpt_trainer.hpp"
#include "models/gpt/gpt_model.hpp"
#include "models/gpt/parameter_store.hpp"
#include "models/gpt/reference_adamw.hpp"
#include "runtime/comm/local_comm.hpp"
#include "tests/models/tiny_finetune_config.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"
#include "tiers/device/device.hpp"

namespace strata::examples {
namespace {

using io::testing::ScratchDir;

constexpr int kSteps = 6;

// The tiny run's 4,096-element sub-groups: the block units' sub-groups straddle decayed and
// undecayed tensors.
runtime::Config reference_config(const ScratchDir& dir) {
  // The tiny run's [optimizer] goes on with betas, decay, clipping and the schedule; fp32 state.
  runtime::Config config = testing::tiny_finetune_config(dir, R"(
betas = [0.9, 0.95]
weight_decay = 0.1
grad_clip = 1.0
warmup_steps = 2
schedule = "cosine"
lr_decay_steps = 5
min_lr = 3e-4
[precision]
params = "fp32"
grads = "fp32"
)");
  config.zero.optimizer = runtime::Tier::kNvme;  // sub-groups stream through the pipeline buffers
  return config;
}

struct Comparison {
  double first_loss_difference = 0;  // step 1: the same weights, so the same loss
  double largest_weight_difference = 0;
  std::string where;
};

enum class ReferenceDecay { kAsSpecified, kEveryTensor };

// Trains the Engine and the reference side by side; returns how far apart they ended.
Comparison compare(const runtime::Config& config, ReferenceDecay decay) {
  gpt::set_blas_threads(1);
  auto device = runtime::testing::host_device(config);
  runtime::comm::LocalComm comm;
  GptTrainer trainer(config, *device, comm, {});

  gpt::GptModel model(config.model);
  std::vector<gpt::UnitSpec> units = model.units();
  if (decay == ReferenceDecay::kEveryTensor) {
    for (gpt::UnitSpec& unit : units) {
      for (gpt::TensorSpec& tensor : unit.tensors) tensor.weight_decay = true;
    }
  }
  gpt::ParameterStore params = gpt::ParameterStore::initialized(units, config.run.seed);
  gpt::ParameterStore grads(units);
  gpt::ReferenceAdamW optimizer(params, gpt::adamw_options(config.optimizer));
  // GptTrainer's sampler on rank 0.
  gpt::BatchSampler sampler(trainer.corpus().train, config.model.seq_len, config.model.micro_batch,
                            config.run.seed * 1000);
  std::vector<std::int32_t> batch(model.batch_tokens());

  Comparison result;
  for (int step = 0; step < kSteps; ++step) {
    const double engine_loss = trainer.train_step().loss;
    sampler.next(batch);
    const double reference_loss = gpt::forward_backward(model, params, grads, batch);
    optimizer.step(params, grads);
    if (step == 0) result.first_loss_difference = std::fabs(engine_loss - reference_loss);
  }
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    const std::vector<float> engine =
        trainer.engine().gather_master(static_cast<runtime::UnitId>(u));
    const std::span<const float> reference = params.unit(u);
    EXPECT_EQ(engine.size(), reference.size());
    for (std::size_t i = 0; i < std::min(engine.size(), reference.size()); ++i) {
      const double difference = std::fabs(static_cast<double>(engine[i]) - reference[i]);
      if (difference > result.largest_weight_difference) {
        result.largest_weight_difference = difference;
        result.where = model.units()[u].name + " element " + std::to_string(i);
      }
    }
  }
  return result;
}

TEST(EngineMatchesReference, GptWithDecayGroupsAndCosineSchedule) {
  if (!std::filesystem::is_directory(gpt::kDefaultCorpusDir)) {
    GTEST_SKIP() << gpt::kDefaultCorpusDir << " is missing (not a Debian system)";
  }
  ScratchDir dir;
  const runtime::Config config = reference_config(dir);
  const Comparison same = compare(config, ReferenceDecay::kAsSpecified);
  std::printf("engine vs reference AdamW after %d steps: largest weight difference %.3g (%s)\n",
              kSteps, same.largest_weight_difference, same.where.c_str());
  EXPECT_EQ(same.first_loss_difference, 0.0);
  // fp32 (Engine) against double (reference) arithmetic: a few fp32 roundings per step.
  EXPECT_LT(same.largest_weight_difference, 5e-6) << same.where;

  // The tolerance is tight enough to see the groups: against a reference that decays the biases
  // and LayerNorm parameters too (what the Engine did before tensors carried the flag), the Engine
  // ends visibly elsewhere.
  ScratchDir other_dir;
  const Comparison every = compare(reference_config(other_dir), ReferenceDecay::kEveryTensor);
  std::printf("engine vs reference decaying every tensor: largest weight difference %.3g (%s)\n",
              every.largest_weight_difference, every.where.c_str());
  EXPECT_GT(every.largest_weight_difference, 10 * same.largest_weight_difference);
}

}  // namespace
}  // namespace strata::examples
