// Proves `strata plan` end to end: the seeds' figures on stdout, exit 2 for a bad config with the
// location in the message, exit 3 with the short tier named when the plan does not fit; and that
// `strata bench step` writes the Chrome trace [trace] path names (--trace overriding it).
#include <sys/wait.h>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/debug_knobs.hpp"

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

std::string write_temp(const std::string& name, const std::string& text) {
  const std::filesystem::path path = strata::test_tmpdir_knob() / name;
  std::ofstream(path) << text;
  return path.string();
}

const std::string kDefaultConfig =
    std::string(STRATA_SOURCE_DIR) + "/examples/configs/default.toml";

TEST(PlanCommand, PrintsTheSeedsFiguresForEachStage) {
  const char* expected[] = {"120.0 GB", "31.4 GB", "16.6 GB", "1.9 GB"};
  for (int stage = 0; stage <= 3; ++stage) {
    const std::string config =
        write_temp("plan_stage.toml",
                   "[zero]\nstage = " + std::to_string(stage) +
                       "\n[tiers.device]\nbudget = \"1TiB\"\n[tiers.host]\nbudget = \"1TiB\"\n");
    const Result result = run_cli("plan " + config + " --params 7.5e9 --ranks 64");
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_THAT(result.output, HasSubstr(std::string("model state per rank: ") + expected[stage]));
  }
}

TEST(PlanCommand, JsonOutputParses) {
  const Result result = run_cli("plan " + kDefaultConfig + " --json");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  const nlohmann::json json = nlohmann::json::parse(result.output);
  EXPECT_TRUE(json["fits"].get<bool>());
  EXPECT_GT(json["params"].get<std::uint64_t>(), 20'000'000u);
}

TEST(PlanCommand, BadConfigExitsTwoWithLocation) {
  const std::string config = write_temp("plan_bad.toml", "[zero]\nstagee = 3\n");
  const Result result = run_cli("plan " + config);
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.output, HasSubstr("plan_bad.toml:2:1: zero.stagee"));
  EXPECT_THAT(result.output, HasSubstr("did you mean \"stage\"?"));
}

TEST(PlanCommand, BadParamsExitsTwo) {
  const Result result = run_cli("plan " + kDefaultConfig + " --params lots");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_THAT(result.output, HasSubstr("--params: \"lots\""));
}

TEST(PlanCommand, PlanThatDoesNotFitExitsThreeAndSuggests) {
  const Result result = run_cli("plan " + kDefaultConfig + " --params 7.5e9");
  EXPECT_EQ(result.exit_code, 3) << result.output;
  EXPECT_THAT(result.output, HasSubstr("does not fit: the host tier is short by"));
  EXPECT_THAT(result.output, HasSubstr("raise [tiers.host] budget to at least"));
}

// The purposes of a --json plan's host buffers.
std::vector<std::string> host_buffer_purposes(const std::string& plan_json) {
  std::vector<std::string> purposes;
  const nlohmann::json plan = nlohmann::json::parse(plan_json);
  for (const nlohmann::json& buffer : plan.at("buffers")) {
    if (buffer.at("tier") == "host") purposes.push_back(buffer.at("purpose").get<std::string>());
  }
  return purposes;
}

// The bug: `strata plan CONFIG --device cuda` with [tiers.device] kind = "auto" planned the host
// device's data path (tens of GiB of host undo copies that a CUDA run never allocates, none of
// its pinned staging), unlike the same config with kind = "cuda". --device decides the data path.
TEST(PlanCommand, DeviceFlagDecidesTheDataPathWhateverTheConfigsKind) {
  const std::string placement =
      "budget = \"64GiB\"\n[tiers.host]\nbudget = \"64GiB\"\n[zero]\noptimizer = \"device\"\n";
  const std::string automatic =
      write_temp("plan_kind_auto.toml", "[tiers.device]\nkind = \"auto\"\n" + placement);
  const std::string cuda =
      write_temp("plan_kind_cuda.toml", "[tiers.device]\nkind = \"cuda\"\n" + placement);
  const Result flagged = run_cli("plan " + automatic + " --params 1e9 --device cuda --json");
  const Result configured = run_cli("plan " + cuda + " --params 1e9 --json");
  ASSERT_EQ(flagged.exit_code, 0) << flagged.output;
  ASSERT_EQ(configured.exit_code, 0) << configured.output;
  EXPECT_EQ(host_buffer_purposes(flagged.output), host_buffer_purposes(configured.output));
  EXPECT_THAT(::testing::PrintToString(host_buffer_purposes(flagged.output)),
              HasSubstr("pinned staging of the CUDA data path"));

  const Result host = run_cli("plan " + cuda + " --params 1e9 --device host --json");
  ASSERT_EQ(host.exit_code, 0) << host.output;
  EXPECT_THAT(::testing::PrintToString(host_buffer_purposes(host.output)),
              ::testing::Not(HasSubstr("CUDA data path")));
}

