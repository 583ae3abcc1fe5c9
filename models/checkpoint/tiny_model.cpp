#include "models/checkpoint/tiny_model.hpp"

#include <cmath>

#include <nlohmann/json.hpp>

#include "io/whole_file.hpp"
#include "models/decoder/decoder_model.hpp"
#include "models/checkpoint/hf_export.hpp"

namespace strata::llm {
namespace {

using nlohmann::ordered_json;

constexpr std::uint32_t kByteSymbols = 256;
const char* const kMerges[][2] = {{"Ġ", "t"}, {"h", "e"},  {"i", "n"}, {"Ġt", "he"}, {"e", "r"},
                                  {"a", "n"}, {"o", "n"},  {"Ġ", "a"}, {"r", "e"},   {"Ġ", "s"}};
constexpr std::uint32_t kMergeCount = sizeof(kMerges) / sizeof(kMerges[0]);

struct Specials {
  std::vector<std::string> tokens;
  std::string bos;  // empty: none
  std::string eos;
};

Specials specials_of(Family family) {
  switch (family) {
    case Family::kLlama:
      return {{"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
               "<|eot_id|>"},
              "<|begin_of_text|>",
              "<|end_of_text|>"};
    case Family::kQwen2:
      return {{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}, "", "<|endoftext|>"};
    case Family::kMistral:
      return {{"<unk>", "<s>", "</s>"}, "<s>", "</s>"};
    case Family::kGpt2:
      return {{"<|endoftext|>"}, "<|endoftext|>", "<|endoftext|>"};
  }
  return {};
}

std::int32_t special_id(Family family, const std::string& token) {
  const Specials specials = specials_of(family);
  for (std::size_t i = 0; i < specials.tokens.size(); ++i) {
    if (specials.tokens[i] == token) return static_cast<std::int32_t>(kByteSymbols + kMergeCount + i);
  }
  return -1;
}

// GPT-2's byte-to-symbol table: printable bytes stand for themselves, the others map to U+0100..
std::string byte_symbol(std::uint32_t byte) {
  const bool printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) ||
                         (byte >= 174 && byte <= 255);
  std::uint32_t code = byte;
  if (!printable) {
    std::uint32_t shift = 0;
    for (std::uint32_t b = 0; b < byte; ++b) {
      if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) ++shift;
    }
    code = 256 + shift;
  }
  std::string utf8;
  if (code < 0x80) {
    utf8 += static_cast<char>(code);
  } else {
    utf8 += static_cast<char>(0xc0 | (code >> 6));
    utf8 += static_cast<char>(0x80 | (code & 0x3f));
  }
  return utf8;
}

ordered_json byte_level(bool add_prefix_space) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", add_prefix_space},
          {"trim_offsets", true},
          {"use_regex", true}};
}

