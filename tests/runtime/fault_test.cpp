// Proves faults and bad input never lose committed training state: EIO on read or write, ENOSPC,
// short transfers, flipped bytes (caught by checksums), truncated or missing manifests, bad NVMe
// paths and budgets too small are each a clear error naming what is wrong, and the store reopens
// at its last committed step with bitwise the state that step had.
#include <sys/statvfs.h>
#include <unistd.h>

#include <fstream>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "io/fault_injector.hpp"
#include "io/io_error.hpp"
#include "io/make_engine.hpp"
#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/plan/preflight.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/checkpoint_test_support.hpp"
#include "tiers/nvme_store.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using testing::engine_test_config;
using testing::expect_same_state;
using ::testing::HasSubstr;
using testing::host_device;
using testing::TrainedModel;

Config all_on_nvme(const ScratchDir& dir) {
  Config config = engine_test_config(dir.path().string());
  config.zero.params = Tier::kNvme;
  config.zero.grads = Tier::kNvme;
  config.zero.optimizer = Tier::kNvme;
  config.zero.buffer_count = 3;
  return config;
}

// The state after `steps` clean steps (reference).
std::vector<std::vector<float>> reference_state(int steps) {
  ScratchDir dir;
  TrainedModel run(all_on_nvme(dir));
  run.train(steps);
  return run.state();
}

// Reopens the store in `dir` (a new process would) and checks it is at `step` with the state of
// a clean run of that many steps.
void expect_resumes_at(const ScratchDir& dir, std::uint64_t step, const std::string& what,
                       std::uint64_t or_step = ~std::uint64_t{0}) {
  TrainedModel resumed(all_on_nvme(dir), EngineOptions{.resume = true});
  const std::uint64_t at = resumed.engine->step_count();
  if (at != or_step) {
    EXPECT_EQ(at, step) << what;
  }
  expect_same_state(resumed.state(), reference_state(static_cast<int>(at)), what);
}

// Trains 2 clean steps, then runs one more with `rule` injected; returns the error's text.
std::string fail_third_step(const ScratchDir& dir, io::FaultRule rule) {
  io::FaultInjector faults;
  TrainedModel run(all_on_nvme(dir), EngineOptions{.faults = &faults});
  run.train(2);
  faults.add(std::move(rule));
  try {
    run.train(1);
  } catch (const std::exception& error) {
    EXPECT_FALSE(faults.events().empty());
    return error.what();
  }
  ADD_FAILURE() << "the injected fault did not fail the step";
  return {};
}

TEST(Faults, EioOnWriteFailsTheStepAndKeepsTheLastCommit) {
  ScratchDir dir;
  const std::string message =
      fail_third_step(dir, io::FaultRule::fail_path(".swap", EIO, io::IoOp::kWrite));
  EXPECT_THAT(message, HasSubstr("Input/output error"));
  EXPECT_THAT(message, HasSubstr("strata-rank0.swap"));
  expect_resumes_at(dir, 2, "after EIO on write");
}

TEST(Faults, EioOnReadFailsTheStepAndKeepsTheLastCommit) {
  ScratchDir dir;
  const std::string message =
      fail_third_step(dir, io::FaultRule::fail_path(".swap", EIO, io::IoOp::kRead));
  EXPECT_THAT(message, HasSubstr("Input/output error"));
  expect_resumes_at(dir, 2, "after EIO on read");
}

TEST(Faults, EnospcOnWriteOrManifestFailsTheStepAndKeepsTheLastCommit) {
  for (const char* target : {".swap", ".manifest"}) {
    ScratchDir dir;
    const std::string message =
        fail_third_step(dir, io::FaultRule::fail_path(target, ENOSPC, io::IoOp::kWrite));
    EXPECT_THAT(message, HasSubstr("No space left on device")) << target;
    // The injector fails a write after its bytes landed (as a real device may): a failed manifest
    // write can leave step 3 committed on disk. Either way the state is exactly that step's.
    expect_resumes_at(dir, 2, fmt::format("after ENOSPC writing {}", target), 3);
  }
}

