// Proves the Hugging Face export against an independent reader (hf_folder_reader.py: the
// safetensors specification, transformers' loading rules and a float64 PyTorch forward): tiny Llama
// (GQA), Qwen2 (biases, tied), Mistral and GPT-2 (both name styles) fine-tuned and exported in
// bf16 and fp32, in one file and in shards, are accepted, and the reader's loss on fixed tokens
// equals strata's on the same weights (and moves far beyond the tolerance when two same-shaped
// tensors are exchanged); folders with a missing tensor, a mis-shaped tensor, a wrong
// index total, an over-size shard or a config whose torch_dtype lies are refused.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/float16.hpp"
#include "models/checkpoint/hf_checkpoint.hpp"
#include "models/checkpoint/hf_export.hpp"
#include "models/checkpoint/host_weights.hpp"
#include "tests/models/llm/llm_io_test_support.hpp"
#include "tests/models/llm/tiny_llm.hpp"

namespace strata::llm {
namespace {

namespace fs = std::filesystem;
using testing::ScratchDir;

constexpr const char* kPython = "/usr/bin/python3";
constexpr std::uint32_t kSeqLen = 8;
constexpr std::uint32_t kSequences = 2;
// Small enough that every export below needs several shards, and that the embedding (and Llama's
// head) alone exceeds it: such a tensor gets a shard of its own.
constexpr std::uint64_t kSmallShardBytes = 20'000;
constexpr double kRelativeTolerance = 1e-5;  // reader's float64 loss against strata's fp32 loss

bool python_has_torch() {
  const std::string command = std::string(kPython) + " -c 'import torch' > /dev/null 2>&1";
  return std::system(command.c_str()) == 0;
}

// A model perturbed and trained a few steps of plain gradient descent from its checkpoint. The
// tiny checkpoint's weights (std 0.02) give nearly uniform logits, a loss of about ln(vocab) that
// hardly depends on any one tensor; the perturbation (tiny_llm.hpp's order-one activations) makes
// every tensor, and bf16's rounding of it, move the loss well beyond the comparison's tolerance.
struct Finetuned {
  std::string name;
  fs::path source;
  HfConfig config;
  std::vector<UnitSpec> units;
  std::vector<std::vector<float>> values;  // flat per unit
  bool gpt2_prefix_stripped = false;
};

Finetuned finetune(const std::string& name, const fs::path& source, const TinyModelOptions& tiny) {
  write_tiny_model(source, tiny);
  Finetuned model{name, source, read_hf_config(source / "config.json"), {}, {},
                  tiny.gpt2_prefix_stripped};
  model.units = decoder_units(model.config);
  const HostWeights loaded = HostWeights::load(source, model.units);
  testing::UnitBuffers params = testing::random_parameters(model.units, tiny.seed);
  for (std::size_t u = 0; u < model.units.size(); ++u) {
    for (std::size_t i = 0; i < params.unit(u).size(); ++i) params.unit(u)[i] += loaded.unit(u)[i];
  }
  DecoderModel decoder(model.config, {kSeqLen, kSequences, false});
  testing::UnitBuffers grads(model.units);
  for (std::uint64_t step = 0; step < 3; ++step) {
    const std::vector<std::int32_t> tokens = testing::random_tokens(
        kSequences * (kSeqLen + 1), model.config.vocab_size, 100 + step);
    testing::forward_backward(decoder, params, grads, tokens, kSeqLen + 1, {});
    for (std::size_t u = 0; u < model.units.size(); ++u) {
      for (std::size_t i = 0; i < params.unit(u).size(); ++i) {
        params.unit(u)[i] -= 0.05f * grads.unit(u)[i];
      }
    }
  }
  for (std::size_t u = 0; u < model.units.size(); ++u) model.values.push_back(params.unit(u));
  return model;
}

void export_model(const Finetuned& model, const fs::path& out, DType dtype,
                  std::uint64_t max_shard_bytes) {
  prepare_export_folder(model.source, out);
  ExportOptions options;
  options.dtype = dtype;
  options.max_shard_bytes = max_shard_bytes;
  options.gpt2_prefix_stripped = model.gpt2_prefix_stripped;
  HfExportWriter writer(out, model.units, options);
  for (std::size_t u = 0; u < model.units.size(); ++u) writer.write_unit(u, model.values[u]);
  writer.finish();
}

// strata's mean next-token loss on `tokens` with the weights as the export stores them: fp32
// exactly, bf16 rounded to nearest even (then exactly representable in fp32).
double strata_loss(const Finetuned& model, DType dtype, const std::vector<std::int32_t>& tokens) {
  std::vector<std::vector<float>> values = model.values;
  if (dtype == DType::kBf16) {
    for (std::vector<float>& unit : values) {
      for (float& value : unit) value = to_float(to_bf16(value));
    }
  }
  const HostWeights weights(model.units, std::move(values));
  DecoderModel decoder(model.config, {kSeqLen, kSequences, false});
  decoder.set_batch(tokens, kSeqLen + 1);
  forward_all(decoder, weights);
  return decoder.loss();
}

nlohmann::json sequences_of(const std::vector<std::int32_t>& tokens) {
  nlohmann::json sequences = nlohmann::json::array();
  for (std::size_t begin = 0; begin < tokens.size(); begin += kSeqLen + 1) {
    sequences.push_back(std::vector<std::int32_t>(tokens.begin() + begin,
                                                  tokens.begin() + begin + kSeqLen + 1));
  }
  return sequences;
}

// Runs the reader once over every case; folder -> its result object.
std::map<std::string, nlohmann::json> read_folders(const fs::path& scratch,
                                                   const nlohmann::json& cases) {
  const fs::path cases_file = scratch / "cases.json";
  std::ofstream(cases_file) << cases.dump();
  const std::string output = testing::run_command(std::string(kPython) + " " +
                                                  STRATA_LLM_FOLDER_READER + " --cases " +
                                                  cases_file.string() + " 2>&1");
  std::map<std::string, nlohmann::json> results;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    const nlohmann::json result = nlohmann::json::parse(line, nullptr, false);
    EXPECT_FALSE(result.is_discarded()) << "the reader printed: " << output;
    if (!result.is_discarded()) results[result["folder"].get<std::string>()] = result;
  }
  return results;
}

// A safetensors file as transformers' writer lays it out (format "pt" metadata, header padded to
// a multiple of 8), fp32: the broken folders differ from a good one only in what the case breaks.
void write_pt_safetensors(const fs::path& file, const std::vector<testing::FloatTensor>& tensors) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  std::uint64_t offset = 0;
  for (const testing::FloatTensor& tensor : tensors) {
    const std::uint64_t bytes = tensor.values.size() * sizeof(float);
    header[tensor.name] = {{"dtype", "F32"}, {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  const std::uint64_t length = text.size();
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&length), sizeof(length));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const testing::FloatTensor& tensor : tensors) {
    out.write(reinterpret_cast<const char*>(tensor.values.data()),
              static_cast<std::streamsize>(tensor.values.size() * sizeof(float)));
  }
  ASSERT_TRUE(out.good()) << file;
}

