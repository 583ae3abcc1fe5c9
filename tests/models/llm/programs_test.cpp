// Proves the programs end to end on a tiny Llama folder: strata-finetune --model lowers the
// validation loss, reports its NVMe traffic as the built-in GPT's run does and exports a folder
// that an independent reader (hf_folder_reader.py) accepts, with strata's loss; strata-eval --json
// prints the perplexity the library computes, and --dump the text's ids and the first window's
// logits; strata-generate --json prints the prompt's ids and the ids generate() gives;
// strata plan --model takes the parameter count from config.json and, for a GPU, charges the
// device for the model's compute; a malformed data line stops
// strata-finetune with file:line; --steps is the run's total across a resume, and a fresh start
// over a committed store is refused until --overwrite; under mpirun -np 2 (ZeRO-3 across ranks,
// each rank half of every micro-batch) the run follows the one-rank run's losses; [checkpoint]
// saves step-N checkpoints that --resume-from continues bitwise, and [trace] path gets the trace.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "tiers/device/device.hpp"
#include <nlohmann/json.hpp>

#include "models/inference/generation.hpp"
#include "models/checkpoint/hf_checkpoint.hpp"
#include "models/checkpoint/host_weights.hpp"
#include "models/inference/perplexity.hpp"
#include "models/tokenizer/tokenizer.hpp"
#include "tests/models/llm/llm_io_test_support.hpp"

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

// The program's export read by hf_folder_reader.py (the safetensors specification and
// transformers' loading rules, a float64 PyTorch forward; see hf_export_reader_test.cpp): accepted,
// and its loss on the text's first tokens equals strata's on the weights strata loads from it
// (bf16, exact in fp32) within 1e-5 relative. Skipped, saying so, when torch is missing.
void expect_independent_reader_agrees(const std::filesystem::path& out, const HfConfig& hf,
                                      const HostWeights& weights,
                                      const std::vector<std::int32_t>& ids) {
  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0) {
    std::printf("(independent reader skipped: /usr/bin/python3 cannot import torch)\n");
    return;
  }
  constexpr std::uint32_t kSeqLen = 16;
  ASSERT_GE(ids.size(), 2 * (kSeqLen + 1));
  const std::vector<std::int32_t> tokens(ids.begin(), ids.begin() + 2 * (kSeqLen + 1));
  DecoderModel decoder(hf, {kSeqLen, 2, false});
  decoder.set_batch(tokens, kSeqLen + 1);
  forward_all(decoder, weights);
  const double strata_loss = decoder.loss();
  std::string sequences;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) sequences += i == kSeqLen + 1 ? "/" : ",";
    sequences += std::to_string(tokens[i]);
  }
  const std::string output = testing::run_command(
      std::string("/usr/bin/python3 ") + STRATA_LLM_FOLDER_READER + " " + out.string() +
      " --dtype bf16 --tokens " + sequences + " 2>&1");
  const nlohmann::json result = nlohmann::json::parse(output, nullptr, false);
  ASSERT_TRUE(result.is_object()) << output;
  ASSERT_TRUE(result["ok"].get<bool>()) << result["error"];
  EXPECT_NEAR(result["loss"].get<double>(), strata_loss, 1e-5 * strata_loss);
  std::printf("strata-finetune's export: reader loss %.9f, strata %.9f\n",
              result["loss"].get<double>(), strata_loss);
}