TEST(Faults, FsyncFailureFailsTheCommit) {
  ScratchDir dir;
  const std::string message =
      fail_third_step(dir, io::FaultRule::fail_path(".swap", EIO, io::IoOp::kFsync));
  EXPECT_THAT(message, HasSubstr("Input/output error"));
  expect_resumes_at(dir, 2, "after a failed fsync");
}

TEST(Faults, ShortTransfersAreResumedTransparently) {
  ScratchDir dir;
  io::FaultInjector faults;
  for (std::uint64_t n = 1; n < 400; n += 7) faults.add(io::FaultRule::short_nth(n));
  TrainedModel run(all_on_nvme(dir), EngineOptions{.faults = &faults});
  run.train(3);
  // How many of the rules fire depends on which operations are long enough to shorten (and on
  // completion order); a handful is enough to prove the resumption.
  EXPECT_GE(faults.events().size(), 5u);
  expect_same_state(run.state(), reference_state(3), "with short transfers");
}

TEST(Faults, AByteFlippedInTransitIsCaughtByTheChecksum) {
  ScratchDir dir;
  const std::string message = fail_third_step(
      dir,
      io::FaultRule{std::nullopt, ".swap", io::IoOp::kRead, io::FaultKind::kFlipByteOnRead, 0, 1});
  EXPECT_THAT(message, HasSubstr("checksum mismatch"));
  expect_resumes_at(dir, 2, "after a flipped byte in memory");
}

// Flips one bit of the swap file at `offset`.
void flip_swap_byte(const ScratchDir& dir, std::streamoff offset) {
  std::fstream file(dir.path() / "strata-rank0.swap",
                    std::ios::in | std::ios::out | std::ios::binary);
  char byte = 0;
  file.seekg(offset);
  file.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x10);
  file.seekp(offset);
  file.write(&byte, 1);
}

// The newest commit is taken only if its slots hold its bytes: a flipped byte in one of them
// (bit rot, a lost write) makes opening fall back to the previous commit, whose slots differ.
TEST(Faults, AByteFlippedInACommittedSlotFallsBackToThePreviousCommit) {
  ScratchDir dir;
  { TrainedModel(all_on_nvme(dir)).train(2); }
  // Extent 0 ("layer0/param16/0") was written at steps 0, 1 and 2: slots A, B, A. Its committed
  // bytes start at offset 0 of the swap file.
  flip_swap_byte(dir, 10);
  expect_resumes_at(dir, 1, "newest commit's slot A corrupt");
}

TEST(Faults, ATruncatedNewestManifestFallsBackToThePreviousCommit) {
  ScratchDir dir;
  { TrainedModel(all_on_nvme(dir)).train(2); }
  // Commits 0, 1, 2 went to manifest copies 1, 0, 1 (sequence numbers 1, 2, 3).
  std::filesystem::resize_file(dir.path() / "strata-rank0.manifest.1", 100);
  expect_resumes_at(dir, 1, "newest manifest truncated");
}

TEST(Faults, NoUsableManifestIsAClearError) {
  ScratchDir dir;
  { TrainedModel(all_on_nvme(dir)).train(1); }
  std::filesystem::resize_file(dir.path() / "strata-rank0.manifest.0", 100);
  std::filesystem::resize_file(dir.path() / "strata-rank0.manifest.1", 0);
  try {
    TrainedModel resumed(all_on_nvme(dir), EngineOptions{.resume = true});
    FAIL() << "resumed without a valid manifest";
  } catch (const tiers::StoreCorruption& error) {
    EXPECT_THAT(error.what(), HasSubstr("no valid store manifest for rank 0"));
    EXPECT_THAT(error.what(), HasSubstr("strata-rank0.manifest.0: it has 100 bytes"));
  }
  std::filesystem::remove(dir.path() / "strata-rank0.manifest.0");
  std::filesystem::remove(dir.path() / "strata-rank0.manifest.1");
  try {
    TrainedModel resumed(all_on_nvme(dir), EngineOptions{.resume = true});
    FAIL() << "resumed without a manifest";
  } catch (const tiers::StoreCorruption& error) {
    EXPECT_THAT(error.what(), HasSubstr("cannot resume: no store manifest at"));
  }
}