// A GPU's plan prints its PCIe bytes per step and the bound at --pcie-gbps (text and JSON); the
// host device's, none.
TEST(PlanCommand, PrintsPcieBytesForTheCudaDataPathOnly) {
  const std::string config = write_temp(
      "plan_pcie.toml", "[tiers.device]\nbudget = \"64GiB\"\n[tiers.host]\nbudget = \"64GiB\"\n"
                        "[zero]\nparams = \"host\"\ngrads = \"host\"\noptimizer = \"host\"\n");
  const std::string cuda = "plan " + config + " --params 819200000 --device cuda --pcie-gbps 50";
  const Result text = run_cli(cuda);
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_THAT(text.output, HasSubstr("PCIe per optimizer step: h2d "));
  EXPECT_THAT(text.output,
              HasSubstr("at 50 GB/s each way (assumed; strata plan --pcie-gbps) that is >= "));

  const Result json = run_cli(cuda + " --json");
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const nlohmann::json plan = nlohmann::json::parse(json.output);
  ASSERT_TRUE(plan.contains("pcie")) << json.output;
  // One rank: the gradients leave the GPU in fp32, 4 bytes per parameter per micro-batch (four
  // units of 100,000 shard granules: no padding).
  EXPECT_EQ(plan["pcie"]["grad_d2h_bytes"].get<std::uint64_t>(), 4 * 819'200'000u);
  EXPECT_DOUBLE_EQ(plan["pcie"]["link_bytes_per_s"].get<double>(), 50e9);

  const Result host = run_cli("plan " + config + " --params 819200000 --device host");
  ASSERT_EQ(host.exit_code, 0) << host.output;
  EXPECT_THAT(host.output, ::testing::Not(HasSubstr("PCIe")));
  const Result host_json = run_cli("plan " + config + " --params 819200000 --device host --json");
  EXPECT_FALSE(nlohmann::json::parse(host_json.output).contains("pcie"));
}

// The events of the Chrome trace at `path` (empty when it is missing or not a trace).
nlohmann::json trace_events(const std::filesystem::path& path) {
  std::ifstream file(path);
  if (!file) return nlohmann::json::array();
  const nlohmann::json trace = nlohmann::json::parse(file);
  return trace.at("traceEvents");
}

TEST(BenchStepCommand, WritesTheTraceOfTraceTablePathOrOfTraceFlag) {
  const std::filesystem::path from_config = strata::test_tmpdir_knob() / "bench_config_trace.json";
  const std::filesystem::path from_flag = strata::test_tmpdir_knob() / "bench_flag_trace.json";
  std::filesystem::remove(from_config);
  std::filesystem::remove(from_flag);
  const std::string config = write_temp(
      "bench_trace.toml", "[tiers.device]\nkind = \"host\"\nbudget = \"64MiB\"\n[tiers.host]\n"
                          "budget = \"64MiB\"\n[trace]\npath = \"" + from_config.string() + "\"\n");
  Result result = run_cli("bench step " + config + " --params 1e5 --steps 1 --json");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const nlohmann::json events = trace_events(from_config);
  ASSERT_FALSE(events.empty()) << "no trace at [trace] path " << from_config;
  bool optimizer_event = false;  // a complete ("X") event of an Adam sub-group
  for (const nlohmann::json& event : events) {
    optimizer_event = optimizer_event || (event.at("ph") == "X" &&
                                          event.at("name").get<std::string>().starts_with("adam"));
  }
  EXPECT_TRUE(optimizer_event) << events.dump();
  std::filesystem::remove(from_config);
  result = run_cli("bench step " + config + " --params 1e5 --steps 1 --json --trace " +
                   from_flag.string());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_FALSE(trace_events(from_flag).empty());
  EXPECT_FALSE(std::filesystem::exists(from_config)) << "--trace did not override [trace] path";
}

// [zero] overlap_optimizer would run the updates in the reduce_grads loop (these gradients' norm
// does not clip) and defer_update under the next forward, which the benchmark has none of: the
// step timed still runs (and writes) every update, with either key on or off.
TEST(BenchStepCommand, TimesEveryUpdateInsideTheStep) {
  const std::filesystem::path store = strata::test_tmpdir_knob() / "bench_every_update_store";
  std::filesystem::create_directories(store);
  const std::string common =
      "[tiers.device]\nkind = \"host\"\nbudget = \"64MiB\"\n[tiers.host]\nbudget = \"64MiB\"\n"
      "[tiers.nvme]\npaths = [\"" + store.string() + "\"]\ndirect = false\n"
      "[optimizer]\ngrad_clip = 0\n[zero]\noptimizer = \"nvme\"\nsub_group_size = 1e5\n";
  std::array<double, 3> bytes{};
  const std::array<std::string, 3> keys = {"overlap_optimizer = false\n",
                                           "overlap_optimizer = true\n", "defer_update = true\n"};
  for (std::size_t k = 0; k < keys.size(); ++k) {
    const std::string config = write_temp("bench_every_update.toml", common + keys[k]);
    const Result result =
        run_cli("bench step " + config + " --params 1e6 --steps 1 --json --overwrite");
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const nlohmann::json out = nlohmann::json::parse(result.output.substr(result.output.find('{')));
    bytes[k] = out.at("nvme_bytes_per_step").get<double>();
  }
  // The fp32 master and two moments written (12 B a parameter) and read, but for the first
  // buffer_count - 1 sub-groups, whose reads start in the reduce_grads loop (a serial step's reads
  // during the backward): 24 B a parameter less 3 x 1e5 x 12 B, and the manifest's copies.
  EXPECT_NEAR(bytes[0], 24e6 - 3 * 1e5 * 12, 64e3);
  EXPECT_EQ(bytes[1], bytes[0]);
  EXPECT_EQ(bytes[2], bytes[0]);
  std::filesystem::remove_all(store);
}

}  // namespace
