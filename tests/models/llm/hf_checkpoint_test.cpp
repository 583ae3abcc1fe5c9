// Proves the Hugging Face checkpoint loader: every family's tiny folder (Llama with GQA and llama3
// rope scaling as sharded bf16 with an index, Qwen2 tied, Mistral, GPT-2 with and without the
// `transformer.` prefix) loads the values an independent Python reader sees; missing, unexpected
// and mis-shaped tensors are errors naming tensor and file; known buffers are skipped; each of two
// ranks reads only its half of the bytes.
#include "models/checkpoint/hf_checkpoint.hpp"

#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "models/checkpoint/host_weights.hpp"
#include "models/checkpoint/weights_loader.hpp"
#include "runtime/comm/communicator.hpp"
#include "tests/models/llm/llm_io_test_support.hpp"

namespace strata::llm {
namespace {

using testing::FloatTensor;
using testing::ScratchDir;

struct FamilyCase {
  const char* name;
  TinyModelOptions options;
};

std::vector<FamilyCase> family_cases() {
  TinyModelOptions llama;  // GQA, llama3 rope scaling; sharded bf16
  llama.family = Family::kLlama;
  llama.dtype = DType::kBf16;
  llama.max_shard_bytes = 20'000;
  TinyModelOptions qwen2;
  qwen2.family = Family::kQwen2;
  qwen2.dtype = DType::kFp16;
  TinyModelOptions mistral;
  mistral.family = Family::kMistral;
  TinyModelOptions gpt2;
  gpt2.family = Family::kGpt2;
  TinyModelOptions gpt2_bare = gpt2;
  gpt2_bare.gpt2_prefix_stripped = true;
  return {{"llama_sharded_bf16", llama},
          {"qwen2_tied_fp16", qwen2},
          {"mistral_fp32", mistral},
          {"gpt2_prefixed", gpt2},
          {"gpt2_bare_names", gpt2_bare}};
}

class EveryFamily : public ::testing::TestWithParam<FamilyCase> {};

TEST_P(EveryFamily, LoadsWhatAnIndependentReaderSees) {
  const FamilyCase& param = GetParam();
  ScratchDir scratch;
  const std::filesystem::path dir = scratch.path() / "model";
  write_tiny_model(dir, param.options);
  const HfConfig config = read_hf_config(dir / "config.json");
  const std::vector<UnitSpec> units = decoder_units(config);
  const HfCheckpoint checkpoint = HfCheckpoint::open(dir);
  EXPECT_EQ(checkpoint.sharded(), param.options.max_shard_bytes < 1'000'000);
  EXPECT_EQ(checkpoint.gpt2_prefix_stripped(), param.options.gpt2_prefix_stripped);
  const HostWeights weights = HostWeights::load(dir, units);
  const nlohmann::json reference = testing::python_tensor_summary(dir);
  std::size_t matched = 0;
  for (std::size_t u = 0; u < units.size(); ++u) {
    for (std::size_t t = 0; t < units[u].tensors.size(); ++t) {
      const TensorSpec& spec = units[u].tensors[t];
      const std::string name = checkpoint.stored_name(spec.hf_name);
      ASSERT_TRUE(reference.contains(name)) << name;
      const nlohmann::json& expected = reference[name];
      EXPECT_EQ(expected["shape"].get<std::vector<std::size_t>>(), spec.shape) << name;
      const std::span<const float> values = weights.views(u)[t];
      double sum = 0;
      for (float v : values) sum += v;
      EXPECT_NEAR(sum, expected["sum"].get<double>(), 1e-9 * values.size() + 1e-9) << name;
      EXPECT_EQ(values.front(), expected["first"].get<float>()) << name;
      EXPECT_EQ(values.back(), expected["last"].get<float>()) << name;
      ++matched;
    }
  }
  EXPECT_EQ(matched, reference.size()) << "every stored tensor is a parameter of the model";
}

INSTANTIATE_TEST_SUITE_P(HfCheckpoint, EveryFamily, ::testing::ValuesIn(family_cases()),
                         [](const auto& test_case) { return std::string(test_case.param.name); });

// A single-file fp32 tiny Llama, its tensors, and the folder to rewrite them in.
struct BrokenCheckpoint {
  ScratchDir scratch;
  std::filesystem::path dir = scratch.path() / "model";
  std::filesystem::path file = dir / kSingleFileName;
  std::vector<FloatTensor> tensors;
  std::vector<UnitSpec> units;

