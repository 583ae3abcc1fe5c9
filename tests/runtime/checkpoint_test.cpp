// Proves checkpoints never lose training state: save + load + more steps is bitwise the run never
// interrupted (any tier placement on either side, loss scale and step restored); saving is atomic
// (a crashed save leaves the previous checkpoint loadable); another model shape, dtype or optimizer
// and corrupt or truncated files are clear errors that change nothing; safetensors export/import
// round-trips the master weights.
#include "runtime/checkpoint/checkpoint.hpp"

#include <cmath>
#include <fstream>
#include <iterator>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/checkpoint/safetensors.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/checkpoint_test_support.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using testing::engine_test_config;
using testing::expect_same_state;
using ::testing::HasSubstr;
using testing::TrainedModel;

Config placed(const ScratchDir& dir, Tier params, Tier grads, Tier optimizer) {
  Config config = engine_test_config(dir.path().string());
  config.zero.params = params;
  config.zero.grads = grads;
  config.zero.optimizer = optimizer;
  return config;
}

// `second` loads `checkpoint` (saved after 3 steps) and trains 2 more: the same losses and final
// state as `straight`, trained 5 steps without a break.
void expect_continues_like(TrainedModel& second, const std::filesystem::path& checkpoint,
                           TrainedModel& straight, const std::string& what) {
  second.engine->load(checkpoint);
  EXPECT_EQ(second.engine->step_count(), 3u) << what;
  second.train(2);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(second.losses[i], straight.losses[3 + i]) << what << " step " << 3 + i;
  }
  expect_same_state(second.state(), straight.state(), what);
}

// Every unit's gathered master is bitwise the same in both runs.
void expect_same_masters(TrainedModel& got_run, TrainedModel& want_run) {
  ASSERT_EQ(got_run.model->units().size(), want_run.model->units().size());
  for (std::size_t u = 0; u < want_run.model->units().size(); ++u) {
    const std::vector<float> want = want_run.engine->gather_master(want_run.model->units()[u]);
    const std::vector<float> got = got_run.engine->gather_master(got_run.model->units()[u]);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "unit " << u;
  }
}

TEST(Checkpoint, SaveLoadContinueIsBitwiseTheUninterruptedRun) {
  ScratchDir dir;
  struct Case {
    Tier save_params, save_optimizer, load_params, load_optimizer;
  };
  TrainedModel straight(placed(dir, Tier::kDevice, Tier::kDevice, Tier::kHost));
  straight.train(5);
  for (const Case& c : {Case{Tier::kDevice, Tier::kHost, Tier::kDevice, Tier::kHost},
                        Case{Tier::kNvme, Tier::kNvme, Tier::kHost, Tier::kDevice},
                        Case{Tier::kHost, Tier::kDevice, Tier::kNvme, Tier::kNvme}}) {
    const std::string what = fmt::format("saved with params {} optimizer {}, loaded into {} {}",
                                         to_string(c.save_params), to_string(c.save_optimizer),
                                         to_string(c.load_params), to_string(c.load_optimizer));
    ScratchDir save_nvme, load_nvme;
    const std::filesystem::path checkpoint = dir.path() / "ckpt";
    {
      TrainedModel first(placed(save_nvme, c.save_params, Tier::kNvme, c.save_optimizer));
      first.train(3);
      first.engine->save(checkpoint);
    }
    TrainedModel second(placed(load_nvme, c.load_params, Tier::kHost, c.load_optimizer));
    expect_continues_like(second, checkpoint, straight, what);
  }
}

// Host fractions split a kind between host memory and NVMe; a checkpoint saved from the split and
// loaded into another split continues bitwise like the run never interrupted.
TEST(Checkpoint, HostFractionsSaveAndLoadLikeAnyPlacement) {
  ScratchDir dir;
  TrainedModel straight(placed(dir, Tier::kDevice, Tier::kDevice, Tier::kHost));
  straight.train(5);
  const auto split = [](const ScratchDir& nvme, double params, double grads, double optimizer) {
    Config config = placed(nvme, Tier::kNvme, Tier::kNvme, Tier::kNvme);
    config.zero.params_host_fraction = params;
    config.zero.grads_host_fraction = grads;
    config.zero.optimizer_host_fraction = optimizer;
    return config;
  };
  ScratchDir save_nvme, load_nvme;
  const std::filesystem::path checkpoint = dir.path() / "ckpt";
  {
    TrainedModel first(split(save_nvme, 0.5, 0.75, 0.25));
    first.train(3);
    first.engine->save(checkpoint);
  }
  TrainedModel second(split(load_nvme, 0.25, 0.5, 0.75));
  expect_continues_like(second, checkpoint, straight,
                        "host fractions 0.5/0.75/0.25 -> 0.25/0.5/0.75");
}

