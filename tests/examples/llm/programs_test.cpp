// Proves the programs end to end on a tiny Llama folder: strata-finetune --model lowers the
// validation loss, reports its NVMe traffic as the built-in GPT's run does and exports a loadable
// folder; strata-eval --json prints the perplexity the
// library computes; strata-generate --json prints the prompt's ids and the ids generate() gives;
// strata plan --model takes the parameter count from config.json; a malformed data line stops
// strata-finetune with file:line; --steps is the run's total across a resume, and a fresh start
// over a committed store is refused until --overwrite; [checkpoint] saves step-N checkpoints that
// --resume-from continues bitwise, and [trace] path gets the Chrome trace.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "examples/llm/generation.hpp"
#include "examples/llm/hf_checkpoint.hpp"
#include "examples/llm/perplexity.hpp"
#include "examples/llm/tokenizer.hpp"
#include "tests/examples/llm/llm_io_test_support.hpp"

namespace strata::llm {
namespace {

using testing::ScratchDir;

struct Programs : ::testing::Test {
  ScratchDir scratch;
  std::filesystem::path model = scratch.path() / "model";
  std::filesystem::path text = scratch.path() / "text.txt";
  std::filesystem::path config = scratch.path() / "tiers.toml";

  void SetUp() override {
    write_tiny_model(model, TinyModelOptions{});
    std::string corpus;
    for (int i = 0; i < 20; ++i) corpus += "the cat sat on the mat and the dog ran in the sun. ";
    std::ofstream(text) << corpus;
    std::ofstream(config) << "[model]\nseq_len = 32\nmicro_batch = 4\n"
                          << "[tiers.device]\nkind = \"host\"\nbudget = \"256MiB\"\n"
                          << "[tiers.host]\nbudget = \"64MiB\"\n"
                          << "[tiers.nvme]\ndirect = false\npaths = [\""
                          << (scratch.path() / "nvme").string() << "\"]\n"
                          << "[zero]\nparams = \"nvme\"\noptimizer = \"nvme\"\n"
                          << "sub_group_size = 4096\n[optimizer]\nlr = 3e-3\n";
  }
  // stdout and stderr of the command, and its exit status.
  std::pair<std::string, int> run(const std::string& command) const {
    const std::filesystem::path output = scratch.path() / "output.txt";
    const int status = std::system((command + " > " + output.string() + " 2>&1").c_str());
    return {read_text_file(output), WEXITSTATUS(status)};
  }
};

TEST_F(Programs, FinetuneExportEvalGenerate) {
  const std::filesystem::path out = scratch.path() / "finetuned";
  const std::filesystem::path summary = scratch.path() / "summary.json";
  const auto [log, status] = run(std::string(STRATA_FINETUNE) + " --model " + model.string() +
                                 " --data " + text.string() + " --config " + config.string() +
                                 " --steps 10 --eval-every 0 --blas-threads 1 --export " +
                                 out.string() + " --summary-json " + summary.string());
  ASSERT_EQ(status, 0) << log;
  const nlohmann::json figures = nlohmann::json::parse(read_text_file(summary));
  EXPECT_LT(figures["final_val_loss"].get<double>(), figures["initial_val_loss"].get<double>() - 0.5)
      << log;
  // Params and optimizer state live on NVMe: the run's traffic is in the summary, line and JSON.
  EXPECT_GT(figures["nvme_read_bytes"].get<std::uint64_t>(), 0u) << log;
  EXPECT_GT(figures["nvme_written_bytes"].get<std::uint64_t>(), 0u) << log;
  EXPECT_EQ(figures["placement"]["optimizer"], "nvme");
  EXPECT_EQ(figures["model"], model.string());
  EXPECT_NE(log.find(", NVMe read "), std::string::npos) << log;
  const HfConfig hf = read_hf_config(out / "config.json");
  HfCheckpoint::open(out).check(decoder_units(hf));
  EXPECT_EQ(testing::python_tensor_summary(out).begin().value()["dtype"], "BF16");

  set_blas_threads(1);
  const HostWeights weights = HostWeights::load(out, decoder_units(hf));
  const Tokenizer tokenizer = Tokenizer::load(out);
  const auto [eval_output, eval_status] =
      run(std::string(STRATA_EVAL) + " --model " + out.string() + " --data " + text.string() +
          " --seq-len 48 --blas-threads 1 --json");
  ASSERT_EQ(eval_status, 0) << eval_output;
  const nlohmann::json eval = nlohmann::json::parse(eval_output);
  const PerplexityResult expected =
      evaluate_perplexity(hf, weights, tokenizer.encode(read_text_file(text)), 48);
  EXPECT_EQ(eval["tokens"].get<std::uint64_t>(), expected.tokens);
  EXPECT_DOUBLE_EQ(eval["mean_nll"].get<double>(), expected.mean_nll);
  EXPECT_DOUBLE_EQ(eval["perplexity"].get<double>(), std::exp(expected.mean_nll));

  const auto [generate_output, generate_status] =
      run(std::string(STRATA_GENERATE) + " --model " + out.string() +
          " --prompt 'the cat' --max-new-tokens 6 --blas-threads 1 --json");
  ASSERT_EQ(generate_status, 0) << generate_output;
  const nlohmann::json generated = nlohmann::json::parse(generate_output);
  const std::vector<std::int32_t> prompt_ids = tokenizer.encode("the cat");
  EXPECT_EQ(generated["prompt_ids"].get<std::vector<std::int32_t>>(), prompt_ids);
  GenerationOptions options;
  options.max_new_tokens = 6;
  options.stop_ids = hf.eos_token_ids;
  const std::vector<std::int32_t> ids = generate(hf, weights, prompt_ids, options);
  EXPECT_EQ(generated["ids"].get<std::vector<std::int32_t>>(), ids);
  EXPECT_EQ(generated["text"].get<std::string>(), tokenizer.decode(ids, true));
}

// --steps is the run's total: 3 steps of a 5-step command, then the same command with --resume,
// end at step 5 with exported weights bitwise equal to the uninterrupted run's; starting afresh
// over that committed store is refused (the store named) until --overwrite.
TEST_F(Programs, TheSameStepsRestartedFinishesTheSameRunAndAFreshStartIsRefused) {
  const auto finetune = [&](const std::string& store, const std::string& arguments) {
    const std::filesystem::path store_config = scratch.path() / (store + ".toml");
    std::string toml = read_text_file(config);
    toml.replace(toml.find("/nvme\""), 6, "/" + store + "\"");
    std::ofstream(store_config) << toml;
    return run(std::string(STRATA_FINETUNE) + " --model " + model.string() + " --data " +
               text.string() + " --config " + store_config.string() +
               " --eval-every 0 --eval-batches 1 --blas-threads 1 --export-dtype fp32 " + arguments);
  };
  const std::filesystem::path straight = scratch.path() / "straight";
  auto [log, status] = finetune("a", "--steps 5 --export " + straight.string());
  ASSERT_EQ(status, 0) << log;
  std::tie(log, status) = finetune("b", "--steps 3");
  ASSERT_EQ(status, 0) << log;
  const std::filesystem::path resumed = scratch.path() / "resumed";
  std::tie(log, status) = finetune("b", "--steps 5 --resume --export " + resumed.string());
  ASSERT_EQ(status, 0) << log;
  EXPECT_NE(log.find("resumed at step 3 from the NVMe store: 2 steps left to reach --steps 5"),
            std::string::npos)
      << log;
  EXPECT_TRUE(read_text_file(resumed / "model.safetensors") ==
              read_text_file(straight / "model.safetensors"))
      << "the resumed run's weights differ from the uninterrupted run's";

  std::tie(log, status) = finetune("b", "--steps 5");
  EXPECT_EQ(status, 1) << log;
  EXPECT_NE(log.find((scratch.path() / "b").string()), std::string::npos) << log;
  EXPECT_NE(log.find("committed at step 5"), std::string::npos) << log;
  std::tie(log, status) = finetune("b", "--steps 1 --overwrite");
  ASSERT_EQ(status, 0) << log;
  EXPECT_EQ(log.find("resumed"), std::string::npos) << log;
}

// [checkpoint] interval_steps 2, keep 1 over 5 steps leaves step-000004 alone; --resume-from it
// ends bitwise as the uninterrupted run; the [trace] path holds the run's events.
TEST_F(Programs, PeriodicCheckpointsResumeBitwiseAndTheTraceIsWritten) {
  const std::filesystem::path checkpoints = scratch.path() / "checkpoints";
  const std::filesystem::path trace = scratch.path() / "trace.json";
  std::ofstream(config, std::ios::app)
      << "[checkpoint]\ndir = \"" << checkpoints.string() << "\"\ninterval_steps = 2\nkeep = 1\n"
      << "[trace]\npath = \"" << trace.string() << "\"\n";
  const auto finetune = [&](const std::string& arguments) {
    return run(std::string(STRATA_FINETUNE) + " --model " + model.string() + " --data " +
               text.string() + " --config " + config.string() +
               " --eval-every 0 --eval-batches 1 --blas-threads 1 --export-dtype fp32 " + arguments);
  };
  const std::filesystem::path straight = scratch.path() / "straight";
  auto [log, status] = finetune("--steps 5 --export " + straight.string());
  ASSERT_EQ(status, 0) << log;
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(checkpoints)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"step-000004"}) << log;
  std::ifstream trace_file(trace);
  ASSERT_TRUE(trace_file.good()) << "no trace at [trace] path\n" << log;
  const nlohmann::json events = nlohmann::json::parse(trace_file).at("traceEvents");
  EXPECT_GT(events.size(), 4u) << "only the track names, no events";

