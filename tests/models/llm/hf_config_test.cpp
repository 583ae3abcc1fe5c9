// Proves read_hf_config reads the published config.json of each family into the right shapes and
// parameter counts, and refuses unsupported architectures and values naming the file and key.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "models/decoder/decoder_model.hpp"
#include "models/decoder/hf_config.hpp"

namespace strata::llm {
namespace {

namespace fs = std::filesystem;

// As published on the Hugging Face hub (meta-llama/Llama-3.1-8B, Qwen/Qwen2.5-0.5B,
// mistralai/Mistral-7B-v0.1, openai-community/gpt2), trimmed of keys that do not shape the model.
const char* kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_cache": true, "vocab_size": 128256})";

const char* kQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
  "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";

const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "vocab_size": 32000})";

const char* kGpt2 = R"({
  "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
  "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
  "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
  "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": null,
  "vocab_size": 50257})";

fs::path write_config(const std::string& name, const std::string& text) {
  const char* root = std::getenv("STRATA_TEST_TMPDIR");
  const fs::path dir = fs::path(root != nullptr ? root : fs::temp_directory_path().string()) /
                       ("hf-config-" + name + "-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << text;
  return dir / "config.json";
}

std::uint64_t unit_parameters(const HfConfig& config) {
  std::uint64_t count = 0;
  for (const UnitSpec& unit : decoder_units(config)) count += unit.numel;
  return count;
}

TEST(HfConfigTest, ReadsLlama31WithGqaAndLlama3RopeScaling) {
  const fs::path path = write_config("llama", kLlama31_8B);
  const HfConfig c = read_hf_config(path);
  EXPECT_EQ(c.source, path);
  EXPECT_EQ(c.family, Family::kLlama);
  EXPECT_EQ(family_name(c.family), "llama");
  EXPECT_EQ(c.hidden_size, 4096u);
  EXPECT_EQ(c.intermediate_size, 14336u);
  EXPECT_EQ(c.num_layers, 32u);
  EXPECT_EQ(c.num_heads, 32u);
  EXPECT_EQ(c.num_kv_heads, 8u);
  EXPECT_EQ(c.head_dim, 128u);
  EXPECT_EQ(c.vocab_size, 128256u);
  EXPECT_EQ(c.max_position_embeddings, 131072u);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192u);
  EXPECT_EQ(c.activation, Activation::kSilu);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_qkv_bias);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.torch_dtype, DType::kBf16);
  EXPECT_EQ(c.bos_token_ids, (std::vector<std::int32_t>{128000}));
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int32_t>{128001, 128008, 128009}));
  // The published count of Llama 3.1 8B, from the config and from the units alike.
  EXPECT_EQ(c.parameter_count(), 8030261248u);
  EXPECT_EQ(unit_parameters(c), 8030261248u);
  fs::remove_all(path.parent_path());
}

TEST(HfConfigTest, ReadsQwen2WithBiasesTiedEmbeddingsAndNoWindow) {
  const HfConfig c = parse_hf_config(kQwen25_05B);
  EXPECT_EQ(c.source, "<string>");
  EXPECT_EQ(c.family, Family::kQwen2);
  EXPECT_TRUE(c.attention_qkv_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 64u);
  EXPECT_EQ(c.num_kv_heads, 2u);
  EXPECT_FALSE(c.sliding_window.has_value()) << "use_sliding_window false switches it off";
  EXPECT_EQ(c.eos_token_ids, (std::vector<std::int32_t>{151643}));
  EXPECT_EQ(c.parameter_count(), 494032768u);  // Qwen2.5-0.5B
  EXPECT_EQ(unit_parameters(c), 494032768u);
}

TEST(HfConfigTest, ReadsMistralWithSlidingWindow) {
  const HfConfig c = parse_hf_config(kMistral7B);
  EXPECT_EQ(c.family, Family::kMistral);
  ASSERT_TRUE(c.sliding_window.has_value());
  EXPECT_EQ(*c.sliding_window, 4096u);
  EXPECT_EQ(c.parameter_count(), 7241732096u);  // Mistral-7B-v0.1
  EXPECT_EQ(unit_parameters(c), 7241732096u);
  std::string text = kMistral7B;
  const std::string window = "\"sliding_window\": 4096";
  text.replace(text.find(window), window.size(), "\"sliding_window\": null");
  const HfConfig no_window = parse_hf_config(text);
  EXPECT_FALSE(no_window.sliding_window.has_value());
}

