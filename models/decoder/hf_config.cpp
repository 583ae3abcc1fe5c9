#include "models/decoder/hf_config.hpp"

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "io/io_error.hpp"
#include "io/whole_file.hpp"

namespace strata::llm {
namespace {

using Json = nlohmann::json;

// Reads typed keys from one config.json object; every failure names the file and the key.
class KeyReader {
 public:
  KeyReader(const Json& root, std::filesystem::path source)
      : root_(root), source_(std::move(source)) {}

  [[noreturn]] void fail(std::string_view key, std::string_view problem) const {
    throw HfConfigError(source_.string() + ": key \"" + std::string(key) + "\": " +
                        std::string(problem));
  }

  bool has(std::string_view key) const {
    const auto it = root_.find(key);
    return it != root_.end() && !it->is_null();
  }
  const Json& at(std::string_view key) const {
    if (!has(key)) fail(key, "missing (required for " + architecture_ + ")");
    return *root_.find(key);
  }

  std::uint32_t positive(std::string_view key) const { return positive(key, at(key)); }
  std::uint32_t positive_or(std::string_view key, std::uint32_t fallback) const {
    return has(key) ? positive(key, at(key)) : fallback;
  }
  std::uint32_t positive(std::string_view key, const Json& value) const {
    if (!value.is_number_integer() || value.get<std::int64_t>() <= 0 ||
        value.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max()) {
      fail(key, "expected a positive integer, got " + value.dump());
    }
    return value.get<std::uint32_t>();
  }
  double positive_real_or(std::string_view key, double fallback) const {
    if (!has(key)) return fallback;
    const Json& value = at(key);
    if (!value.is_number() || !(value.get<double>() > 0.0) || !std::isfinite(value.get<double>())) {
      fail(key, "expected a positive number, got " + value.dump());
    }
    return value.get<double>();
  }
  bool boolean_or(std::string_view key, bool fallback) const {
    if (!has(key)) return fallback;
    const Json& value = at(key);
    if (!value.is_boolean()) fail(key, "expected true or false, got " + value.dump());
    return value.get<bool>();
  }
  std::string string_or(std::string_view key, std::string fallback) const {
    if (!has(key)) return fallback;
    const Json& value = at(key);
    if (!value.is_string()) fail(key, "expected a string, got " + value.dump());
    return value.get<std::string>();
  }
  // One token id or a list of them (Llama 3.1's eos_token_id is a list), each below vocab_size.
  std::vector<std::int32_t> token_ids(std::string_view key, std::uint32_t vocab_size) const {
    std::vector<std::int32_t> ids;
    if (!has(key)) return ids;
    const Json& value = at(key);
    const auto add = [&](const Json& id) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
          id.get<std::int64_t>() > std::numeric_limits<std::int32_t>::max()) {
        fail(key, "expected a token id (a non-negative integer), got " + id.dump());
      }
      if (id.get<std::int64_t>() >= vocab_size) {
        fail(key, "token id " + id.dump() + " is beyond vocab_size (" +
                      std::to_string(vocab_size) + ")");
      }
      ids.push_back(id.get<std::int32_t>());
    };
    if (value.is_array()) {
      for (const Json& id : value) add(id);
    } else {
      add(value);
    }
    return ids;
  }

  void set_architecture(std::string architecture) { architecture_ = std::move(architecture); }

 private:
  const Json& root_;
  std::filesystem::path source_;
  std::string architecture_ = "this architecture";
};

Family family_of(const KeyReader& keys, const Json& root, std::string& architecture) {
  if (!root.contains("architectures")) keys.fail("architectures", "missing");
  const Json& list = root["architectures"];
  if (!list.is_array() || list.size() != 1 || !list[0].is_string()) {
    keys.fail("architectures", "expected a list of one architecture name, got " + list.dump());
  }
  architecture = list[0].get<std::string>();
  if (architecture == "LlamaForCausalLM") return Family::kLlama;
  if (architecture == "MistralForCausalLM") return Family::kMistral;
  if (architecture == "Qwen2ForCausalLM") return Family::kQwen2;
  if (architecture == "GPT2LMHeadModel") return Family::kGpt2;
  keys.fail("architectures",
            "\"" + architecture +
                "\" is not supported (supported: LlamaForCausalLM, MistralForCausalLM, "
                "Qwen2ForCausalLM, GPT2LMHeadModel)");
}

Activation activation_of(const KeyReader& keys, std::string_view key, const std::string& name) {
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  if (name == "gelu") return Activation::kGelu;
  keys.fail(key, "activation \"" + name +
                     "\" is not supported (supported: silu, swish, gelu, gelu_new, "
                     "gelu_pytorch_tanh)");
}