TEST(Faults, AStoreOfAnotherShapeOrDtypeIsRefusedByName) {
  ScratchDir dir;
  { TrainedModel(all_on_nvme(dir)).train(1); }
  try {
    TrainedModel other(all_on_nvme(dir), EngineOptions{.resume = true}, {24, 72, 41, 8});
    FAIL() << "resumed a store of another shape";
  } catch (const CheckpointMismatch& error) {
    EXPECT_THAT(error.what(), HasSubstr(fmt::format(
                                  "the NVMe store at {} has tensor 'layer1.w' of shape [72, 40]; "
                                  "this model has 'layer1.w' of shape [72, 41]",
                                  dir.path().string())));
  }
  Config fp32 = all_on_nvme(dir);
  fp32.precision.params = DType::kFp32;
  try {
    TrainedModel other(fp32, EngineOptions{.resume = true});
    FAIL() << "resumed a bf16 store with fp32 parameters";
  } catch (const CheckpointMismatch& error) {
    EXPECT_THAT(error.what(), HasSubstr("trained with bf16 parameters; this run has fp32"));
  }
  // Without the model description, the store's own extent lengths still catch the dtype.
  std::filesystem::remove(dir.path() / "strata-rank0.model.json");
  try {
    TrainedModel other(fp32, EngineOptions{.resume = true});
    FAIL() << "resumed a bf16 store with fp32 parameters";
  } catch (const tiers::StoreMismatch& error) {
    EXPECT_THAT(error.what(), HasSubstr("'layer0/param16/0' of 4096 bytes; this model needs "
                                        "'layer0/param16/0' of 8192 bytes (another model shape "
                                        "or dtype)"));
  }
  // The refused opens changed nothing.
  expect_resumes_at(dir, 1, "after refused opens");
}

TEST(Faults, AStoreOfAnotherRankCountIsRefusedByName) {
  ScratchDir dir;
  auto engine = io::make_io_engine(io::IoEngineOptions{});
  {
    tiers::NvmeStore store(*engine, {{dir.path()}, 0, 1}, {{"x", 4096}});
    store.commit(0);
  }
  try {
    tiers::NvmeStore store(*engine, {{dir.path()}, 0, 2, true, 0, tiers::StoreOpenMode::kResume},
                           {{"x", 4096}});
    FAIL() << "opened a 1-rank store with 2 ranks";
  } catch (const tiers::StoreMismatch& error) {
    EXPECT_THAT(error.what(), HasSubstr("written by rank 0 of 1 ranks; this run is rank 0 of 2"));
  }
}

// Paths ---------------------------------------------------------------------------------------