TEST(Checkpoint, LossScaleAndStepAreRestored) {
  ScratchDir dir;
  Config config = engine_test_config(dir.path().string());
  config.precision.params = DType::kFp16;
  config.precision.grads = DType::kFp16;
  config.precision.loss_scale = 1024;
  config.precision.loss_scale_window = 1;  // doubles after every clean step
  TrainedModel first(config);
  first.train(3);
  const double scale = first.engine->loss_scale();
  ASSERT_EQ(scale, 8192.0);
  first.engine->save(dir.path() / "ckpt");
  // A second Engine alive beside the first needs its own NVMe path (the store is locked per path:
  // STRATA_FORCE_NVME=1 homes everything there).
  ScratchDir second_dir;
  config.tiers.nvme.paths = {second_dir.path().string()};
  TrainedModel second(config);
  EXPECT_EQ(second.engine->loss_scale(), 1024.0);
  second.engine->load(dir.path() / "ckpt");
  EXPECT_EQ(second.engine->loss_scale(), scale);
  EXPECT_EQ(second.engine->step_count(), 3u);
  first.train(2);
  second.train(2);
  expect_same_state(second.state(), first.state(), "fp16 with dynamic loss scale");
}

TEST(Checkpoint, ResavingReplacesAndACrashedSaveLeavesThePreviousOne) {
  ScratchDir dir;
  const std::filesystem::path checkpoint = dir.path() / "ckpt";
  TrainedModel run(engine_test_config(dir.path().string()));
  run.train(1);
  run.engine->save(checkpoint);
  run.train(1);
  run.engine->save(checkpoint.string() + "/");  // replaces step 1 (a trailing slash is the same)
  const auto at_two = run.state();
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "ckpt.tmp"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "ckpt.old"));
  // A save that crashed while writing shards left a partial "ckpt.tmp": ignored by load.
  std::filesystem::create_directories(dir.path() / "ckpt.tmp");
  std::ofstream(dir.path() / "ckpt.tmp" / "rank00000.bin") << "partial";
  // A crash between the two renames leaves only "ckpt.old": load falls back to it.
  std::filesystem::rename(checkpoint, dir.path() / "ckpt.old");
  ScratchDir loaded_dir;  // beside `run`, which holds dir's NVMe store
  TrainedModel loaded(engine_test_config(loaded_dir.path().string()));
  loaded.engine->load(checkpoint);
  EXPECT_EQ(loaded.engine->step_count(), 2u);
  expect_same_state(loaded.state(), at_two, "loaded from ckpt.old");
  // The next save cleans both up.
  loaded.engine->save(checkpoint);
  EXPECT_TRUE(std::filesystem::exists(checkpoint / "manifest.json"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "ckpt.tmp"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "ckpt.old"));
}

// Regression (issue 14): a crash after a save finished its files but before the swap leaves the
// newest checkpoint complete under "ckpt.tmp", beside an older "ckpt.old"; load takes the newest.
TEST(Checkpoint, ACompleteTmpBesideOldIsTheNewestAndIsLoaded) {
  ScratchDir dir;
  const std::filesystem::path checkpoint = dir.path() / "ckpt";
  TrainedModel run(engine_test_config(dir.path().string()));
  run.train(1);
  run.engine->save(dir.path() / "older");
  run.train(1);
  run.engine->save(checkpoint);
  const auto at_two = run.state();
  std::filesystem::rename(dir.path() / "older", dir.path() / "ckpt.old");
  std::filesystem::rename(checkpoint, dir.path() / "ckpt.tmp");
  ScratchDir loaded_dir;
  TrainedModel loaded(engine_test_config(loaded_dir.path().string()));
  loaded.engine->load(checkpoint);
  EXPECT_EQ(loaded.engine->step_count(), 2u);
  expect_same_state(loaded.state(), at_two, "loaded from ckpt.tmp");
  // The next save publishes it before staging anew, then replaces it: one directory left.
  loaded.train(1);
  loaded.engine->save(checkpoint);
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "ckpt.tmp"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "ckpt.old"));
  ScratchDir again_dir;
  TrainedModel again(engine_test_config(again_dir.path().string()));
  again.engine->load(checkpoint);
  EXPECT_EQ(again.engine->step_count(), 3u);
  expect_same_state(again.state(), loaded.state(), "after the next save");
}

