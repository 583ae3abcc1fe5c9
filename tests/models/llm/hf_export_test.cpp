// Proves the Hugging Face export: load -> export -> load is the identity (fp32 bitwise, names,
// shapes and layout of the input kept, GPT-2's bare names included); a bf16 export holds exactly
// the bf16 rounding; shards never exceed the size limit and the index lists every tensor and the
// total size; one file when one shard suffices, with no stale index left behind; config.json names
// the exported dtype.
#include "models/checkpoint/hf_export.hpp"

#include <cstring>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/float16.hpp"
#include "models/checkpoint/hf_checkpoint.hpp"
#include "models/checkpoint/host_weights.hpp"
#include "tests/models/llm/llm_io_test_support.hpp"

namespace strata::llm {
namespace {

using testing::ScratchDir;

struct Loaded {
  std::vector<UnitSpec> units;
  HostWeights weights;
};

Loaded load(const std::filesystem::path& dir) {
  std::vector<UnitSpec> units = decoder_units(read_hf_config(dir / "config.json"));
  HostWeights weights = HostWeights::load(dir, units);
  return {std::move(units), std::move(weights)};
}

void export_folder(const std::filesystem::path& source, const std::filesystem::path& out,
                   const Loaded& model, ExportOptions options) {
  options.gpt2_prefix_stripped = HfCheckpoint::open(source).gpt2_prefix_stripped();
  prepare_export_folder(source, out);
  HfExportWriter writer(out, model.units, options);
  for (std::size_t u = 0; u < model.units.size(); ++u) writer.write_unit(u, model.weights.unit(u));
  writer.finish();
}

void expect_same_values(const Loaded& a, const Loaded& b) {
  ASSERT_EQ(a.units.size(), b.units.size());
  for (std::size_t u = 0; u < a.units.size(); ++u) {
    const auto x = a.weights.unit(u);
    const auto y = b.weights.unit(u);
    ASSERT_EQ(x.size(), y.size());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size_bytes()), 0) << a.units[u].name;
  }
}

std::set<std::string> keys_of(const nlohmann::json& summary) {
  std::set<std::string> keys;
  for (const auto& [key, unused] : summary.items()) keys.insert(key);
  return keys;
}

class ExportRoundTrip : public ::testing::TestWithParam<TinyModelOptions> {};

TEST_P(ExportRoundTrip, Fp32ExportLoadsBackBitwiseWithTheInputsNames) {
  ScratchDir scratch;
  const std::filesystem::path source = scratch.path() / "source";
  const std::filesystem::path out = scratch.path() / "exported";
  write_tiny_model(source, GetParam());
  const Loaded original = load(source);
  ExportOptions options;
  options.dtype = DType::kFp32;
  export_folder(source, out, original, options);
  expect_same_values(original, load(out));
  const nlohmann::json before = testing::python_tensor_summary(source);
  const nlohmann::json after = testing::python_tensor_summary(out);
  EXPECT_EQ(keys_of(before), keys_of(after));
  for (const auto& [name, entry] : before.items()) {
    EXPECT_EQ(entry["shape"], after[name]["shape"]) << name;
    EXPECT_EQ(after[name]["dtype"], "F32") << name;
  }
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_EQ(read_text_file(source / file), read_text_file(out / file)) << file;
  }
  // config.json: the same, but for the dtype it names, now the exported one.
  nlohmann::json config = nlohmann::json::parse(read_text_file(source / "config.json"));
  if (config["torch_dtype"] == "float32") {
    EXPECT_EQ(read_text_file(source / "config.json"), read_text_file(out / "config.json"));
  }
  config["torch_dtype"] = "float32";
  EXPECT_EQ(nlohmann::json::parse(read_text_file(out / "config.json")), config);
}

TinyModelOptions gpt2_bare() {
  TinyModelOptions options;
  options.family = Family::kGpt2;
  options.gpt2_prefix_stripped = true;
  return options;
}

TinyModelOptions qwen2_bf16() {
  TinyModelOptions options;
  options.family = Family::kQwen2;
  options.dtype = DType::kBf16;
  return options;
}

TinyModelOptions llama_sharded() {
  TinyModelOptions options;
  options.max_shard_bytes = 30'000;
  return options;
}

INSTANTIATE_TEST_SUITE_P(HfExport, ExportRoundTrip,
                         ::testing::Values(llama_sharded(), qwen2_bf16(), gpt2_bare()));

TEST(HfExport, Bf16ExportHoldsTheBf16RoundingOfTheWeights) {
  ScratchDir scratch;
  const std::filesystem::path source = scratch.path() / "source";
  const std::filesystem::path out = scratch.path() / "exported";
  write_tiny_model(source, TinyModelOptions{});  // fp32: most values are not bf16 numbers
  const Loaded original = load(source);
  export_folder(source, out, original, ExportOptions{});  // bf16 by default
  const Loaded exported = load(out);
  std::size_t changed = 0;
  for (std::size_t u = 0; u < original.units.size(); ++u) {
    for (std::size_t i = 0; i < original.weights.unit(u).size(); ++i) {
      const float value = original.weights.unit(u)[i];
      const float rounded = to_float(to_bf16(value));
      ASSERT_EQ(exported.weights.unit(u)[i], rounded) << original.units[u].name << " " << i;
      changed += rounded != value ? 1 : 0;
    }
  }
  EXPECT_GT(changed, 0u) << "the source was already bf16: the test proves nothing";
  const nlohmann::json summary = testing::python_tensor_summary(out);
  for (const auto& [name, entry] : summary.items()) {
    EXPECT_EQ(entry["dtype"], "BF16") << name;
  }
}