TEST(HfConfigTest, ReadsGpt2Keys) {
  const HfConfig c = parse_hf_config(kGpt2);
  EXPECT_EQ(c.family, Family::kGpt2);
  EXPECT_TRUE(c.is_gpt2());
  EXPECT_EQ(c.hidden_size, 768u);
  EXPECT_EQ(c.num_layers, 12u);
  EXPECT_EQ(c.num_heads, 12u);
  EXPECT_EQ(c.num_kv_heads, 12u);
  EXPECT_EQ(c.head_dim, 64u);
  EXPECT_EQ(c.intermediate_size, 3072u) << "n_inner absent: 4 × n_embd";
  EXPECT_EQ(c.max_position_embeddings, 1024u);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-5);
  EXPECT_EQ(c.activation, Activation::kGeluTanh);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attention_qkv_bias && c.attention_out_bias && c.mlp_bias);
  EXPECT_EQ(c.torch_dtype, DType::kFp32) << "no torch_dtype: fp32";
  EXPECT_EQ(c.parameter_count(), 124439808u);  // GPT-2 small
  EXPECT_EQ(unit_parameters(c), 124439808u);
}

TEST(HfConfigTest, UnitsCarryHfNamesShapesInitsAndDecay) {
  const std::vector<UnitSpec> units = decoder_units(parse_hf_config(kQwen25_05B));
  ASSERT_EQ(units.size(), 26u);
  EXPECT_EQ(units[0].name, "embed");
  EXPECT_EQ(units[0].tensors[0].hf_name, "model.embed_tokens.weight");
  const UnitSpec& layer = units[3];
  EXPECT_EQ(layer.name, "layers.2");
  EXPECT_EQ(layer.kind, UnitKind::kLayer);
  EXPECT_EQ(layer.layer, 2u);
  std::vector<std::string> names;
  for (const TensorSpec& t : layer.tensors) names.push_back(t.hf_name);
  const std::vector<std::string> expected = {
      "model.layers.2.input_layernorm.weight",   "model.layers.2.self_attn.q_proj.weight",
      "model.layers.2.self_attn.q_proj.bias",    "model.layers.2.self_attn.k_proj.weight",
      "model.layers.2.self_attn.k_proj.bias",    "model.layers.2.self_attn.v_proj.weight",
      "model.layers.2.self_attn.v_proj.bias",    "model.layers.2.self_attn.o_proj.weight",
      "model.layers.2.post_attention_layernorm.weight", "model.layers.2.mlp.gate_proj.weight",
      "model.layers.2.mlp.up_proj.weight",       "model.layers.2.mlp.down_proj.weight"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(layer.tensors[3].shape, (std::vector<std::size_t>{128, 896}));  // k_proj [out, in]
  EXPECT_EQ(layer.tensors[11].shape, (std::vector<std::size_t>{896, 4864}));
  for (const TensorSpec& t : layer.tensors) {
    const bool vector = t.shape.size() == 1;
    EXPECT_EQ(t.weight_decay, !vector) << t.name;
    if (t.name.ends_with("layernorm.weight")) {
      EXPECT_EQ(t.init.kind, runtime::InitKind::kOnes) << t.name;
    } else if (vector) {
      EXPECT_EQ(t.init.kind, runtime::InitKind::kZeros) << t.name;
    } else {
      EXPECT_EQ(t.init.kind, runtime::InitKind::kNormal) << t.name;
      EXPECT_FLOAT_EQ(t.init.std, 0.02f) << t.name;
    }
  }
  EXPECT_EQ(layer.tensors[5].offset, layer.tensors[4].offset + layer.tensors[4].numel());
  const UnitSpec& head = units.back();
  EXPECT_TRUE(head.reads_embedding);
  ASSERT_EQ(head.tensors.size(), 1u);
  EXPECT_EQ(head.tensors[0].hf_name, "model.norm.weight");
  const runtime::UnitSpec engine = engine_unit(layer);
  EXPECT_EQ(engine.name, "layers.2");
  EXPECT_EQ(engine.tensors[1].name, "self_attn.q_proj.weight");
  EXPECT_EQ(engine.tensors[1].shape, (std::vector<std::uint64_t>{896, 896}));
  EXPECT_FALSE(engine.tensors[0].weight_decay);

  const std::vector<UnitSpec> gpt2 = decoder_units(parse_hf_config(kGpt2));
  EXPECT_EQ(gpt2[0].tensors[1].hf_name, "transformer.wpe.weight");
  EXPECT_EQ(gpt2[1].tensors[2].hf_name, "transformer.h.0.attn.c_attn.weight");
  EXPECT_EQ(gpt2[1].tensors[2].shape, (std::vector<std::size_t>{768, 2304}));  // Conv1D [in, out]
  EXPECT_EQ(gpt2.back().tensors[1].hf_name, "transformer.ln_f.bias");
  const std::vector<UnitSpec> llama = decoder_units(parse_hf_config(kLlama31_8B));
  EXPECT_FALSE(llama.back().reads_embedding);
  EXPECT_EQ(llama.back().tensors[1].hf_name, "lm_head.weight");
}

// Each bad config.json: the substitution that breaks it and what the message must name.
struct BadConfig {
  const char* name;
  const char* find;
  const char* replace;
  const char* key;    // named in the message
  const char* value;  // named in the message
};

class HfConfigErrorTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(HfConfigErrorTest, NamesFileAndKey) {
  const BadConfig& bad = GetParam();
  std::string text = kLlama31_8B;
  const std::size_t at = text.find(bad.find);
  ASSERT_NE(at, std::string::npos) << bad.find;
  text.replace(at, std::string(bad.find).size(), bad.replace);
  const fs::path path = write_config(bad.name, text);
  try {
    read_hf_config(path);
    ADD_FAILURE() << "accepted " << bad.name;
  } catch (const HfConfigError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find(bad.key), std::string::npos) << message;
    EXPECT_NE(message.find(bad.value), std::string::npos) << message;
  }
  fs::remove_all(path.parent_path());
}