ordered_json post_processor(Family family) {
  const Specials specials = specials_of(family);
  if (specials.bos.empty() || family == Family::kGpt2) return byte_level(false);
  const std::int32_t bos = special_id(family, specials.bos);
  const ordered_json bos_piece = {{"SpecialToken", {{"id", specials.bos}, {"type_id", 0}}}};
  return {{"type", "TemplateProcessing"},
          {"single", {bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
          {"pair",
           {bos_piece,
            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
            bos_piece,
            {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
          {"special_tokens",
           {{specials.bos, {{"id", specials.bos}, {"ids", {bos}}, {"tokens", {specials.bos}}}}}}};
}

// A counter-based normal draw: element `index` of the tensor numbered `tensor`.
float normal_at(std::uint64_t seed, std::uint64_t tensor, std::uint64_t index) {
  const auto mix = [](std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  const std::uint64_t key = mix(seed * 0x9e3779b97f4a7c15ull + tensor * 0x632be59bd9b4e019ull +
                                index * 2 + 1);
  const double u1 = (static_cast<double>(key >> 11) + 0.5) * 0x1p-53;
  const double u2 = static_cast<double>(mix(key) >> 11) * 0x1p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}

}  // namespace

std::uint32_t tiny_tokenizer_size(Family family) {
  return kByteSymbols + kMergeCount + static_cast<std::uint32_t>(specials_of(family).tokens.size());
}

std::uint32_t tiny_vocab_size(Family family) {
  return (tiny_tokenizer_size(family) + 7) / 8 * 8;
}

std::string tiny_tokenizer_json(Family family) {
  ordered_json vocab = ordered_json::object();
  for (std::uint32_t byte = 0; byte < kByteSymbols; ++byte) vocab[byte_symbol(byte)] = byte;
  ordered_json merges = ordered_json::array();
  for (std::uint32_t m = 0; m < kMergeCount; ++m) {
    vocab[std::string(kMerges[m][0]) + kMerges[m][1]] = kByteSymbols + m;
    merges.push_back(std::string(kMerges[m][0]) + " " + kMerges[m][1]);
  }
  ordered_json added = ordered_json::array();
  const Specials specials = specials_of(family);
  for (const std::string& token : specials.tokens) {
    added.push_back({{"id", special_id(family, token)},
                     {"content", token},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const ordered_json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", byte_level(false)},
      {"post_processor", post_processor(family)},
      {"decoder", byte_level(true)},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", merges}}}};
  return tokenizer.dump(2) + "\n";
}

std::string tiny_tokenizer_config_json(Family family) {
  const Specials specials = specials_of(family);
  ordered_json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                         {"bos_token", specials.bos.empty() ? ordered_json(nullptr)
                                                            : ordered_json(specials.bos)},
                         {"eos_token", specials.eos}};
  return config.dump(2) + "\n";
}

std::string tiny_config_json(const TinyModelOptions& options) {
  const Family family = options.family;
  const Specials specials = specials_of(family);
  const std::int32_t eos = special_id(family, specials.eos);
  const ordered_json bos =
      specials.bos.empty() ? ordered_json(nullptr) : ordered_json(special_id(family, specials.bos));
  const char* dtype = options.dtype == DType::kBf16   ? "bfloat16"
                      : options.dtype == DType::kFp16 ? "float16"
                                                               : "float32";
  ordered_json config;
  if (family == Family::kGpt2) {
    config = {{"architectures", {"GPT2LMHeadModel"}},
              {"model_type", "gpt2"},
              {"n_embd", options.hidden_size},
              {"n_layer", options.layers},
              {"n_head", options.heads},
              {"n_positions", options.max_positions},
              {"n_inner", nullptr},
              {"activation_function", "gelu_new"},
              {"layer_norm_epsilon", 1e-5},
              {"vocab_size", tiny_vocab_size(family)},
              {"bos_token_id", bos},
              {"eos_token_id", eos},
              {"tie_word_embeddings", true},
              {"torch_dtype", dtype}};
    return config.dump(2) + "\n";
  }
  const char* architecture = family == Family::kLlama     ? "LlamaForCausalLM"
                             : family == Family::kQwen2   ? "Qwen2ForCausalLM"
                                                          : "MistralForCausalLM";
  config = {{"architectures", {architecture}},
            {"model_type", std::string(family_name(family))},
            {"hidden_size", options.hidden_size},
            {"intermediate_size", options.intermediate_size},
            {"num_hidden_layers", options.layers},
            {"num_attention_heads", options.heads},
            {"num_key_value_heads", options.kv_heads},
            {"hidden_act", "silu"},
            {"max_position_embeddings", options.max_positions},
            {"rms_norm_eps", 1e-5},
            {"vocab_size", tiny_vocab_size(family)},
            {"bos_token_id", bos},
            {"eos_token_id", eos},
            {"tie_word_embeddings", family == Family::kQwen2},
            {"torch_dtype", dtype}};
  if (family == Family::kLlama) {
    config["rope_theta"] = 500000.0;
    config["rope_scaling"] = {{"rope_type", "llama3"},
                              {"factor", 8.0},
                              {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 64}};
    config["attention_bias"] = false;
    config["mlp_bias"] = false;
  } else if (family == Family::kQwen2) {
    config["rope_theta"] = 1000000.0;
  } else {
    config["rope_theta"] = 10000.0;
    config["sliding_window"] = 4096;
  }
  return config.dump(2) + "\n";
}

void write_tiny_model(const std::filesystem::path& dir, const TinyModelOptions& options) {
  std::filesystem::create_directories(dir);
  io::write_file_atomically(dir / "config.json", tiny_config_json(options));
  io::write_file_atomically(dir / "tokenizer.json", tiny_tokenizer_json(options.family));
  io::write_file_atomically(dir / "tokenizer_config.json", tiny_tokenizer_config_json(options.family));
  const HfConfig config = read_hf_config(dir / "config.json");
  const std::vector<UnitSpec> units = decoder_units(config);
  ExportOptions export_options;
  export_options.dtype = options.dtype;
  export_options.max_shard_bytes = options.max_shard_bytes;
  export_options.gpt2_prefix_stripped = options.gpt2_prefix_stripped;
  HfExportWriter writer(dir, units, export_options);
  std::uint64_t tensor_number = 0;
  std::vector<float> values;
  for (std::size_t u = 0; u < units.size(); ++u) {
    values.assign(units[u].numel, 0.0f);
    for (const TensorSpec& spec : units[u].tensors) {
      ++tensor_number;
      // Every tensor random (norm gains around 1, biases small but non-zero) so that a loader
      // swapping or dropping any of them changes the model's output.
      const float std_dev = spec.init.kind == runtime::InitKind::kNormal ? spec.init.std : 0.05f;
      const float mean = spec.init.kind == runtime::InitKind::kOnes ? 1.0f : 0.0f;
      for (std::size_t i = 0; i < spec.numel(); ++i) {
        values[spec.offset + i] = mean + std_dev * normal_at(options.seed, tensor_number, i);
      }
    }
    writer.write_unit(u, values);
  }
  writer.finish();
}

}  // namespace strata::llm