DType dtype_of(const KeyReader& keys) {
  // transformers 5 writes `dtype`, earlier versions `torch_dtype`.
  const char* key = keys.has("torch_dtype") ? "torch_dtype" : "dtype";
  const std::string name = keys.string_or(key, "float32");
  if (name == "float32") return DType::kFp32;
  if (name == "bfloat16") return DType::kBf16;
  if (name == "float16") return DType::kFp16;
  keys.fail(key, "\"" + name + "\" is not supported (supported: float32, bfloat16, float16)");
}

// rope_scaling: null, {"rope_type"/"type": "default"}, or Llama 3.1's {"rope_type": "llama3", ...}.
RopeScaling rope_scaling_of(const KeyReader& keys, const Json& root) {
  RopeScaling scaling;
  if (!keys.has("rope_scaling")) return scaling;
  const Json& value = root["rope_scaling"];
  if (!value.is_object()) keys.fail("rope_scaling", "expected an object, got " + value.dump());
  const auto fail = [&](std::string_view key, std::string_view problem) {
    keys.fail("rope_scaling." + std::string(key), problem);
  };
  const char* type_key = value.contains("rope_type") ? "rope_type" : "type";
  if (!value.contains(type_key) || !value[type_key].is_string()) {
    fail("rope_type", "missing or not a string");
  }
  const std::string type = value[type_key].get<std::string>();
  if (type == "default") return scaling;
  if (type != "llama3") {
    fail(type_key, "\"" + type + "\" is not supported (supported: llama3, default)");
  }
  scaling.type = RopeScaling::Type::kLlama3;
  const auto number = [&](const char* key) {
    if (!value.contains(key) || !value[key].is_number() || !(value[key].get<double>() > 0.0)) {
      fail(key, "expected a positive number for llama3 scaling, got " +
                    (value.contains(key) ? value[key].dump() : std::string("nothing")));
    }
    return value[key].get<double>();
  };
  scaling.factor = number("factor");
  scaling.low_freq_factor = number("low_freq_factor");
  scaling.high_freq_factor = number("high_freq_factor");
  if (!(scaling.high_freq_factor > scaling.low_freq_factor)) {
    fail("high_freq_factor", "must exceed low_freq_factor");
  }
  // Checked before the cast: converting a double beyond uint32's range is undefined behaviour.
  const char* original_key = "original_max_position_embeddings";
  const double original = number(original_key);
  if (original != std::floor(original) || original > std::numeric_limits<std::uint32_t>::max()) {
    fail(original_key, "expected an integer below 2^32, got " + value[original_key].dump());
  }
  scaling.original_max_position_embeddings = static_cast<std::uint32_t>(original);
  return scaling;
}

// Keys whose non-default values change the model in ways this decoder does not implement.
void refuse_unimplemented(const KeyReader& keys, Family family) {
  if (family == Family::kGpt2) {
    if (!keys.boolean_or("scale_attn_weights", true)) {
      keys.fail("scale_attn_weights", "false is not supported");
    }
    if (keys.boolean_or("scale_attn_by_inverse_layer_idx", false)) {
      keys.fail("scale_attn_by_inverse_layer_idx", "true is not supported");
    }
    return;
  }
  if (keys.boolean_or("attention_bias", false)) keys.fail("attention_bias", "true is not supported");
  if (keys.boolean_or("mlp_bias", false)) keys.fail("mlp_bias", "true is not supported");
  if (family == Family::kQwen2 && keys.boolean_or("use_sliding_window", false)) {
    keys.fail("use_sliding_window", "true is not supported (Qwen2's per-layer sliding window)");
  }
  if (keys.has("partial_rotary_factor") && keys.positive_real_or("partial_rotary_factor", 1) != 1) {
    keys.fail("partial_rotary_factor", "only 1.0 is supported");
  }
}

void read_gpt2(const KeyReader& keys, HfConfig& config) {
  config.hidden_size = keys.positive("n_embd");
  config.num_layers = keys.positive("n_layer");
  config.num_heads = keys.positive("n_head");
  config.num_kv_heads = config.num_heads;
  config.vocab_size = keys.positive("vocab_size");
  config.max_position_embeddings = keys.positive("n_positions");
  config.intermediate_size = keys.positive_or("n_inner", 4 * config.hidden_size);
  config.norm_eps = keys.positive_real_or("layer_norm_epsilon", 1e-5);
  config.activation =
      activation_of(keys, "activation_function", keys.string_or("activation_function", "gelu_new"));
  config.tie_word_embeddings = keys.boolean_or("tie_word_embeddings", true);
  if (!config.tie_word_embeddings) {
    keys.fail("tie_word_embeddings", "false is not supported for GPT2LMHeadModel");
  }
  config.attention_qkv_bias = true;
  config.attention_out_bias = true;
  config.mlp_bias = true;
  if (config.hidden_size % config.num_heads != 0) {
    keys.fail("n_head", "must divide n_embd (" + std::to_string(config.hidden_size) + ")");
  }
  config.head_dim = config.hidden_size / config.num_heads;
}

