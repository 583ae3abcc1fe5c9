// Proves DecoderModel's loss and every parameter gradient equal an independent PyTorch float64
// implementation (decoder_reference.py) for tiny Llama (GQA, llama3 RoPE, untied), Qwen2 (q/k/v
// biases, tied), Mistral (sliding window < seq_len) and GPT-2, with a loss mask; the last two
// with activation checkpointing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "tests/models/llm/tiny_llm.hpp"

namespace strata::llm {
namespace {

namespace fs = std::filesystem;
using testing::UnitBuffers;

constexpr const char* kPython = "/usr/bin/python3";

bool python_has_torch() {
  const std::string command = std::string(kPython) + " -c 'import torch' > /dev/null 2>&1";
  return std::system(command.c_str()) == 0;
}

fs::path scratch_directory(const std::string& name) {
  const char* root = std::getenv("STRATA_TEST_TMPDIR");
  fs::path dir = fs::path(root != nullptr ? root : fs::temp_directory_path().string()) /
                 ("llm-torch-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

struct Case {
  const char* name;
  const char* config_json;
  std::uint32_t seq_len;
  std::uint32_t sequences;
  bool activation_checkpointing;  // also checks the recomputing backward against torch
};

std::string activation_name(Activation activation) {
  switch (activation) {
    case Activation::kSilu:
      return "silu";
    case Activation::kGeluTanh:
      return "gelu_tanh";
    case Activation::kGelu:
      return "gelu";
  }
  return "?";
}

// What decoder_reference.py reads: the config as plain numbers, every tensor's HF name, shape and
// offset into params.bin, the tokens and the loss weights.
nlohmann::json describe(const HfConfig& c, const std::vector<UnitSpec>& units,
                        const std::vector<std::int32_t>& tokens, std::size_t sequence_tokens,
                        const std::vector<float>& weights) {
  nlohmann::json config = {
      {"family", std::string(family_name(c.family))},
      {"hidden", c.hidden_size},
      {"heads", c.num_heads},
      {"kv_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"layers", c.num_layers},
      {"eps", c.norm_eps},
      {"rope_theta", c.rope_theta},
      {"window", c.sliding_window.value_or(0)},
      {"activation", activation_name(c.activation)},
      {"tied", c.tie_word_embeddings},
      {"qkv_bias", c.attention_qkv_bias},
      {"sequence_tokens", sequence_tokens},
      {"rope_scaling", nullptr}};
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    config["rope_scaling"] = {
        {"factor", c.rope_scaling.factor},
        {"low_freq_factor", c.rope_scaling.low_freq_factor},
        {"high_freq_factor", c.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  }
  nlohmann::json tensors = nlohmann::json::array();
  std::size_t offset = 0;
  for (const UnitSpec& unit : units) {
    for (const TensorSpec& tensor : unit.tensors) {
      tensors.push_back({{"name", tensor.hf_name}, {"shape", tensor.shape}, {"offset", offset}});
      offset += tensor.numel();
    }
  }
  return {{"config", config}, {"tensors", tensors}, {"tokens", tokens}, {"weights", weights}};
}

void write_parameters(const fs::path& path, const UnitBuffers& params) {
  std::ofstream out(path, std::ios::binary);
  for (std::size_t u = 0; u < params.unit_count(); ++u) {
    out.write(reinterpret_cast<const char*>(params.unit(u).data()),
              static_cast<std::streamsize>(params.unit(u).size() * sizeof(float)));
  }
  ASSERT_TRUE(out.good()) << path;
}

std::vector<double> read_doubles(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<double> values(fs::file_size(path) / sizeof(double));
  in.read(reinterpret_cast<char*>(values.data()),
          static_cast<std::streamsize>(values.size() * sizeof(double)));
  return values;
}

// One family's run: the model's loss and gradients, and the files handed to PyTorch.
struct FamilyRun {
  Case c;
  HfConfig config;
  std::vector<UnitSpec> units;
  double loss = 0.0;
  UnitBuffers grads;
  fs::path dir;
};

FamilyRun run_strata(const Case& c, std::uint64_t seed) {
  const HfConfig config = parse_hf_config(c.config_json, std::string(c.name) + "/config.json");
  DecoderModel model(config, {c.seq_len, c.sequences, c.activation_checkpointing});
  const UnitBuffers params = testing::random_parameters(model.units(), seed);
  FamilyRun run{c, config, model.units(), 0.0, UnitBuffers(model.units()), scratch_directory(c.name)};
  const std::size_t sequence_tokens = c.seq_len + 1;
  const std::vector<std::int32_t> tokens =
      testing::random_tokens(c.sequences * sequence_tokens, config.vocab_size, seed + 1);
  const std::vector<float> weights = testing::random_mask(c.sequences * c.seq_len, seed + 2);
  run.loss = testing::forward_backward(model, params, run.grads, tokens, sequence_tokens, weights);
  std::ofstream(run.dir / "model.json")
      << describe(config, model.units(), tokens, sequence_tokens, weights).dump();
  write_parameters(run.dir / "params.bin", params);
  return run;
}

// fp32 against float64: the loss (4 to 9 here) agrees to about 1e-7 relative, each gradient to
// about 1e-6 of its tensor's largest entry (measured: worst 1.5e-6, Qwen2). Bounds: 1e-5
// relative for the loss, 1e-4 of the tensor's max |gradient| for every element.
void compare_with_torch(const FamilyRun& run) {
  SCOPED_TRACE(run.c.name);
  double torch_loss = 0.0;
  std::ifstream(run.dir / "loss.txt") >> torch_loss;
  const std::vector<double> torch_grads = read_doubles(run.dir / "grads.bin");
  std::size_t parameters = 0;
  for (const UnitSpec& unit : run.units) parameters += unit.numel;
  ASSERT_EQ(torch_grads.size(), parameters);
  EXPECT_NEAR(run.loss, torch_loss, 1e-5 * std::abs(torch_loss));
  std::size_t offset = 0;
  double worst = 0.0;
  for (std::size_t u = 0; u < run.units.size(); ++u) {
    const std::vector<float>& unit_grads = run.grads.unit(u);
    for (const TensorSpec& spec : run.units[u].tensors) {
      double largest = 0.0;
      double difference = 0.0;
      for (std::size_t i = 0; i < spec.numel(); ++i) {
        const double expected = torch_grads[offset + i];
        largest = std::max(largest, std::abs(expected));
        difference = std::max(difference, std::abs(unit_grads[spec.offset + i] - expected));
      }
      offset += spec.numel();
      EXPECT_GT(largest, 1e-4) << spec.hf_name << " has no gradient to compare";
      EXPECT_LE(difference, 1e-4 * largest) << spec.hf_name << " max |grad| " << largest;
      worst = std::max(worst, difference / largest);
    }
  }
  std::printf("%-24s loss %.9f (torch %.9f), worst gradient difference %.2e of its tensor's max\n",
              run.c.name, run.loss, torch_loss, worst);
}

// One test, one Python process for the four families: importing torch takes seconds.
TEST(DecoderTorchTest, LossAndEveryGradientMatchTorchForEveryFamily) {
  if (!python_has_torch()) GTEST_SKIP() << kPython << " cannot import torch (python3-torch)";
  constexpr std::uint64_t kSeed = 20261130;
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  set_blas_threads(1);
  const Case cases[] = {{"llama_gqa_llama3_untied", testing::kTinyLlama, 12, 2, false},
                        {"qwen2_bias_tied", testing::kTinyQwen2, 10, 2, false},
                        {"mistral_window", testing::kTinyMistral, 11, 2, true},
                        {"gpt2", testing::kTinyGpt2, 9, 3, true}};
  std::vector<FamilyRun> runs;
  std::string command = std::string(kPython) + " " + STRATA_LLM_TORCH_REFERENCE;
  for (const Case& c : cases) {
    runs.push_back(run_strata(c, kSeed));
    command.append(" ").append(runs.back().dir.string());
  }
  command += " 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  for (const FamilyRun& run : runs) {
    compare_with_torch(run);
    fs::remove_all(run.dir);
  }
}

}  // namespace
}  // namespace strata::llm
