// Proves 8-bit moments with bf16 master weights (rounded stochastically, or Kahan-compensated)
// fine-tune the tiny GPT as well as fp32 state: the validation loss at the same step is within 2%
// of the fp32 run's (both printed), and the
// exported (decoded) weights load back to the same loss.
#include <cmath>
#include <cstdio>

#include <gtest/gtest.h>

#include "models/training/gpt_trainer.hpp"
#include "models/gpt/gpt_model.hpp"
#include "runtime/comm/local_comm.hpp"
#include "tests/models/tiny_finetune_config.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"

namespace strata::examples {
namespace {

using io::testing::ScratchDir;
using runtime::testing::host_device;

constexpr int kSteps = 40;

// Validation loss after kSteps steps with the optimizer state on NVMe in the given formats.
double validation_after(const ScratchDir& dir, std::string_view formats) {
  runtime::Config config = testing::tiny_finetune_config(dir, formats);
  config.zero.optimizer = runtime::Tier::kNvme;
  gpt::set_blas_threads(1);
  auto device = host_device(config);
  runtime::comm::LocalComm comm;
  GptTrainer trainer(config, *device, comm, {});
  for (int step = 0; step < kSteps; ++step) trainer.train_step();
  return trainer.validation_loss();
}

TEST(CompressedFinetune, Int8MomentsAndBf16MasterMatchFp32Within2Percent) {
  ScratchDir fp32_dir, int8_dir;
  const double fp32 = validation_after(fp32_dir, "");
  const double int8 =
      validation_after(int8_dir, "state_dtype = \"int8\"\nmaster_dtype = \"bf16\"\n");
  std::printf(
      "validation loss after %d steps: fp32 state %.4f, int8 moments + bf16 master %.4f "
      "(%+.2f%%)\n",
      kSteps, fp32, int8, 100 * (int8 - fp32) / fp32);
  EXPECT_LT(std::fabs(int8 - fp32), 0.02 * fp32);
}

TEST(CompressedFinetune, Int8MomentsAndAKahanBf16MasterMatchFp32Within2Percent) {
  ScratchDir fp32_dir, kahan_dir;
  const double fp32 = validation_after(fp32_dir, "");
  const double kahan = validation_after(
      kahan_dir, "state_dtype = \"int8\"\nmaster_dtype = \"bf16\"\nmaster_rounding = \"kahan\"\n");
  std::printf(
      "validation loss after %d steps: fp32 state %.4f, int8 moments + Kahan bf16 master %.4f "
      "(%+.2f%%)\n",
      kSteps, fp32, kahan, 100 * (kahan - fp32) / fp32);
  EXPECT_LT(std::fabs(kahan - fp32), 0.02 * fp32);
}

TEST(CompressedFinetune, ExportedWeightsLoadBackToTheSameLoss) {
  ScratchDir dir;
  const runtime::Config config =
      testing::tiny_finetune_config(dir, "state_dtype = \"int8\"\nmaster_dtype = \"bf16\"\n");
  gpt::set_blas_threads(1);
  const std::filesystem::path exported = dir / "trained.safetensors";
  double trained_loss = 0;
  {
    auto device = host_device(config);
    runtime::comm::LocalComm comm;
    GptTrainer trainer(config, *device, comm, {});
    for (int step = 0; step < 3; ++step) trainer.train_step();
    trained_loss = trainer.validation_loss();
    trainer.export_weights(exported, DType::kFp32);
  }
  ScratchDir other_dir;
  runtime::Config fresh = testing::tiny_finetune_config(other_dir);
  fresh.run.seed = 99;
  auto device = host_device(fresh);
  runtime::comm::LocalComm comm;
  GptTrainer loaded(fresh, *device, comm, {});
  loaded.load_weights(exported);
  // The export is the decoded bf16 master; bf16 parameters are that same master.
  EXPECT_EQ(loaded.validation_loss(), trained_loss);
}

}  // namespace
}  // namespace strata::examples