// transformers' save_pretrained writes the weights' dtype into config.json and
// from_pretrained(torch_dtype="auto") loads by it: an fp32 model exported in bf16 must say bf16.
TEST(HfExport, ConfigJsonNamesTheDtypeTheWeightsAreStoredIn) {
  ScratchDir scratch;
  const std::filesystem::path source = scratch.path() / "source";
  const std::filesystem::path out = scratch.path() / "exported";
  write_tiny_model(source, TinyModelOptions{});  // torch_dtype float32
  const Loaded original = load(source);
  export_folder(source, out, original, ExportOptions{});  // bf16
  nlohmann::json config = nlohmann::json::parse(read_text_file(source / "config.json"));
  ASSERT_EQ(config["torch_dtype"], "float32");
  config["torch_dtype"] = "bfloat16";
  EXPECT_EQ(nlohmann::json::parse(read_text_file(out / "config.json")), config);
  EXPECT_EQ(read_hf_config(out / "config.json").torch_dtype, DType::kBf16);

  // transformers 5's key `dtype` is updated in place; no torch_dtype is added beside it.
  const std::filesystem::path renamed = scratch.path() / "config.json";
  std::ofstream(renamed) << R"({"model_type": "llama", "dtype": "float32", "rope_theta": 1e4})";
  record_export_dtype(renamed, DType::kFp16);
  EXPECT_EQ(nlohmann::json::parse(read_text_file(renamed)),
            nlohmann::json::parse(R"({"model_type": "llama", "dtype": "float16", "rope_theta": 1e4})"));
  std::ofstream(renamed) << "[1, 2]";
  EXPECT_THROW(record_export_dtype(renamed, DType::kBf16), CheckpointError);
}

TEST(HfExport, ShardsRespectTheMaximumSizeAndTheIndexListsEverything) {
  ScratchDir scratch;
  const std::filesystem::path source = scratch.path() / "source";
  const std::filesystem::path out = scratch.path() / "exported";
  write_tiny_model(source, TinyModelOptions{});
  const Loaded original = load(source);
  ExportOptions options;
  options.dtype = DType::kFp32;
  options.max_shard_bytes = 40'000;
  export_folder(source, out, original, options);

  const nlohmann::json index = nlohmann::json::parse(read_text_file(out / kIndexFileName));
  const nlohmann::json summary = testing::python_tensor_summary(out);
  std::map<std::string, std::uint64_t> shard_bytes;
  std::uint64_t total = 0;
  std::uint64_t largest_tensor = 0;
  for (const auto& [name, entry] : summary.items()) {
    std::uint64_t bytes = 4;
    for (std::size_t extent : entry["shape"].get<std::vector<std::size_t>>()) bytes *= extent;
    shard_bytes[entry["file"]] += bytes;
    total += bytes;
    largest_tensor = std::max(largest_tensor, bytes);
    EXPECT_EQ(index["weight_map"][name], entry["file"]) << name;
  }
  ASSERT_LT(largest_tensor, options.max_shard_bytes) << "every shard could respect the limit";
  EXPECT_EQ(index["weight_map"].size(), summary.size());
  EXPECT_EQ(index["metadata"]["total_size"].get<std::uint64_t>(), total);
  const std::size_t shards = shard_bytes.size();
  EXPECT_GE(shards, total / options.max_shard_bytes + 1);
  std::size_t number = 1;
  for (const auto& [file, bytes] : shard_bytes) {
    EXPECT_LE(bytes, options.max_shard_bytes) << file;
    EXPECT_EQ(file, fmt::format("model-{:05}-of-{:05}.safetensors", number++, shards));
  }
  EXPECT_FALSE(std::filesystem::exists(out / kSingleFileName));
  expect_same_values(original, load(out));

  // Exported again into the same folder in one shard: the old shards and index are gone.
  export_folder(source, out, original, ExportOptions{});
  EXPECT_TRUE(std::filesystem::exists(out / kSingleFileName));
  EXPECT_FALSE(std::filesystem::exists(out / kIndexFileName));
  for (const auto& entry : std::filesystem::directory_iterator(out)) {
    EXPECT_FALSE(entry.path().filename().string().starts_with("model-")) << entry.path();
  }
}

TEST(HfExport, RefusesToOverwriteTheModelItReads) {
  ScratchDir scratch;
  const std::filesystem::path source = scratch.path() / "source";
  write_tiny_model(source, TinyModelOptions{});
  EXPECT_THROW(prepare_export_folder(source, source / "." ), CheckpointError);
}

}  // namespace
}  // namespace strata::llm