// A failed load names the problem and leaves the engine's state as it was.
void expect_load_error(TrainedModel& target, const std::filesystem::path& checkpoint,
                       const std::string& expected) {
  const auto before = target.state();
  try {
    target.engine->load(checkpoint);
    FAIL() << "loaded " << checkpoint << "; expected an error containing: " << expected;
  } catch (const std::exception& error) {
    EXPECT_THAT(error.what(), HasSubstr(expected));
  }
  expect_same_state(target.state(), before, "after a failed load");
  EXPECT_EQ(target.engine->step_count(), 0u);
}

// The models that load a checkpoint start afresh in the NVMe path of the run that saved it (a store
// only under STRATA_FORCE_NVME=1, whose committed step they overwrite on purpose).
const EngineOptions kOverSaved{.overwrite = true};

TEST(Checkpoint, AnotherModelShapeDtypeOrOptimizerIsRefusedByName) {
  ScratchDir dir;
  const std::filesystem::path checkpoint = dir.path() / "ckpt";
  {
    TrainedModel saved(engine_test_config(dir.path().string()));
    saved.train(1);
    saved.engine->save(checkpoint);
  }
  {
    TrainedModel wider(engine_test_config(dir.path().string()), kOverSaved, {24, 72, 41, 8});
    expect_load_error(wider, checkpoint,
                      "tensor 'layer1.w' of shape [72, 40]; this model has 'layer1.w' of shape "
                      "[72, 41]");
  }
  {
    TrainedModel deeper(engine_test_config(dir.path().string()), kOverSaved, {24, 72, 40, 8, 8});
    expect_load_error(deeper, checkpoint, "holds 3 units; this model has 4");
  }
  {
    Config fp16 = engine_test_config(dir.path().string());
    fp16.precision.params = DType::kFp16;
    TrainedModel other(fp16, kOverSaved);
    expect_load_error(other, checkpoint, "trained with bf16 parameters; this run has fp16");
  }
  {
    Config lion = engine_test_config(dir.path().string());
    lion.optimizer.type = OptimizerType::kLion;
    TrainedModel other(lion, kOverSaved);
    expect_load_error(other, checkpoint, "holds adamw optimizer state; this run uses lion");
  }
}