INSTANTIATE_TEST_SUITE_P(
    Refusals, HfConfigErrorTest,
    ::testing::Values(
        BadConfig{"unknown_architecture", "LlamaForCausalLM", "GemmaForCausalLM", "architectures",
                  "GemmaForCausalLM"},
        BadConfig{"rope_yarn", "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"",
                  "rope_scaling.rope_type", "yarn"},
        BadConfig{"missing_hidden_size", "\"hidden_size\": 4096,", "", "hidden_size", "missing"},
        BadConfig{"heads_as_string", "\"num_attention_heads\": 32", "\"num_attention_heads\": \"32\"",
                  "num_attention_heads", "positive integer"},
        BadConfig{"kv_heads_not_dividing", "\"num_key_value_heads\": 8",
                  "\"num_key_value_heads\": 5", "num_key_value_heads", "divide"},
        BadConfig{"unknown_activation", "\"silu\"", "\"relu\"", "hidden_act", "relu"},
        BadConfig{"unknown_dtype", "\"bfloat16\"", "\"float8\"", "torch_dtype", "float8"},
        BadConfig{"attention_bias", "\"attention_bias\": false", "\"attention_bias\": true",
                  "attention_bias", "not supported"},
        BadConfig{"llama3_without_factor", "\"factor\": 8.0,", "", "rope_scaling.factor",
                  "positive number"},
        BadConfig{"llama3_original_not_integer", "\"original_max_position_embeddings\": 8192",
                  "\"original_max_position_embeddings\": 8192.5",
                  "rope_scaling.original_max_position_embeddings", "8192.5"},
        BadConfig{"llama3_original_beyond_uint32", "\"original_max_position_embeddings\": 8192",
                  "\"original_max_position_embeddings\": 1e12",
                  "rope_scaling.original_max_position_embeddings", "1000000000000"},
        BadConfig{"eos_beyond_vocab", "128009]", "999999]", "eos_token_id",
                  "token id 999999 is beyond vocab_size (128256)"},
        BadConfig{"not_json", "{", "[", "", "not valid JSON"}),
    [](const ::testing::TestParamInfo<BadConfig>& param_info) {
      return std::string(param_info.param.name);
    });

TEST(HfConfigTest, MissingFileIsNamed) {
  try {
    read_hf_config("/nonexistent/config.json");
    ADD_FAILURE() << "read a missing file";
  } catch (const HfConfigError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("/nonexistent/config.json"), std::string::npos) << message;
    EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;
  }
}

// Regression: a directory read as an empty file and was reported as "not valid JSON".
TEST(HfConfigTest, DirectoryIsRefusedAsADirectory) {
  const fs::path dir = write_config("directory", "{}").parent_path();
  try {
    read_hf_config(dir);
    ADD_FAILURE() << "read a directory";
  } catch (const HfConfigError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(dir.string()), std::string::npos) << message;
    EXPECT_NE(message.find("Is a directory"), std::string::npos) << message;
  }
  fs::remove_all(dir);
}

TEST(HfConfigTest, SeqLenBeyondMaxPositionsIsRefusedNamingTheKey) {
  const HfConfig c = parse_hf_config(kGpt2, "gpt2/config.json");
  try {
    DecoderModel model(c, {2048, 1, false});
    ADD_FAILURE() << "built a model past n_positions";
  } catch (const HfConfigError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("gpt2/config.json"), std::string::npos) << message;
    EXPECT_NE(message.find("max_position_embeddings"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace strata::llm
