// Proves fine-tuning a Hugging Face folder through the ZeRO-3 Engine: with parameters, gradients
// and optimizer state on NVMe a few steps lower the validation loss from the loaded weights' (not
// a random init's); a run resumed from the NVMe store continues at the same batch with bitwise the
// losses of an uninterrupted run; the trained model exports to a folder that loads back to the
// same validation loss.
#include "models/training/llm_trainer.hpp"

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "models/checkpoint/host_weights.hpp"
#include "runtime/comm/local_comm.hpp"
#include "tests/models/llm/llm_io_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"

namespace strata::llm {
namespace {

using testing::ScratchDir;

runtime::Config all_on_nvme(const ScratchDir& nvme) {
  return runtime::parse_config(R"(
[tiers.device]
kind = "host"
budget = "256MiB"
[tiers.host]
budget = "64MiB"
[tiers.nvme]
direct = false
paths = [")" + nvme.path().string() + R"("]
[zero]
params = "nvme"
grads = "nvme"
optimizer = "nvme"
sub_group_size = 4096
buffer_count = 3
[optimizer]
lr = 3e-3
)");
}

struct Fixture {
  ScratchDir scratch;
  std::filesystem::path model = scratch.path() / "model";
  std::filesystem::path text = scratch.path() / "text.txt";

