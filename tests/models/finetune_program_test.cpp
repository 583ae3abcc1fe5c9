// Proves strata-finetune's run-length and no-silent-overwrite promises on the built-in GPT: a
// 5-step command stopped after 3 steps and restarted with the same --steps 5 --resume ends at step
// 5 with an export bitwise equal to the uninterrupted run's (and a third start trains nothing,
// saying so); a fresh start over the committed store is refused, naming it, with its files
// unchanged, and --overwrite starts it over from step 0. [checkpoint] and [trace]: the run saves
// step-N checkpoints every interval_steps (the newest `keep`), --resume-from the directory ends
// bitwise as the uninterrupted run, a fresh start over them is refused; the trace is written.
// --attention (the Hugging Face decoder's) is refused for the GPT. --profile needs a GPU, and on
// one prints each step's GPU time by kind.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include "io/whole_file.hpp"
#include "tests/io/io_test_support.hpp"

namespace strata::examples {
namespace {

using io::testing::ScratchDir;

std::string read_text(const std::filesystem::path& path) {
  const std::vector<std::uint8_t> bytes = io::read_file_bytes(path);
  return std::string(bytes.begin(), bytes.end());
}

struct FinetuneProgram : ::testing::Test {
  ScratchDir scratch;
  std::filesystem::path text = scratch.path() / "text.txt";

  void SetUp() override {
    std::string corpus;
    for (int i = 0; i < 40; ++i) corpus += "the cat sat on the mat and the dog ran in the sun. ";
    std::ofstream(text) << corpus;
  }
  // A tiny GPT with parameters and optimizer state in an NVMe store under `store`.
  std::filesystem::path config(const std::string& store) const {
    const std::filesystem::path path = scratch.path() / (store + ".toml");
    std::ofstream(path) << "[model]\nlayers = 2\nd_model = 32\nheads = 2\nseq_len = 32\n"
                        << "micro_batch = 4\n[tiers.device]\nkind = \"host\"\nbudget = \"256MiB\"\n"
                        << "[tiers.host]\nbudget = \"64MiB\"\n[tiers.nvme]\ndirect = false\n"
                        << "paths = [\"" << (scratch.path() / store).string() << "\"]\n"
                        << "[zero]\nparams = \"nvme\"\noptimizer = \"nvme\"\n"
                        << "sub_group_size = 4096\n[optimizer]\nlr = 3e-3\n"
                        << "schedule = \"cosine\"\nwarmup_steps = 1\nlr_decay_steps = 5\n";
    return path;
  }
  // stdout and stderr of strata-finetune with `arguments`, and its exit status.
  std::pair<std::string, int> finetune(const std::string& arguments) const {
    const std::filesystem::path output = scratch.path() / "output.txt";
    const std::string command = std::string(STRATA_FINETUNE) + " --data " + text.string() +
                                " --eval-every 0 --eval-batches 1 --blas-threads 1 " + arguments +
                                " > " + output.string() + " 2>&1";
    const int status = std::system(command.c_str());
    return {read_text(output), WEXITSTATUS(status)};
  }
  std::map<std::string, std::vector<std::uint8_t>> store_files(const std::string& store) const {
    std::map<std::string, std::vector<std::uint8_t>> files;
    for (const auto& entry : std::filesystem::directory_iterator(scratch.path() / store)) {
      if (entry.path().extension() == ".lock") continue;
      files[entry.path().filename().string()] = io::read_file_bytes(entry.path());
    }
    return files;
  }
};

// --attention picks the Hugging Face decoder's kernels; the built-in GPT refuses it rather than
// ignoring it, before anything is written.
TEST_F(FinetuneProgram, AttentionIsRefusedWithoutModel) {
  const auto [log, status] = finetune("--config " + config("store").string() +
                                      " --steps 1 --attention fp32");
  EXPECT_EQ(status, 2) << log;
  EXPECT_NE(log.find("--attention picks the Hugging Face decoder's kernels"), std::string::npos)
      << log;
  EXPECT_FALSE(std::filesystem::exists(scratch.path() / "store")) << log;
}

// --synchronous-unit-calls (the schedule before the asynchronous calls; the host's calls are
// synchronous either way) trains the built-in GPT to the same step lines.
TEST_F(FinetuneProgram, SynchronousUnitCallsGiveTheSameSteps) {
  const auto step_lines = [](const std::string& log) {
    std::string lines;
    std::istringstream in(log);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("step ", 0) != 0) continue;
      // "step N | loss L | lr R | ..." up to the lr: what the schedule could change, not timings.
      std::size_t end = 0;
      for (int bar = 0; bar < 3 && end != std::string::npos; ++bar) end = line.find('|', end + 1);
      lines += line.substr(0, end) + "\n";
    }
    return lines;
  };
  const auto [plain, plain_status] = finetune("--config " + config("a").string() + " --steps 2");
  const auto [sync, sync_status] =
      finetune("--config " + config("b").string() + " --steps 2 --synchronous-unit-calls");
  ASSERT_EQ(plain_status, 0) << plain;
  ASSERT_EQ(sync_status, 0) << sync;
  EXPECT_FALSE(step_lines(plain).empty()) << plain;
  EXPECT_EQ(step_lines(plain), step_lines(sync));
}