std::string finalize_error(const Config& config) {
  try {
    TrainedModel run(config);
  } catch (const std::exception& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(Faults, AMissingNvmePathIsRefusedByName) {
  ScratchDir dir;
  const Config config = all_on_nvme(dir);
  Config missing = config;
  missing.tiers.nvme.paths = {(dir.path() / "absent").string()};
  EXPECT_THAT(finalize_error(missing),
              HasSubstr(fmt::format("NVMe path '{}' ([tiers.nvme] paths) does not exist",
                                    (dir.path() / "absent").string())));
}

TEST(Faults, AnUnwritableNvmePathIsRefusedByName) {
  // Root passes permission checks; a read-only mount refuses everyone.
  const char* read_only = "/proc/self";
  if (::access(read_only, W_OK) == 0) {
    ScratchDir dir;
    std::filesystem::create_directories(dir.path() / "locked");
    std::filesystem::permissions(dir.path() / "locked", std::filesystem::perms::owner_read |
                                                            std::filesystem::perms::owner_exec);
    if (::access((dir.path() / "locked").c_str(), W_OK) == 0) {
      GTEST_SKIP() << "running as root on a writable file system: no unwritable directory";
    }
    Config config = all_on_nvme(dir);
    config.tiers.nvme.paths = {(dir.path() / "locked").string()};
    EXPECT_THAT(finalize_error(config), HasSubstr("is not writable"));
    return;
  }
  ScratchDir dir;
  Config config = all_on_nvme(dir);
  config.tiers.nvme.paths = {read_only};
  EXPECT_THAT(
      finalize_error(config),
      HasSubstr(fmt::format("NVMe path '{}' ([tiers.nvme] paths) is not writable", read_only)));
}

TEST(Faults, AFileSystemWithoutODirectSaysDirectFalseWorks) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  const std::filesystem::path shm = fmt::format("/dev/shm/strata-fault-test-{}", ::getpid());
  std::filesystem::create_directories(shm);
  Config config = engine_test_config(shm.string());
  config.zero.optimizer = Tier::kNvme;
  const std::string message = finalize_error(config);
  if (message == "(no error)") {
    std::filesystem::remove_all(shm);
    GTEST_SKIP() << "/dev/shm accepts O_DIRECT on this kernel";
  }
  EXPECT_THAT(message, HasSubstr("`direct = false` will work"));
  EXPECT_THAT(message, HasSubstr(shm.string()));
  config.tiers.nvme.direct = false;
  EXPECT_EQ(finalize_error(config), "(no error)");
  std::filesystem::remove_all(shm);
}

TEST(Faults, ANvmePathTooSmallIsRefusedBeforeTrainingNamingTheShortfall) {
  ScratchDir dir;
  struct statvfs fs {};
  ASSERT_EQ(::statvfs(dir.path().c_str(), &fs), 0);
  const std::uint64_t free_bytes = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
  // Units of 8 Mi parameters: 2 slots x 16 B per parameter = 256 MiB of store each.
  const std::uint64_t unit_params = 8ull << 20;
  const std::uint64_t units = free_bytes / (unit_params * 32) + 2;
  if (units > 20000) GTEST_SKIP() << "the scratch file system is too large to overfill";
  Config config = all_on_nvme(dir);
  config.tiers.device.budget_bytes = 1ull << 30;
  config.tiers.host.budget_bytes = 1ull << 30;
  config.zero.sub_group_size = unit_params;
  auto device = host_device(config);
  comm::LocalComm local;
  Engine engine(config, *device, local);
  for (std::uint64_t u = 0; u < units; ++u) {
    engine.add_unit({fmt::format("u{}", u), {{"w", {unit_params}, TensorInit::zeros()}}});
  }
  try {
    engine.finalize();
    FAIL() << "a store larger than the free space was accepted";
  } catch (const NvmePathError& error) {
    EXPECT_THAT(error.what(), HasSubstr(fmt::format("NVMe path '{}' has", dir.path().string())));
    EXPECT_THAT(error.what(), HasSubstr("short by"));
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "strata-rank0.swap"))
      << "nothing may be preallocated before the refusal";
  EXPECT_EQ(engine.host_high_water_bytes(), 0u);
}

TEST(Faults, ADeviceBudgetTooSmallIsRefusedBeforeAllocation) {
  ScratchDir dir;
  Config config = engine_test_config(dir.path().string());
  config.tiers.device.budget_bytes = 32 * 1024;
  EXPECT_THAT(finalize_error(config), HasSubstr("[tiers.device] budget 32.00 KiB is too small"));
  EXPECT_THAT(finalize_error(config), HasSubstr("short by"));
}

TEST(Faults, AHostBudgetTooSmallForNvmeStagingIsRefused) {
  ScratchDir dir;
  Config config = all_on_nvme(dir);
  config.tiers.host.budget_bytes = 16 * 1024;
  const std::string message = finalize_error(config);
  EXPECT_THAT(message, HasSubstr("[tiers.host] budget 16.00 KiB is too small"));
  EXPECT_THAT(message, HasSubstr("NVMe staging"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "strata-rank0.swap"));
}

}  // namespace
}  // namespace strata::runtime