fs::path copy_folder(const fs::path& from, const fs::path& to) {
  fs::copy(from, to, fs::copy_options::recursive);
  return to;
}

struct Broken {
  fs::path folder;
  std::uint64_t max_shard_bytes;
  std::vector<std::string> message;  // every piece must appear in the reader's refusal
};

// Five ways to break a good fp32 Llama export, each of which the reader must refuse, naming it.
std::vector<Broken> broken_folders(const fs::path& scratch, const fs::path& single,
                                   const fs::path& sharded) {
  std::vector<Broken> broken;
  const std::vector<testing::FloatTensor> tensors =
      testing::read_float_tensors(single / kSingleFileName);

  const fs::path missing = copy_folder(single, scratch / "broken-missing");
  std::vector<testing::FloatTensor> fewer;
  for (const auto& tensor : tensors) {
    if (tensor.name != "model.layers.1.mlp.up_proj.weight") fewer.push_back(tensor);
  }
  EXPECT_EQ(fewer.size() + 1, tensors.size());
  write_pt_safetensors(missing / kSingleFileName, fewer);
  broken.push_back({missing, 5'000'000'000, {"model.layers.1.mlp.up_proj.weight", "missing"}});

  const fs::path reshaped = copy_folder(single, scratch / "broken-shape");
  std::vector<testing::FloatTensor> transposed = tensors;
  for (auto& tensor : transposed) {
    if (tensor.name == "model.layers.0.self_attn.k_proj.weight") {
      std::swap(tensor.shape[0], tensor.shape[1]);  // [kv·head_dim, hidden] -> [hidden, kv·head_dim]
    }
  }
  write_pt_safetensors(reshaped / kSingleFileName, transposed);
  broken.push_back({reshaped, 5'000'000'000,
                    {"model.layers.0.self_attn.k_proj.weight", "shape [32, 16]", "[16, 32]"}});

  const fs::path total = copy_folder(sharded, scratch / "broken-total");
  nlohmann::json index = nlohmann::json::parse(read_text_file(total / kIndexFileName));
  index["metadata"]["total_size"] = index["metadata"]["total_size"].get<std::uint64_t>() + 4;
  std::ofstream(total / kIndexFileName) << index.dump(2);
  broken.push_back({total, kSmallShardBytes, {"total_size"}});

  // A copy of the good sharded folder, held to a limit its shards exceed.
  broken.push_back({copy_folder(sharded, scratch / "over-limit"), kSmallShardBytes / 2,
                    {"exceed the shard limit"}});

  const fs::path dtype = copy_folder(single, scratch / "broken-dtype");
  nlohmann::ordered_json config =
      nlohmann::ordered_json::parse(read_text_file(dtype / "config.json"));
  config["torch_dtype"] = "bfloat16";
  std::ofstream(dtype / "config.json") << config.dump(2);
  broken.push_back({dtype, 5'000'000'000, {"torch_dtype", "F32"}});
  return broken;
}

TinyModelOptions tiny(Family family, bool gpt2_prefix_stripped = false) {
  TinyModelOptions options;
  options.family = family;
  options.gpt2_prefix_stripped = gpt2_prefix_stripped;
  options.seed = 7;
  return options;
}

// What the reader must say of one export: strata's loss on the same weights and tokens.
struct Expected {
  std::string label;
  double strata_loss;
  bool sharded;
  std::string dtype;
};

// The reader's cases (its input) and, by folder, what it must answer.
struct ExportCases {
  std::map<std::string, Expected> expected;
  nlohmann::json cases = nlohmann::json::array();
};

// Exports `model` in fp32 and bf16, in one file and in shards, each a case for the reader; bf16's
// rounding must move strata's loss beyond the comparison's tolerance.
void add_export_cases(const Finetuned& model, const fs::path& scratch, ExportCases& exports) {
  std::map<std::string, Expected>& expected = exports.expected;
  nlohmann::json& cases = exports.cases;
  const std::vector<std::int32_t> tokens =
      testing::random_tokens(kSequences * (kSeqLen + 1), model.config.vocab_size, 42);
  for (const std::uint64_t shard_bytes : {std::uint64_t{5'000'000'000}, kSmallShardBytes}) {
    const bool sharded = shard_bytes == kSmallShardBytes;
    const std::string layout = sharded ? "sharded" : "single";
    const fs::path fp32 = scratch / fmt::format("{}-fp32-{}", model.name, layout);
    for (const DType dtype : {DType::kFp32, DType::kBf16}) {
      const bool bf16 = dtype == DType::kBf16;
      const fs::path out = bf16 ? scratch / fmt::format("{}-bf16-{}", model.name, layout) : fp32;
      export_model(model, out, dtype, shard_bytes);
      nlohmann::json c = {{"folder", out.string()},
                          {"tokens", sequences_of(tokens)},
                          {"dtype", bf16 ? "bf16" : "fp32"},
                          {"max_shard_bytes", shard_bytes}};
      if (bf16) c["rounding_of"] = fp32.string();
      cases.push_back(c);
      expected[out.string()] = {out.filename().string(), strata_loss(model, dtype, tokens), sharded,
                                bf16 ? "BF16" : "F32"};
    }
    const double fp32_loss = expected[fp32.string()].strata_loss;
    const double gap = std::abs(expected[cases.back()["folder"]].strata_loss - fp32_loss);
    EXPECT_GT(gap, 10 * kRelativeTolerance * fp32_loss)
        << model.name << ": bf16 rounding must move the loss beyond the tolerance";
    if (!sharded) {
      std::printf("%-16s bf16 rounding moves the loss by %.1e relative\n", model.name.c_str(),
                  gap / fp32_loss);
    }
  }
}

// Valid in every respect the reader checks, but with layer 0's gate_proj and up_proj values
// exchanged (same shape): only the loss comparison can tell, and it must. Adds the case on the
// tokens of cases[0] (llama_gqa-fp32-single's) and returns its folder.
fs::path add_swapped_case(const fs::path& llama_single, const fs::path& scratch,
                          nlohmann::json& cases) {
  const fs::path swapped = copy_folder(llama_single, scratch / "swapped-gate-up");
  std::vector<testing::FloatTensor> tensors =
      testing::read_float_tensors(llama_single / kSingleFileName);
  std::map<std::string, testing::FloatTensor*> by_name;
  for (testing::FloatTensor& tensor : tensors) by_name[tensor.name] = &tensor;
  std::swap(by_name.at("model.layers.0.mlp.gate_proj.weight")->values,
            by_name.at("model.layers.0.mlp.up_proj.weight")->values);
  write_pt_safetensors(swapped / kSingleFileName, tensors);
  cases.push_back({{"folder", swapped.string()},
                   {"tokens", cases[0]["tokens"]},  // llama_gqa-fp32-single's
                   {"max_shard_bytes", 5'000'000'000}});
  return swapped;
}

// Every export accepted, in its dtype and file layout, with strata's loss.
void expect_reader_accepts(const std::map<std::string, nlohmann::json>& results,
                           const std::map<std::string, Expected>& expected) {
  // Both fp32 and float64 compute the loss of the very same weights; fp32's sums over 24-64 wide
  // rows round at ~1e-7 relative (measured here: at most 1e-7; decoder_torch_test likewise).
  // Bound: 1e-5 relative, as decoder_torch_test's. It tells bf16 from fp32 weights apart: their
  // losses differ by far more (add_export_cases checks), and a wrong or transposed tensor moves it
  // more still.
  for (const auto& [folder, want] : expected) {
    SCOPED_TRACE(want.label);
    ASSERT_TRUE(results.contains(folder));
    const nlohmann::json& got = results.at(folder);
    ASSERT_TRUE(got["ok"].get<bool>()) << got["error"];
    EXPECT_EQ(got["dtype"], want.dtype);
    const auto files = got["files"].get<std::vector<std::string>>();
    if (want.sharded) {
      EXPECT_GE(files.size(), 3u);
    } else {
      EXPECT_EQ(files, std::vector<std::string>{kSingleFileName});
    }
    const double loss = got["loss"].get<double>();
    EXPECT_NEAR(loss, want.strata_loss, kRelativeTolerance * std::abs(loss));
    std::printf("%-28s %zu file(s), %3d tensors: reader loss %.9f, strata %.9f (%.1e relative)\n",
                want.label.c_str(), files.size(), got["tensors"].get<int>(), loss, want.strata_loss,
                std::abs(loss - want.strata_loss) / loss);
  }
}

// Every broken folder refused, with the pieces of its message.
void expect_reader_refuses(const std::map<std::string, nlohmann::json>& results,
                           const std::vector<Broken>& broken) {
  for (const Broken& b : broken) {
    SCOPED_TRACE(b.folder.filename().string());
    ASSERT_TRUE(results.contains(b.folder.string()));
    const nlohmann::json& got = results.at(b.folder.string());
    EXPECT_FALSE(got["ok"].get<bool>()) << "the reader accepted a broken folder";
    const std::string error = got["error"].is_string() ? got["error"].get<std::string>() : "";
    for (const std::string& piece : b.message) {
      EXPECT_NE(error.find(piece), std::string::npos) << "'" << piece << "' not in: " << error;
    }
  }
}

// One reader process for every folder: importing torch takes seconds.
TEST(HfExportReader, AnIndependentReaderAcceptsEveryExportAndComputesStratasLoss) {
  if (!python_has_torch()) GTEST_SKIP() << kPython << " cannot import torch (python3-torch)";
  set_blas_threads(1);
  ScratchDir scratch;
  const std::vector<Finetuned> models = {
      finetune("llama_gqa", scratch.path() / "llama", tiny(Family::kLlama)),
      finetune("qwen2_bias_tied", scratch.path() / "qwen2", tiny(Family::kQwen2)),
      finetune("mistral", scratch.path() / "mistral", tiny(Family::kMistral)),
      finetune("gpt2", scratch.path() / "gpt2", tiny(Family::kGpt2)),
      finetune("gpt2_bare_names", scratch.path() / "gpt2-bare", tiny(Family::kGpt2, true))};

  ExportCases exports;
  for (const Finetuned& model : models) add_export_cases(model, scratch.path(), exports);
  nlohmann::json& cases = exports.cases;
  const std::vector<Broken> broken =
      broken_folders(scratch.path(), scratch.path() / "llama_gqa-fp32-single",
                     scratch.path() / "llama_gqa-fp32-sharded");
  for (const Broken& b : broken) {
    cases.push_back({{"folder", b.folder.string()}, {"max_shard_bytes", b.max_shard_bytes}});
  }
  const fs::path llama_single = scratch.path() / "llama_gqa-fp32-single";
  const fs::path swapped = add_swapped_case(llama_single, scratch.path(), cases);

  const std::map<std::string, nlohmann::json> results = read_folders(scratch.path(), cases);
  ASSERT_EQ(results.size(), cases.size());
  ASSERT_NO_FATAL_FAILURE(expect_reader_accepts(results, exports.expected));
  ASSERT_TRUE(results.at(swapped.string())["ok"].get<bool>()) << results.at(swapped.string());
  const double swapped_loss = results.at(swapped.string())["loss"].get<double>();
  const double good_loss = exports.expected.at(llama_single.string()).strata_loss;
  EXPECT_GT(std::abs(swapped_loss - good_loss), 100 * kRelativeTolerance * good_loss)
      << "exchanging two tensors left the loss within the tolerance: the comparison proves little";
  std::printf("gate_proj <-> up_proj exchanged: loss %.6f instead of %.6f\n", swapped_loss,
              good_loss);
  expect_reader_refuses(results, broken);
}

}  // namespace
}  // namespace strata::llm