  Fixture() {
    TinyModelOptions options;
    options.dtype = DType::kBf16;
    write_tiny_model(model, options);
    std::string corpus;
    for (int i = 0; i < 30; ++i) corpus += "the cat sat on the mat and the dog ran in the sun. ";
    std::ofstream(text) << corpus;
  }
  LlmTrainerOptions options() const {
    LlmTrainerOptions trainer;
    trainer.model_dir = model;
    trainer.data = {text};
    trainer.seq_len = 32;
    trainer.micro_batch = 4;
    return trainer;
  }
};

TEST(LlmTrainer, StepsWithStateOnNvmeLowerTheLossFromTheLoadedWeights) {
  set_blas_threads(1);
  Fixture fixture;
  ScratchDir nvme;
  const runtime::Config config = all_on_nvme(nvme);
  auto device = runtime::testing::host_device(config);
  runtime::comm::LocalComm comm;
  LlmTrainer trainer(config, *device, comm, fixture.options());
  // The loaded weights, not the Engine's random initialisation: the host model agrees.
  const HostWeights loaded = HostWeights::load(fixture.model, trainer.model().units());
  for (std::size_t u = 0; u < loaded.unit_count(); ++u) {
    const std::vector<float> master = trainer.engine().gather_master(static_cast<runtime::UnitId>(u));
    ASSERT_EQ(std::memcmp(master.data(), loaded.unit(u).data(), loaded.unit(u).size_bytes()), 0)
        << trainer.model().units()[u].name;
  }
  const double initial = trainer.validation_loss();
  double last_nvme_read = 0;
  for (int step = 0; step < 12; ++step) {
    last_nvme_read = static_cast<double>(trainer.train_step().optimizer.nvme.read_bytes);
  }
  EXPECT_GT(last_nvme_read, 0) << "the state lives on NVMe";
  EXPECT_LT(trainer.validation_loss(), initial - 1.0) << "from " << initial;
}

std::vector<double> losses(LlmTrainer& trainer, int steps) {
  std::vector<double> out;
  for (int step = 0; step < steps; ++step) out.push_back(trainer.train_step().loss);
  return out;
}

TEST(LlmTrainer, AResumedRunContinuesAtTheSameBatchBitwise) {
  set_blas_threads(1);
  Fixture fixture;
  std::vector<double> uninterrupted;
  {
    ScratchDir nvme;
    const runtime::Config config = all_on_nvme(nvme);
    auto device = runtime::testing::host_device(config);
    runtime::comm::LocalComm comm;
    LlmTrainer trainer(config, *device, comm, fixture.options());
    uninterrupted = losses(trainer, 4);
  }
  ScratchDir nvme;
  const runtime::Config config = all_on_nvme(nvme);
  runtime::comm::LocalComm comm;
  {
    auto device = runtime::testing::host_device(config);
    LlmTrainer first(config, *device, comm, fixture.options());
    losses(first, 2);
  }
  LlmTrainerOptions resume = fixture.options();
  resume.resume = true;
  auto device = runtime::testing::host_device(config);
  LlmTrainer resumed(config, *device, comm, resume);
  ASSERT_EQ(resumed.engine().step_count(), 2u);
  const std::vector<double> rest = losses(resumed, 2);
  EXPECT_EQ(std::memcmp(&rest[0], &uninterrupted[2], sizeof(double)), 0)
      << rest[0] << " vs " << uninterrupted[2];
  EXPECT_EQ(std::memcmp(&rest[1], &uninterrupted[3], sizeof(double)), 0)
      << rest[1] << " vs " << uninterrupted[3];
}

runtime::Config optimizer_on_host_deferred(const ScratchDir& nvme) {
  return runtime::parse_config(R"(
[tiers.device]
kind = "host"
budget = "256MiB"
[tiers.host]
budget = "64MiB"
[tiers.nvme]
direct = false
paths = [")" + nvme.path().string() + R"("]
[zero]
optimizer = "host"
sub_group_size = 4096
persistence_threshold = 0
overlap_optimizer = true
defer_update = true
[optimizer]
lr = 3e-3
grad_clip = 0.05
)");
}

// [Note: asynchronous unit calls]: the passes' asynchronous schedule (handles released as soon as
// a call is queued, each gradient reduced while the next unit's backward runs, from two slots) run
// over the host's synchronous calls through an ImmediateFence: the same losses and weights, bit
// for bit, as the synchronous schedule, with the state on NVMe, and with the optimizer on the host
// speculating during the backward and deferring clipped updates into the next forward.
TEST(LlmTrainer, TheAsynchronousScheduleChangesNoBit) {
  set_blas_threads(1);
  Fixture fixture;
  for (const bool nvme_state : {true, false}) {
    SCOPED_TRACE(nvme_state ? "state on NVMe" : "optimizer on host, deferred");
    const auto run = [&](LlmTrainerOptions::UnitCalls calls) {
      ScratchDir nvme;
      const runtime::Config config =
          nvme_state ? all_on_nvme(nvme) : optimizer_on_host_deferred(nvme);
      auto device = runtime::testing::host_device(config);
      runtime::comm::LocalComm comm;
      LlmTrainerOptions options = fixture.options();
      options.grad_accumulation = 2;
      options.unit_calls = calls;
      LlmTrainer trainer(config, *device, comm, options);
      EXPECT_EQ(trainer.asynchronous_unit_calls(),
                calls == LlmTrainerOptions::UnitCalls::kAsynchronous);
      std::pair<std::vector<double>, std::vector<std::vector<float>>> result;
      result.first = losses(trainer, 3);
      for (std::size_t u = 0; u < trainer.model().units().size(); ++u) {
        result.second.push_back(trainer.engine().gather_master(static_cast<runtime::UnitId>(u)));
      }
      return result;
    };
    const auto synchronous = run(LlmTrainerOptions::UnitCalls::kAuto);  // the host's: synchronous
    const auto asynchronous = run(LlmTrainerOptions::UnitCalls::kAsynchronous);
    for (std::size_t step = 0; step < synchronous.first.size(); ++step) {
      EXPECT_EQ(std::memcmp(&asynchronous.first[step], &synchronous.first[step], sizeof(double)), 0)
          << "step " << step << ": " << asynchronous.first[step] << " vs "
          << synchronous.first[step];
    }
    ASSERT_EQ(asynchronous.second.size(), synchronous.second.size());
    for (std::size_t u = 0; u < synchronous.second.size(); ++u) {
      EXPECT_EQ(std::memcmp(asynchronous.second[u].data(), synchronous.second[u].data(),
                            synchronous.second[u].size() * sizeof(float)),
                0)
          << "unit " << u;
    }
  }
}

// --document-mask reaches the decoder: with many short documents most windows cross a boundary,
// and the masked run's validation loss differs from the unmasked one's on the same weights.
TEST(LlmTrainer, DocumentMaskSeparatesThePackedDocuments) {
  set_blas_threads(1);
  Fixture fixture;
  std::vector<std::filesystem::path> documents;
  for (int d = 0; d < 8; ++d) {
    documents.push_back(fixture.scratch.path() / ("doc" + std::to_string(d) + ".txt"));
    std::ofstream(documents.back()) << "the dog ran " << d << " times in the sun.";
  }
  std::vector<double> validation;
  for (const bool mask : {false, true}) {
    ScratchDir nvme;
    const runtime::Config config = all_on_nvme(nvme);
    auto device = runtime::testing::host_device(config);
    runtime::comm::LocalComm comm;
    LlmTrainerOptions options = fixture.options();
    options.data = documents;
    options.seq_len = 40;  // documents of about 25 tokens: every window spans a boundary
    options.document_mask = mask;
    LlmTrainer trainer(config, *device, comm, options);
    EXPECT_EQ(trainer.model().options().document_separator.has_value(), mask);
    validation.push_back(trainer.validation_loss());
  }
  EXPECT_GT(std::abs(validation[1] - validation[0]), 1e-4 * validation[0])
      << validation[0] << " unmasked, " << validation[1] << " masked";
}

TEST(LlmTrainer, ExportedFolderLoadsBackToTheSameValidationLoss) {
  set_blas_threads(1);
  Fixture fixture;
  ScratchDir nvme;
  runtime::Config config = all_on_nvme(nvme);
  config.precision.params = DType::kFp32;  // the gathered copy is the master itself
  auto device = runtime::testing::host_device(config);
  runtime::comm::LocalComm comm;
  LlmTrainer trainer(config, *device, comm, fixture.options());
  losses(trainer, 3);
  const double trained = trainer.validation_loss();
  const std::filesystem::path out = fixture.scratch.path() / "exported";
  ExportOptions export_options;
  export_options.dtype = DType::kFp32;
  trainer.export_hf(out, export_options);

  ScratchDir other_nvme;
  const runtime::Config other = all_on_nvme(other_nvme);
  runtime::Config fp32 = other;
  fp32.precision.params = DType::kFp32;
  LlmTrainerOptions reload = fixture.options();
  reload.model_dir = out;
  auto other_device = runtime::testing::host_device(fp32);
  LlmTrainer loaded(fp32, *other_device, comm, reload);
  EXPECT_EQ(loaded.validation_loss(), trained);
}

}  // namespace
}  // namespace strata::llm