  BrokenCheckpoint() {
    write_tiny_model(dir, TinyModelOptions{});
    tensors = testing::read_float_tensors(file);
    units = decoder_units(read_hf_config(dir / "config.json"));
  }
  std::string load_error() {
    testing::write_float_tensors(file, tensors);
    try {
      HfCheckpoint::open(dir).check(units);
    } catch (const CheckpointError& error) {
      return error.what();
    }
    return "no error";
  }
};

TEST(HfCheckpointErrors, MissingTensorNamesTensorAndFile) {
  BrokenCheckpoint broken;
  std::erase_if(broken.tensors, [](const FloatTensor& t) {
    return t.name == "model.layers.1.mlp.up_proj.weight";
  });
  const std::string error = broken.load_error();
  EXPECT_NE(error.find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << error;
  EXPECT_NE(error.find("missing"), std::string::npos) << error;
  EXPECT_NE(error.find(broken.file.string()), std::string::npos) << error;
}

TEST(HfCheckpointErrors, UnexpectedTensorNamesTensorAndFile) {
  BrokenCheckpoint broken;
  broken.tensors.push_back({"model.layers.0.self_attn.q_norm.weight", {8}, std::vector<float>(8)});
  const std::string error = broken.load_error();
  EXPECT_NE(error.find("unexpected tensor 'model.layers.0.self_attn.q_norm.weight'"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find(broken.file.string()), std::string::npos) << error;
}

TEST(HfCheckpointErrors, MisShapedTensorNamesTensorFileAndShapes) {
  BrokenCheckpoint broken;
  for (FloatTensor& tensor : broken.tensors) {
    if (tensor.name == "model.layers.0.self_attn.k_proj.weight") {
      tensor.shape = {tensor.shape[1], tensor.shape[0]};  // transposed: same size, wrong layout
    }
  }
  const std::string error = broken.load_error();
  EXPECT_NE(error.find("model.layers.0.self_attn.k_proj.weight"), std::string::npos) << error;
  EXPECT_NE(error.find("[32, 16]"), std::string::npos) << error;
  EXPECT_NE(error.find("expects [16, 32]"), std::string::npos) << error;
  EXPECT_NE(error.find(broken.file.string()), std::string::npos) << error;
}

TEST(HfCheckpointErrors, KnownBuffersAreSkipped) {
  BrokenCheckpoint broken;
  broken.tensors.push_back(
      {"model.layers.0.self_attn.rotary_emb.inv_freq", {4}, {1.0f, 0.1f, 0.01f, 0.001f}});
  EXPECT_EQ(broken.load_error(), "no error");
}

TEST(HfCheckpointErrors, NoWeightsInTheFolderIsNamed) {
  ScratchDir scratch;
  try {
    HfCheckpoint::open(scratch.path());
    FAIL() << "opened an empty folder";
  } catch (const CheckpointError& error) {
    EXPECT_NE(std::string(error.what()).find("model.safetensors"), std::string::npos);
  }
}

TEST(HfCheckpointErrors, IndexNamingAShardThatLacksTheTensor) {
  ScratchDir scratch;
  const std::filesystem::path dir = scratch.path() / "model";
  TinyModelOptions options;
  options.max_shard_bytes = 40'000;
  write_tiny_model(dir, options);
  nlohmann::json index = nlohmann::json::parse(read_text_file(dir / kIndexFileName));
  index["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  std::ofstream(dir / kIndexFileName) << index.dump();
  try {
    HfCheckpoint::open(dir);
    FAIL() << "accepted an index that maps a tensor to the wrong shard";
  } catch (const CheckpointError& error) {
    EXPECT_NE(std::string(error.what()).find("model.norm.weight"), std::string::npos)
        << error.what();
  }
}

// Rank `rank` of two: its all-gather keeps its own slice and poisons the other with NaN, so the
// test sees exactly what this rank read.
class OneOfTwoRanks : public runtime::comm::Communicator {
 public:
  explicit OneOfTwoRanks(int rank) : rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  std::string_view backend_name() const override { return "test"; }

 protected:
  void do_all_gather(runtime::comm::ConstBuffer send,
                     runtime::comm::MutableBuffer recv) override {
    auto* out = static_cast<float*>(recv.data);
    std::fill(out, out + recv.count, std::numeric_limits<float>::quiet_NaN());
    std::copy_n(static_cast<const float*>(send.data), send.count, out + rank_ * send.count);
  }
  void do_reduce_scatter(runtime::comm::ConstBuffer, runtime::comm::MutableBuffer,
                         runtime::comm::ReduceOp) override {}
  void do_all_reduce(runtime::comm::MutableBuffer, runtime::comm::ReduceOp) override {}
  void do_broadcast(runtime::comm::MutableBuffer, int) override {}
  void do_barrier() override {}

 private:
  int rank_;
};

TEST(WeightsLoader, EachOfTwoRanksReadsOnlyItsHalfOfEveryUnit) {
  ScratchDir scratch;
  const std::filesystem::path dir = scratch.path() / "model";
  TinyModelOptions options;
  options.dtype = DType::kBf16;
  write_tiny_model(dir, options);
  const std::vector<UnitSpec> units = decoder_units(read_hf_config(dir / "config.json"));
  const HostWeights whole = HostWeights::load(dir, units);
  std::uint64_t total_bytes = 0;
  for (const UnitSpec& unit : units) total_bytes += unit.numel * 2;
  for (int rank = 0; rank < 2; ++rank) {
    const HfCheckpoint checkpoint = HfCheckpoint::open(dir);
    checkpoint.check(units);
    OneOfTwoRanks comm(rank);
    load_units(checkpoint, units, comm, [&](std::size_t u, std::span<const float> values) {
      const std::size_t slice = (units[u].numel + 1) / 2;
      const std::size_t first = rank * slice;
      for (std::size_t i = 0; i < values.size(); ++i) {
        const bool mine = i >= first && i < first + slice;
        if (mine) {
          ASSERT_EQ(values[i], whole.unit(u)[i]) << "unit " << u << " element " << i;
        } else {
          ASSERT_TRUE(std::isnan(values[i])) << "rank " << rank << " read element " << i;
        }
      }
    });
    EXPECT_LE(checkpoint.bytes_read(), total_bytes / 2 + 2 * units.size()) << "rank " << rank;
    EXPECT_GE(checkpoint.bytes_read(), total_bytes / 2 - 2 * units.size()) << "rank " << rank;
  }
}

}  // namespace
}  // namespace strata::llm