TEST(Checkpoint, CorruptTruncatedOrMissingFilesAreRefused) {
  ScratchDir dir;
  const std::filesystem::path checkpoint = dir.path() / "ckpt";
  {
    TrainedModel saved(engine_test_config(dir.path().string()));
    saved.train(1);
    saved.engine->save(checkpoint);
  }
  TrainedModel target(engine_test_config(dir.path().string()), kOverSaved);
  const std::filesystem::path shard = checkpoint / "rank00000.bin";
  {  // One flipped byte in a shard: the segment checksum catches it.
    std::fstream file(shard, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(100);
    char byte = 0;
    file.read(&byte, 1);
    byte = static_cast<char>(~byte);
    file.seekp(100);
    file.write(&byte, 1);
  }
  expect_load_error(target, checkpoint, "checksum mismatch in " + shard.string() + " at offset 0");
  std::filesystem::resize_file(shard, 64);
  expect_load_error(target, checkpoint, "(truncated)");
  std::filesystem::remove(shard);
  expect_load_error(target, checkpoint, shard.string());
  const std::filesystem::path manifest = checkpoint / "manifest.json";
  std::filesystem::resize_file(manifest, std::filesystem::file_size(manifest) / 2);
  expect_load_error(target, checkpoint, "is not valid JSON");
  std::filesystem::remove(manifest);
  expect_load_error(target, checkpoint, manifest.string());
}

// Checkpoints reach device-homed state through the staged data path (the CUDA path: streams and
// pinned staging) exactly as through the direct one: saved on one path and loaded on the other,
// training continues bitwise as the uninterrupted run; an export on the staged path is bitwise the
// direct path's, and an import on it gives the same masters.
TEST(Checkpoint, StagedDevicePathSavesLoadsAndExportsLikeTheDirectPath) {
  ScratchDir dir;
  EngineOptions staged;
  staged.device_access = EngineOptions::DeviceAccess::kStaged;
  TrainedModel straight(placed(dir, Tier::kDevice, Tier::kDevice, Tier::kHost));
  straight.train(5);
  for (const bool save_staged : {true, false}) {
    const std::string what =
        save_staged ? "saved staged, loaded direct" : "saved direct, loaded staged";
    ScratchDir save_nvme, load_nvme;
    const std::filesystem::path checkpoint = dir.path() / "ckpt";
    {
      TrainedModel first(placed(save_nvme, Tier::kDevice, Tier::kDevice, Tier::kDevice),
                         save_staged ? staged : EngineOptions{});
      first.train(3);
      first.engine->save(checkpoint);
    }
    TrainedModel second(placed(load_nvme, Tier::kDevice, Tier::kDevice, Tier::kDevice),
                        save_staged ? EngineOptions{} : staged);
    expect_continues_like(second, checkpoint, straight, what);
  }

  const auto read_bytes = [](const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  ScratchDir direct_nvme, staged_nvme, import_nvme;
  TrainedModel direct(placed(direct_nvme, Tier::kDevice, Tier::kDevice, Tier::kDevice));
  TrainedModel on_staged(placed(staged_nvme, Tier::kDevice, Tier::kDevice, Tier::kDevice), staged);
  direct.train(2);
  on_staged.train(2);
  direct.engine->export_safetensors(dir.path() / "direct.safetensors");
  on_staged.engine->export_safetensors(dir.path() / "staged.safetensors");
  EXPECT_EQ(read_bytes(dir.path() / "direct.safetensors"),
            read_bytes(dir.path() / "staged.safetensors"));
  TrainedModel imported(placed(import_nvme, Tier::kDevice, Tier::kDevice, Tier::kDevice), staged);
  imported.engine->import_safetensors(dir.path() / "direct.safetensors");
  expect_same_masters(imported, direct);
  EXPECT_EQ(imported.model->train_step(*imported.engine), direct.model->train_step(*direct.engine));
}

TEST(Checkpoint, SafetensorsExportImportRoundTrips) {
  ScratchDir dir;
  TrainedModel trained(engine_test_config(dir.path().string()));
  trained.train(2);
  const std::filesystem::path fp32 = dir.path() / "model.safetensors";
  const std::filesystem::path bf16 = dir.path() / "model-bf16.safetensors";
  trained.engine->export_safetensors(fp32);
  trained.engine->export_safetensors(bf16, DType::kBf16);
  const SafetensorsFile file = SafetensorsFile::read(fp32);
  EXPECT_EQ(file.entries().size(), 6u);
  EXPECT_EQ(file.metadata().at("step"), "2");
  ASSERT_NE(file.find("layer1.w"), nullptr);
  EXPECT_EQ(file.find("layer1.w")->shape, (std::vector<std::size_t>{72, 40}));
  const SafetensorsFile half = SafetensorsFile::read(bf16);
  ASSERT_NE(half.find("layer1.w"), nullptr);
  EXPECT_EQ(half.find("layer1.w")->dtype, DType::kBf16);
  std::vector<float> full(72 * 40), rounded(72 * 40);
  file.read_fp32(*file.find("layer1.w"), full);
  half.read_fp32(*half.find("layer1.w"), rounded);
  for (std::size_t i = 0; i < full.size(); ++i) {
    ASSERT_NEAR(rounded[i], full[i], std::fabs(full[i]) * 0x1p-8f) << "element " << i;
  }

  ScratchDir other;
  Config config = engine_test_config(other.path().string());
  config.zero.optimizer = Tier::kNvme;
  config.zero.params = Tier::kNvme;
  TrainedModel imported(config);
  imported.engine->import_safetensors(fp32);
  EXPECT_EQ(imported.engine->step_count(), 0u);
  expect_same_masters(imported, trained);
  for (std::size_t u = 0; u < imported.model->units().size(); ++u) {
    const std::vector<float> moments = imported.engine->state_shard(u, OptimizerState::kExpAvg);
    for (float m : moments) ASSERT_EQ(m, 0.0f);
  }
  // The imported parameters are the ones the forward pass sees.
  const float loss = imported.model->train_step(*imported.engine);
  const float reference = trained.model->train_step(*trained.engine);
  EXPECT_EQ(loss, reference);

  ScratchDir narrower_dir;  // beside `imported`, which holds other's NVMe store
  TrainedModel narrower(engine_test_config(narrower_dir.path().string()), {}, {24, 72, 40, 7});
  try {
    narrower.engine->import_safetensors(fp32);
    FAIL() << "imported a file of another shape";
  } catch (const SafetensorsError& error) {
    EXPECT_EQ(error.tensor(), "layer2.w");
    EXPECT_THAT(error.problem(), HasSubstr("shape [40, 8] differs from the model's [40, 7]"));
  }
}

}  // namespace
}  // namespace strata::runtime