// --profile reads CUPTI's records of the GPU: on the host device it is refused, saying so,
// before a step runs.
TEST_F(FinetuneProgram, ProfileIsRefusedOnTheHostDevice) {
  const auto [log, status] = finetune("--config " + config("store").string() +
                                      " --steps 1 --device host --profile");
  EXPECT_NE(status, 0) << log;
  EXPECT_NE(log.find("--profile reads the GPU's activity: it needs --device cuda"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("step    1 | loss"), std::string::npos) << log;
}

// On a GPU, every step's line is followed by its GPU time: GEMMs and elementwise kernels ran, and
// the busy time is within the window.
TEST_F(FinetuneProgram, ProfileOnCudaPrintsEachStepsGpuTimeByKind) {
  if (std::system("nvidia-smi -L > /dev/null 2>&1") != 0) GTEST_SKIP() << "no GPU visible";
  const auto [log, status] = finetune("--config " + config("store").string() +
                                      " --steps 2 --device cuda --profile --overwrite");
  ASSERT_EQ(status, 0) << log;
  std::size_t lines = 0;
  for (std::size_t at = log.find("  gpu: "); at != std::string::npos;
       at = log.find("  gpu: ", at + 1)) {
    ++lines;
    const std::string line = log.substr(at, log.find('\n', at) - at);
    EXPECT_NE(line.find("gemm "), std::string::npos) << line;
    EXPECT_NE(line.find("idle "), std::string::npos) << line;
  }
  EXPECT_EQ(lines, 2u) << log;
}

TEST_F(FinetuneProgram, TheSameStepsRestartedFinishesTheSameRun) {
  const std::filesystem::path straight = scratch.path() / "straight.safetensors";
  auto [log, status] = finetune("--config " + config("a").string() + " --steps 5 --export " +
                                straight.string());
  ASSERT_EQ(status, 0) << log;

  const std::string interrupted = "--config " + config("b").string();
  std::tie(log, status) = finetune(interrupted + " --steps 3");  // the "crash" after step 3
  ASSERT_EQ(status, 0) << log;
  const std::filesystem::path resumed = scratch.path() / "resumed.safetensors";
  std::tie(log, status) = finetune(interrupted + " --steps 5 --resume --export " + resumed.string());
  ASSERT_EQ(status, 0) << log;
  EXPECT_NE(log.find("resumed at step 3 from the NVMe store: 2 steps left to reach --steps 5"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("summary: 2 steps"), std::string::npos) << log;
  EXPECT_TRUE(io::read_file_bytes(resumed) == io::read_file_bytes(straight))
      << "the resumed run's weights differ from the uninterrupted run's";

  std::tie(log, status) = finetune(interrupted + " --steps 5 --resume");
  ASSERT_EQ(status, 0) << log;
  EXPECT_NE(log.find("already complete, nothing to train"), std::string::npos) << log;
  EXPECT_NE(log.find("summary: 0 steps"), std::string::npos) << log;
}

TEST_F(FinetuneProgram, AFreshStartOverACommittedStoreIsRefusedUnlessOverwrite) {
  const std::string arguments = "--config " + config("c").string() + " --steps 2";
  auto [log, status] = finetune(arguments);
  ASSERT_EQ(status, 0) << log;
  const auto before = store_files("c");
  std::tie(log, status) = finetune(arguments);
  EXPECT_EQ(status, 1) << log;
  EXPECT_NE(log.find((scratch.path() / "c").string()), std::string::npos) << log;
  EXPECT_NE(log.find("committed at step 2"), std::string::npos) << log;
  EXPECT_NE(log.find("--overwrite"), std::string::npos) << log;
  const auto after = store_files("c");
  ASSERT_EQ(after.size(), before.size()) << "the refused run created or removed files";
  for (const auto& [name, bytes] : before) {
    EXPECT_TRUE(after.at(name) == bytes) << "the refused run changed " << name;
  }

  std::tie(log, status) = finetune(arguments + " --overwrite");
  ASSERT_EQ(status, 0) << log;
  EXPECT_EQ(log.find("resumed"), std::string::npos) << log;
  EXPECT_NE(log.find("summary: 2 steps"), std::string::npos) << log;

  std::tie(log, status) = finetune(arguments + " --overwrite --resume");
  EXPECT_NE(status, 0) << log;  // CLI11: the two exclude each other
}

// config(store) with periodic checkpoints into `checkpoints` and a trace to `trace`.
std::filesystem::path with_checkpoints_and_trace(const std::filesystem::path& config,
                                                 const std::filesystem::path& checkpoints,
                                                 const std::filesystem::path& trace) {
  std::ofstream(config, std::ios::app)
      << "[checkpoint]\ndir = \"" << checkpoints.string() << "\"\ninterval_steps = 2\nkeep = 2\n"
      << "[trace]\npath = \"" << trace.string() << "\"\n";
  return config;
}

std::set<std::string> names_in(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

TEST_F(FinetuneProgram, PeriodicCheckpointsResumeBitwiseAndTheTraceIsWritten) {
  const std::filesystem::path checkpoints = scratch.path() / "checkpoints";
  const std::filesystem::path trace = scratch.path() / "trace.json";
  const std::filesystem::path straight = scratch.path() / "straight.safetensors";
  auto [log, status] = finetune(
      "--config " + with_checkpoints_and_trace(config("d"), checkpoints, trace).string() +
      " --steps 5 --export " + straight.string());
  ASSERT_EQ(status, 0) << log;
  EXPECT_EQ(names_in(checkpoints), (std::set<std::string>{"step-000002", "step-000004"})) << log;
  EXPECT_NE(log.find("checkpoint " + (checkpoints / "step-000004").string()), std::string::npos)
      << log;
  std::ifstream trace_file(trace);
  ASSERT_TRUE(trace_file.good()) << "no trace at [trace] path\n" << log;
  const nlohmann::json events = nlohmann::json::parse(trace_file).at("traceEvents");
  std::size_t forwards = 0;
  for (const nlohmann::json& event : events) {
    forwards += event.at("ph") == "X" && event.at("name").get<std::string>().starts_with("forward");
  }
  EXPECT_GT(forwards, 0u) << "the trace has no forward events";

  // A fresh run over them would replace them: refused, naming the directory, nothing changed.
  const std::string other =
      "--config " + with_checkpoints_and_trace(config("e"), checkpoints, trace).string();
  const std::vector<std::uint8_t> step4 =
      io::read_file_bytes(checkpoints / "step-000004" / "manifest.json");
  std::tie(log, status) = finetune(other + " --steps 5");
  EXPECT_EQ(status, 1) << log;
  EXPECT_EQ(log.find("val loss"), std::string::npos) << "refused only after validating\n" << log;
  EXPECT_NE(log.find(checkpoints.string() + " holds 2 checkpoint(s) past step 0"),
            std::string::npos)
      << log;
  EXPECT_EQ(names_in(checkpoints), (std::set<std::string>{"step-000002", "step-000004"}));
  EXPECT_TRUE(io::read_file_bytes(checkpoints / "step-000004" / "manifest.json") == step4);

  // --resume-from the directory loads its newest (step 4) and ends as the uninterrupted run.
  const std::filesystem::path resumed = scratch.path() / "resumed.safetensors";
  std::tie(log, status) = finetune(other + " --steps 5 --resume-from " + checkpoints.string() +
                                   " --export " + resumed.string());
  ASSERT_EQ(status, 0) << log;
  EXPECT_NE(log.find("loaded checkpoint " + (checkpoints / "step-000004").string() + " (step 4)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("summary: 1 steps"), std::string::npos) << log;
  EXPECT_TRUE(io::read_file_bytes(resumed) == io::read_file_bytes(straight))
      << "the run resumed from step-000004 differs from the uninterrupted run";
}

}  // namespace
}  // namespace strata::examples