// strata-finetune's summary: the loss fell, the NVMe traffic and the CPU time are reported.
void expect_finetune_summary(const nlohmann::json& figures, const std::string& log,
                             const std::filesystem::path& model) {
  EXPECT_LT(figures["final_val_loss"].get<double>(), figures["initial_val_loss"].get<double>() - 0.5)
      << log;
  // Params and optimizer state live on NVMe: the run's traffic is in the summary, line and JSON.
  EXPECT_GT(figures["nvme_read_bytes"].get<std::uint64_t>(), 0u) << log;
  EXPECT_GT(figures["nvme_written_bytes"].get<std::uint64_t>(), 0u) << log;
  EXPECT_EQ(figures["placement"]["optimizer"], "nvme");
  EXPECT_EQ(figures["model"], model.string());
  EXPECT_NE(log.find(", NVMe read "), std::string::npos) << log;
  // The device line names the attention the decoder runs.
  EXPECT_NE(log.find(", attention fp32 on the host, synchronous unit calls\n"), std::string::npos) << log;
  // The CPU the steps took (getrusage: every thread's user + system time), per step and as cores
  // kept busy, which cannot exceed the machine's cores (with a little slack for the clocks).
  EXPECT_GT(figures["cpu_s_per_step"].get<double>(), 0.0) << log;
  // The steps' wall time, over which cores_busy (and tokens_per_s) are taken.
  const double steps_cpu_s =
      figures["cpu_s_per_step"].get<double>() * figures["steps"].get<double>();
  EXPECT_GT(figures["train_s"].get<double>(), 0.0) << log;
  EXPECT_NEAR(figures["cores_busy"].get<double>() * figures["train_s"].get<double>(), steps_cpu_s,
              1e-9 * steps_cpu_s)
      << log;
  EXPECT_GT(figures["cores_busy"].get<double>(), 0.0) << log;
  EXPECT_LT(figures["cores_busy"].get<double>(), std::thread::hardware_concurrency() + 0.5) << log;
  EXPECT_NE(log.find("  CPU: "), std::string::npos) << log;
}

// strata-eval --json on the export prints the perplexity the library computes; `eval` gets its
// JSON.
void expect_eval_agrees(const Programs& programs, const std::filesystem::path& out,
                        const HfConfig& hf, const HostWeights& weights, const Tokenizer& tokenizer,
                        nlohmann::json& eval) {
  const auto [eval_output, eval_status] =
      programs.run(std::string(STRATA_EVAL) + " --model " + out.string() + " --data " +
                   programs.text.string() + " --seq-len 48 --blas-threads 1 --json");
  ASSERT_EQ(eval_status, 0) << eval_output;
  eval = nlohmann::json::parse(eval_output);
  const PerplexityResult expected =
      evaluate_perplexity(hf, weights, tokenizer.encode(read_text_file(programs.text)), 48);
  EXPECT_EQ(eval["tokens"].get<std::uint64_t>(), expected.tokens);
  EXPECT_DOUBLE_EQ(eval["mean_nll"].get<double>(), expected.mean_nll);
  EXPECT_DOUBLE_EQ(eval["perplexity"].get<double>(), std::exp(expected.mean_nll));
}

void expect_eval_dump_agrees(const Programs& programs, const std::filesystem::path& out,
                             const HfConfig& hf, const HostWeights& weights,
                             const Tokenizer& tokenizer) {
  // --dump: the text's ids, and the first window's logits, whose next-token NLL is the first
  // window's own perplexity figure (what gpu_export_check.py compares transformers against).
  const std::filesystem::path dump = programs.scratch.path() / "dump";
  const std::vector<std::int32_t> text_ids = tokenizer.encode(read_text_file(programs.text));
  const auto [dump_output, dump_status] = programs.run(
      std::string(STRATA_EVAL) + " --model " + out.string() + " --data " + programs.text.string() +
      " --seq-len 48 --blas-threads 1 --json --dump " + dump.string());
  ASSERT_EQ(dump_status, 0) << dump_output;
  EXPECT_EQ(nlohmann::json::parse(read_text_file(dump / "token_ids.json"))
                .get<std::vector<std::int32_t>>(),
            text_ids);
  const std::string logit_bytes = read_text_file(dump / "first_window_logits.f32");
  ASSERT_EQ(logit_bytes.size(), 47 * hf.vocab_size * sizeof(float));
  std::vector<float> logits(47 * hf.vocab_size);
  std::memcpy(logits.data(), logit_bytes.data(), logit_bytes.size());
  double nll = 0;
  for (std::size_t row = 0; row < 47; ++row) {
    const float* z = logits.data() + row * hf.vocab_size;
    const double top = *std::max_element(z, z + hf.vocab_size);
    double sum = 0;
    for (std::size_t v = 0; v < hf.vocab_size; ++v) sum += std::exp(z[v] - top);
    nll += top + std::log(sum) - z[text_ids[row + 1]];
  }
  const std::vector<std::int32_t> first_window(text_ids.begin(), text_ids.begin() + 48);
  EXPECT_NEAR(nll / 47, evaluate_perplexity(hf, weights, first_window, 48).mean_nll, 1e-5);
}