// HF's defaults per family for the keys a config.json may omit.
std::uint32_t default_max_positions(Family family) {
  switch (family) {
    case Family::kMistral:
      return 4096 * 32;
    case Family::kQwen2:
      return 32768;
    default:
      return 2048;
  }
}

void read_rope_decoder(const KeyReader& keys, const Json& root, HfConfig& config) {
  config.hidden_size = keys.positive("hidden_size");
  config.intermediate_size = keys.positive("intermediate_size");
  config.num_layers = keys.positive("num_hidden_layers");
  config.num_heads = keys.positive("num_attention_heads");
  config.num_kv_heads = keys.positive_or("num_key_value_heads", config.num_heads);
  config.vocab_size = keys.positive("vocab_size");
  config.max_position_embeddings =
      keys.positive_or("max_position_embeddings", default_max_positions(config.family));
  config.norm_eps = keys.positive_real_or("rms_norm_eps", 1e-6);
  config.rope_theta = keys.positive_real_or("rope_theta", 10000.0);
  config.rope_scaling = rope_scaling_of(keys, root);
  config.activation = activation_of(keys, "hidden_act", keys.string_or("hidden_act", "silu"));
  config.tie_word_embeddings = keys.boolean_or("tie_word_embeddings", false);
  config.attention_qkv_bias = config.family == Family::kQwen2;
  if (config.family == Family::kMistral && keys.has("sliding_window")) {
    config.sliding_window = keys.positive("sliding_window");
  }
  if (config.num_heads % config.num_kv_heads != 0) {
    keys.fail("num_key_value_heads", "must divide num_attention_heads (" +
                                         std::to_string(config.num_heads) + ")");
  }
  if (keys.has("head_dim")) {
    config.head_dim = keys.positive("head_dim");
  } else if (config.hidden_size % config.num_heads != 0) {
    keys.fail("num_attention_heads",
              "must divide hidden_size (" + std::to_string(config.hidden_size) +
                  ") when head_dim is absent");
  } else {
    config.head_dim = config.hidden_size / config.num_heads;
  }
  if (config.head_dim % 2 != 0) keys.fail("head_dim", "must be even (rotary embeddings)");
}

}  // namespace

std::string_view family_name(Family family) {
  switch (family) {
    case Family::kLlama:
      return "llama";
    case Family::kMistral:
      return "mistral";
    case Family::kQwen2:
      return "qwen2";
    case Family::kGpt2:
      return "gpt2";
  }
  return "unknown";
}

std::uint64_t HfConfig::parameter_count() const {
  const std::uint64_t d = hidden_size;
  const std::uint64_t inner = intermediate_size;
  const std::uint64_t q_width = std::uint64_t{num_heads} * head_dim;
  const std::uint64_t kv_width = std::uint64_t{num_kv_heads} * head_dim;
  std::uint64_t per_layer = 0;
  std::uint64_t count = std::uint64_t{vocab_size} * d;
  if (is_gpt2()) {
    count += std::uint64_t{max_position_embeddings} * d;
    // ln_1, ln_2 (weight + bias), c_attn, c_proj, c_fc, mlp.c_proj with their biases.
    per_layer = 4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * inner + inner) + (inner * d + d);
    count += 2 * d;  // ln_f
  } else {
    per_layer = 2 * d + d * q_width + 2 * d * kv_width + q_width * d + 3 * d * inner;
    if (attention_qkv_bias) per_layer += q_width + 2 * kv_width;
    count += d;  // model.norm
    if (!tie_word_embeddings) count += std::uint64_t{vocab_size} * d;
  }
  return count + per_layer * num_layers;
}

HfConfig parse_hf_config(std::string_view json, const std::filesystem::path& source) {
  Json root;
  try {
    root = Json::parse(json);
  } catch (const Json::parse_error& error) {
    throw HfConfigError(source.string() + ": not valid JSON: " + error.what());
  }
  KeyReader keys(root, source);
  if (!root.is_object()) throw HfConfigError(source.string() + ": expected a JSON object");
  HfConfig config;
  config.source = source;
  config.family = family_of(keys, root, config.architecture);
  keys.set_architecture(config.architecture);
  if (config.is_gpt2()) {
    read_gpt2(keys, config);
  } else {
    read_rope_decoder(keys, root, config);
  }
  refuse_unimplemented(keys, config.family);
  config.initializer_range = keys.positive_real_or("initializer_range", 0.02);
  config.torch_dtype = dtype_of(keys);
  config.bos_token_ids = keys.token_ids("bos_token_id", config.vocab_size);
  config.eos_token_ids = keys.token_ids("eos_token_id", config.vocab_size);
  return config;
}

HfConfig read_hf_config(const std::filesystem::path& config_json) {
  std::vector<std::uint8_t> bytes;
  try {
    bytes = io::read_file_bytes(config_json);
  } catch (const io::IoError& error) {
    throw HfConfigError(config_json.string() + ": " + error.what());
  }
  return parse_hf_config(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), config_json);
}

}  // namespace strata::llm
