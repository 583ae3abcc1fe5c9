// Proves `strata tune` end to end on a tiny budget: it measures (Adam in the update the config
// runs), prints the table, the choice and the prediction, writes a TOML that the config reader
// accepts and `strata plan` plans, validates over rounds with both verdicts, and refuses a bad
// --time-budget or --validate-rounds with exit 2 naming the option.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/debug_knobs.hpp"
#include "runtime/config/config.hpp"

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
// `extra`: more TOML appended.
std::filesystem::path write_config(const std::filesystem::path& dir,
                                   const std::string& extra = "") {
  std::filesystem::create_directories(dir / "nvme");
  const std::filesystem::path path = dir / "tune.toml";
  std::ofstream(path) << "[tiers.device]\nkind = \"host\"\nbudget = \"64MiB\"\n"
                         "[tiers.host]\nbudget = \"48MiB\"\n"
                         "[tiers.nvme]\npaths = [\"" << (dir / "nvme").string() << "\"]\n"
                         "direct = false\nbudget = \"1GiB\"\n"
                         "[model]\nlayers = 8\nd_model = 256\nheads = 4\n" << extra;
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

TEST(TuneCommand, RefusesZeroValidationRoundsNamingTheOption) {
  const std::filesystem::path dir = strata::test_tmpdir_knob() / "tune_command_rounds";
  const Result result =
      run_cli("tune " + write_config(dir).string() + " --validate --validate-rounds 0");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.output, HasSubstr("--validate-rounds: 0 is not a number of rounds"));
  const Result help = run_cli("tune --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_THAT(help.output, HasSubstr("--validate-rounds"));
  std::filesystem::remove_all(dir);
}

// Int8 moments and a bf16 master: tune times the fused compressed update, and --validate times
// every config in each of two rounds, then prints the spreads and both verdicts.
TEST(TuneCommand, CompressedStateMeasuresItsUpdateAndValidatesOverRounds) {
  const std::filesystem::path dir = strata::test_tmpdir_knob() / "tune_command_compressed";
  std::filesystem::remove_all(dir);
  const std::filesystem::path config = write_config(
      dir, "[optimizer]\nstate_dtype = \"int8\"\nmaster_dtype = \"bf16\"\n");
  const Result result = run_cli("tune " + config.string() + " --time-budget 3s --params 6.4e6 "
                                "--validate --validate-params 1e6 --validate-rounds 2");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output,
              HasSubstr("Adam, cpu_adam::step_compressed (bf16 master, int8 moments):"));
  EXPECT_THAT(result.output, HasSubstr("2 round(s), each timing every config once"));
  EXPECT_THAT(result.output, HasSubstr("spread"));
  EXPECT_THAT(result.output, HasSubstr("verdict 1: the tuned config measured"));
  EXPECT_THAT(result.output, HasSubstr("verdict 2: the tuned config"));
  // The validation's scratch folders are gone.
  EXPECT_TRUE(std::filesystem::is_empty(dir / "nvme"));
  std::filesystem::remove_all(dir);
}

}  // namespace
