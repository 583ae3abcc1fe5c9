// Proves `strata tune` end to end on a tiny budget: it measures, prints the table, the choice and
// the prediction, writes a TOML that the config reader accepts and `strata plan` plans, and
// refuses a bad --time-budget with exit 2 naming the option.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/debug_knobs.hpp"
#include "runtime/config.hpp"

namespace {

using ::testing::HasSubstr;

struct Result {
  int exit_code;
  std::string output;
};

Result run_cli(const std::string& arguments) {
  const std::string command = std::string(STRATA_CLI_PATH) + " " + arguments + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 4096> chunk{};
  while (std::fgets(chunk.data(), chunk.size(), pipe) != nullptr) output += chunk.data();
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// A small model whose optimizer state (12 B x 6.4 M) fits neither budget: it must stream.
std::filesystem::path write_config(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir / "nvme");
  const std::filesystem::path path = dir / "tune.toml";
  std::ofstream(path) << "[tiers.device]\nkind = \"host\"\nbudget = \"64MiB\"\n"
                         "[tiers.host]\nbudget = \"48MiB\"\n"
                         "[tiers.nvme]\npaths = [\"" << (dir / "nvme").string() << "\"]\n"
                         "direct = false\nbudget = \"1GiB\"\n"
                         "[model]\nlayers = 8\nd_model = 256\nheads = 4\n";
  return path;
}

TEST(TuneCommand, WritesAConfigThatPlans) {
  const std::filesystem::path dir = strata::test_tmpdir_knob() / "tune_command";
  std::filesystem::remove_all(dir);
  const std::filesystem::path config = write_config(dir);
  const std::filesystem::path tuned = dir / "tuned.toml";
  const Result result = run_cli("tune " + config.string() + " --time-budget 3s --params 6.4e6 "
                                "--write " + tuned.string());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("mixed MB/s"));
  EXPECT_THAT(result.output, HasSubstr("flush MB/s"));
  EXPECT_THAT(result.output, HasSubstr("checksum: XXH3"));
  EXPECT_THAT(result.output, HasSubstr("ms per sub-group"));  // the Engine calibration ran
  EXPECT_THAT(result.output, HasSubstr("nvme: confirmed"));   // and the chosen point twice
  EXPECT_THAT(result.output, HasSubstr("Adam, cpu_adam::step (fp32 master and moments):"));
  EXPECT_THAT(result.output, HasSubstr("params/s"));
  EXPECT_THAT(result.output, HasSubstr("GPU copies: skipped"));
  EXPECT_THAT(result.output, HasSubstr("predicted step: "));
  EXPECT_THAT(result.output, HasSubstr("the config as given: does not fit"));

  const strata::runtime::Config written = strata::runtime::load_config(tuned);
  EXPECT_EQ(written.zero.optimizer, strata::runtime::Tier::kNvme);
  EXPECT_GE(written.optimizer.threads, 1u);
  EXPECT_EQ(written.model.params, 6'400'000u);  // --params travels with the config
  const Result plan = run_cli("plan " + tuned.string());
  EXPECT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_THAT(plan.output, HasSubstr("the plan fits every tier"));
  // The measurement files are gone; only the tuned config and the drive's folder remain.
  EXPECT_TRUE(std::filesystem::is_empty(dir / "nvme"));
  std::filesystem::remove_all(dir);
}

TEST(TuneCommand, RefusesABadTimeBudget) {
  const std::filesystem::path dir = strata::test_tmpdir_knob() / "tune_command_bad";
  const Result result =
      run_cli("tune " + write_config(dir).string() + " --time-budget soon");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.output, HasSubstr("--time-budget: \"soon\" is not a duration"));
  std::filesystem::remove_all(dir);
}

}  // namespace