void expect_streamed_eval_agrees(const Programs& programs, const std::filesystem::path& out,
                                 double eval_mean_nll) {
  // Every unit streamed from the folder on every pass: the same figures, bit for bit, and a note.
  const auto [streamed_output, streamed_status] = programs.run(
      std::string(STRATA_EVAL) + " --model " + out.string() + " --data " + programs.text.string() +
      " --seq-len 48 --blas-threads 1 --resident-budget 0 --json");
  ASSERT_EQ(streamed_status, 0) << streamed_output;
  EXPECT_NE(streamed_output.find("strata-eval: weights: 0 of"), std::string::npos)
      << streamed_output;
  const std::string last_line = streamed_output.substr(
      streamed_output.rfind('\n', streamed_output.size() - 2) + 1);
  EXPECT_EQ(nlohmann::json::parse(last_line)["mean_nll"].get<double>(), eval_mean_nll);
}

// strata-generate --json prints the prompt's ids and the ids generate() gives.
void expect_generate_agrees(const Programs& programs, const std::filesystem::path& out,
                            const HfConfig& hf, const HostWeights& weights,
                            const Tokenizer& tokenizer) {
  const auto [generate_output, generate_status] =
      programs.run(std::string(STRATA_GENERATE) + " --model " + out.string() +
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

TEST_F(Programs, FinetuneExportEvalGenerate) {
  const std::filesystem::path out = scratch.path() / "finetuned";
  const std::filesystem::path summary = scratch.path() / "summary.json";
  const auto [log, status] =
      run(std::string(STRATA_FINETUNE) + " --model " + model.string() + " --data " + text.string() +
          " --config " + config.string() + " --steps 10 --eval-every 0 --blas-threads 1 --export " +
          out.string() + " --summary-json " + summary.string());
  ASSERT_EQ(status, 0) << log;
  const nlohmann::json figures = nlohmann::json::parse(read_text_file(summary));
  expect_finetune_summary(figures, log, model);
  const HfConfig hf = read_hf_config(out / "config.json");
  HfCheckpoint::open(out).check(decoder_units(hf));
  EXPECT_EQ(testing::python_tensor_summary(out).begin().value()["dtype"], "BF16");

  set_blas_threads(1);
  const HostWeights weights = HostWeights::load(out, decoder_units(hf));
  const Tokenizer tokenizer = Tokenizer::load(out);
  expect_independent_reader_agrees(out, hf, weights, tokenizer.encode(read_text_file(text)));
  nlohmann::json eval;
  ASSERT_NO_FATAL_FAILURE(expect_eval_agrees(*this, out, hf, weights, tokenizer, eval));
  ASSERT_NO_FATAL_FAILURE(expect_eval_dump_agrees(*this, out, hf, weights, tokenizer));
  ASSERT_NO_FATAL_FAILURE(expect_streamed_eval_agrees(*this, out, eval["mean_nll"].get<double>()));
  expect_generate_agrees(*this, out, hf, weights, tokenizer);
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

// The training losses printed by strata-finetune's step lines, in order.
std::vector<double> step_losses(const std::string& log) {
  static const std::regex line(R"(step +\d+ \| loss ([0-9.]+))");
  std::vector<double> losses;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it) {
    losses.push_back(std::stod((*it)[1].str()));
  }
  return losses;
}

// Two ranks with micro-batch 2 draw the same global batch as one rank with micro-batch 4
// (data_loader.hpp), so ZeRO-3 over MPI (each rank a half of every unit's state on NVMe) trains
// the same model: the same losses up to the gradients' summation order.
TEST_F(Programs, TwoRanksUnderMpirunFollowTheOneRankRun) {
  if (std::string(STRATA_MPIRUN).empty()) GTEST_SKIP() << "no mpirun was found at configure time";
  // Varied text (the fixture's repeats one sentence, so any two windows would look alike).
  const std::filesystem::path varied = scratch.path() / "varied.txt";
  {
    const char* words[] = {"the", "cat", "sat", "on", "mat", "and", "dog", "ran", "in", "sun"};
    std::string corpus;
    std::uint32_t state = 12345;
    for (int i = 0; i < 160; ++i) {
      state = state * 1664525u + 1013904223u;
      corpus += std::string(words[(state >> 16) % 10]) + (i % 9 == 8 ? ". " : " ");
    }
    std::ofstream(varied) << corpus;
  }
  const auto finetune = [&](const std::string& launcher, int micro_batch, const std::string& name) {
    const std::filesystem::path run_config = scratch.path() / (name + ".toml");
    std::string toml = read_text_file(config);
    toml.replace(toml.find("micro_batch = 4"), 15, "micro_batch = " + std::to_string(micro_batch));
    toml.replace(toml.find("/nvme\""), 6, "/" + name + "\"");
    std::ofstream(run_config) << toml;
    return run(launcher + std::string(STRATA_FINETUNE) + " --model " + model.string() +
               " --data " + varied.string() + " --config " + run_config.string() +
               " --steps 4 --eval-every 0 --eval-batches 1 --blas-threads 1 --summary-json " +
               (scratch.path() / (name + ".json")).string());
  };
  const auto [one_log, one_status] = finetune("", 4, "one");
  ASSERT_EQ(one_status, 0) << one_log;
  const auto [two_log, two_status] = finetune(
      std::string(STRATA_MPIRUN) + " 2 --oversubscribe --allow-run-as-root ", 2, "two");
  ASSERT_EQ(two_status, 0) << two_log;
  const std::vector<double> one = step_losses(one_log);
  const std::vector<double> two = step_losses(two_log);
  ASSERT_EQ(one.size(), 4u) << one_log;
  ASSERT_EQ(two.size(), 4u) << two_log;
  for (std::size_t step = 0; step < one.size(); ++step) {
    EXPECT_NEAR(two[step], one[step], 2e-3) << "step " << step << "\n" << one_log << two_log;  // printed to 4 places
  }
  EXPECT_GT(one.front() - one.back(), 0.1) << one_log;  // it trained: the comparison can fail
  const nlohmann::json one_summary =
      nlohmann::json::parse(read_text_file(scratch.path() / "one.json"));
  const nlohmann::json two_summary =
      nlohmann::json::parse(read_text_file(scratch.path() / "two.json"));
  EXPECT_EQ(two_summary["ranks"].get<int>(), 2);
  EXPECT_NEAR(two_summary["final_val_loss"].get<double>(),
              one_summary["final_val_loss"].get<double>(), 1e-3);
  // Each rank keeps its own half of the state: two swap files in the store directory.
  EXPECT_TRUE(std::filesystem::exists(scratch.path() / "two" / "strata-rank1.swap"));
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

// The plan of a model computing on a GPU charges the device tier for its activations, gradient and
// workspaces: a row that grows with the tokens per micro-batch and shrinks with activation
// checkpointing; on the host device (the model's activations are host memory) there is none. A
// device budget that cannot hold them fails the plan, naming the tier, the shortfall and the
// knobs that would make it fit. (The bug: `strata plan` said a 90.8 M Llama at seq 512 x 8 fit a
// 1 GiB device, and the run died at its first step.)
TEST_F(Programs, PlanChargesTheDeviceForTheModelsComputeOnCuda) {
  const auto compute_row = [&](const std::string& flags) -> std::uint64_t {
    const auto [output, status] = run(std::string(STRATA_CLI) + " plan " + config.string() +
                                      " --model " + model.string() + " --json " + flags);
    EXPECT_EQ(status, 0) << output;
    std::uint64_t bytes = 0;
    const nlohmann::json plan = nlohmann::json::parse(output);
    for (const nlohmann::json& buffer : plan.at("buffers")) {
      if (buffer.at("purpose").get<std::string>().find("model's compute") != std::string::npos) {
        EXPECT_EQ(buffer.at("tier").get<std::string>(), "device") << buffer.dump();
        bytes += buffer.at("bytes").get<std::uint64_t>();
      }
    }
    return bytes;
  };
  EXPECT_EQ(compute_row("--device host"), 0u);
  const std::uint64_t small = compute_row("--device cuda --seq-len 64 --micro-batch 2");
  const std::uint64_t large = compute_row("--device cuda --seq-len 128 --micro-batch 4");
  const std::uint64_t checkpointed =
      compute_row("--device cuda --seq-len 128 --micro-batch 4 --activation-checkpointing");
  EXPECT_GT(small, 0u);
  EXPECT_GT(large, 3 * small);  // 4x the rows: activations grow with them
  EXPECT_LT(checkpointed, large);

  const std::filesystem::path tight = scratch.path() / "tight.toml";
  std::ofstream(tight) << "[tiers.device]\nkind = \"cuda\"\nbudget = \"12MiB\"\n"
                       << "[zero]\nparams = \"host\"\noptimizer = \"host\"\n";
  const auto [output, status] =
      run(std::string(STRATA_CLI) + " plan " + tight.string() + " --model " + model.string() +
          " --seq-len 256 --micro-batch 16");
  EXPECT_EQ(status, 3) << output;  // does not fit
  EXPECT_NE(output.find("[tiers.device]"), std::string::npos) << output;
  EXPECT_NE(output.find("short by"), std::string::npos) << output;
  EXPECT_NE(output.find("--micro-batch"), std::string::npos) << output;
}

// On a GPU: strata-finetune refuses, before the first step, a run whose model compute does not fit
// the device budget beside the Engine's buffers, naming the tier and the knobs; nothing trains.
TEST_F(Programs, FinetuneOnCudaRefusesWhatItsComputeDoesNotFit) {
  if (tiers::cuda_device_count() == 0) GTEST_SKIP() << "no GPU visible";
  const std::filesystem::path tight = scratch.path() / "tight.toml";
  std::ofstream(tight) << "[tiers.device]\nkind = \"cuda\"\nbudget = \"12MiB\"\n"
                       << "[tiers.host]\nbudget = \"256MiB\"\n"
                       << "[zero]\nparams = \"host\"\noptimizer = \"host\"\n";
  const auto [log, status] = run(std::string(STRATA_FINETUNE) + " --model " + model.string() +
                                 " --data " + text.string() + " --config " + tight.string() +
                                 " --steps 1 --device cuda --seq-len 256 --micro-batch 16 "
                                 "--overwrite");
  EXPECT_EQ(status, 3) << log;
  EXPECT_NE(log.find("the memory plan does not fit"), std::string::npos) << log;
  EXPECT_NE(log.find("model's compute on the GPU"), std::string::npos) << log;
  EXPECT_NE(log.find("--micro-batch"), std::string::npos) << log;
  EXPECT_EQ(log.find("step    1"), std::string::npos) << log;
}

// --device cuda reaches the decoder's CUDA backend; where no GPU is visible the run stops before
// anything is written, saying why. (The CUDA model itself: decoder_cuda_test.cpp, on a GPU.)
TEST_F(Programs, FinetuneAskingForAGpuWithoutOneSaysWhyAndExitsTwo) {
  if (tiers::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible: gpu-check.sh trains on it";
  const auto [log, status] = run(std::string(STRATA_FINETUNE) + " --model " + model.string() +
                                 " --data " + text.string() + " --config " + config.string() +
                                 " --steps 1 --device cuda --overwrite");
  EXPECT_EQ(status, 2) << log;
  EXPECT_NE(log.find("kind = \"cuda\" but no CUDA device is visible"), std::string::npos) << log;
  EXPECT_EQ(log.find("step 1"), std::string::npos) << log;
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