  const std::filesystem::path resumed = scratch.path() / "resumed";
  std::tie(log, status) = finetune("--steps 5 --overwrite --resume-from " +
                                   (checkpoints / "step-000004").string() + " --export " +
                                   resumed.string());
  ASSERT_EQ(status, 0) << log;
  EXPECT_NE(log.find("resumed at step 4 from checkpoint"), std::string::npos) << log;
  EXPECT_TRUE(read_text_file(resumed / "model.safetensors") ==
              read_text_file(straight / "model.safetensors"))
      << "the run resumed from step-000004 differs from the uninterrupted run";
}

TEST_F(Programs, PlanTakesTheParameterCountFromConfigJson) {
  const auto [output, status] =
      run(std::string(STRATA_CLI) + " plan " + config.string() + " --model " + model.string() +
          " --json");
  ASSERT_EQ(status, 0) << output;
  const nlohmann::json plan = nlohmann::json::parse(output);
  EXPECT_EQ(plan["model"]["params"].get<std::uint64_t>(),
            read_hf_config(model / "config.json").parameter_count());
}

TEST_F(Programs, AMalformedDataLineStopsFinetuneWithFileAndLine) {
  const std::filesystem::path data = scratch.path() / "data.jsonl";
  std::ofstream(data) << "{\"text\": \"fine\"}\n{\"text\": \"broken\n";
  const auto [log, status] = run(std::string(STRATA_FINETUNE) + " --model " + model.string() +
                                 " --data " + data.string() + " --config " + config.string() +
                                 " --steps 1");
  EXPECT_NE(status, 0);
  EXPECT_NE(log.find(data.string() + ":2: malformed JSON"), std::string::npos) << log;
}

}  // namespace
}  // namespace strata::llm
