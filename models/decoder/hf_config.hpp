// HfConfig: a Hugging Face `config.json` read into the one decoder that models/decoder implements,
// with switches per family. Supported architectures: LlamaForCausalLM (Llama 2, 3, 3.1, 3.2),
// MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel. Anything else, or a key value this
// decoder does not implement (an unknown hidden_act, a rope_scaling type other than "llama3"), is
// an HfConfigError naming the file and the key: never a silently different model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.hpp"

namespace strata::llm {

enum class Family : std::uint8_t { kLlama, kMistral, kQwen2, kGpt2 };
std::string_view family_name(Family family);  // "llama", "mistral", "qwen2", "gpt2"

// The MLP's activation (config.json `hidden_act` / GPT-2's `activation_function`).
enum class Activation : std::uint8_t {
  kSilu,      // "silu" / "swish": SwiGLU (gate_proj, up_proj, down_proj)
  kGeluTanh,  // "gelu_new" / "gelu_pytorch_tanh": GPT-2's tanh approximation
  kGelu,      // "gelu": the exact erf form
};

struct RopeScaling {
  enum class Type : std::uint8_t { kNone, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::uint32_t original_max_position_embeddings = 8192;
};

struct HfConfig {
  std::filesystem::path source;  // the config.json it was read from ("<string>" if parsed)
  std::string architecture;      // e.g. "LlamaForCausalLM"
  Family family = Family::kLlama;

  std::uint32_t hidden_size = 0;
  std::uint32_t intermediate_size = 0;  // GPT-2: n_inner, or 4 × n_embd when null
  std::uint32_t num_layers = 0;
  std::uint32_t num_heads = 0;
  std::uint32_t num_kv_heads = 0;  // = num_heads when absent (multi-head attention)
  std::uint32_t head_dim = 0;      // = hidden_size / num_heads when absent
  std::uint32_t vocab_size = 0;
  std::uint32_t max_position_embeddings = 0;  // GPT-2: n_positions

  // Normalisation: RMSNorm for Llama / Mistral / Qwen2, LayerNorm (with bias) for GPT-2.
  double norm_eps = 1e-6;  // rms_norm_eps, or GPT-2's layer_norm_epsilon
  // Rotary position embeddings in HF's rotate-half layout (not GPT-2: learned positions).
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;

  Activation activation = Activation::kSilu;
  bool tie_word_embeddings = false;
  bool attention_qkv_bias = false;  // Qwen2: q/k/v projections carry biases; GPT-2: every linear
  bool attention_out_bias = false;  // GPT-2 only
  bool mlp_bias = false;            // GPT-2 only
  // Mistral's sliding window: each position attends to at most this many positions (itself
  // included). Absent or null: full causal attention.
  std::optional<std::uint32_t> sliding_window;
  // Standard deviation of the normal initialiser for matrices and embeddings (training from
  // scratch only; a checkpoint brings its own values).
  double initializer_range = 0.02;

  // Element type of the checkpoint's tensors (config.json `torch_dtype`; exports default to bf16):
  // one of the floating DTypes.
  DType torch_dtype = DType::kFp32;
  std::vector<std::int32_t> bos_token_ids;  // config.json may give one id or a list
  std::vector<std::int32_t> eos_token_ids;

  bool is_gpt2() const { return family == Family::kGpt2; }
  std::uint64_t parameter_count() const;
  bool operator==(const HfConfig&) const = default;
};

// Names the file and the key (and what was expected) in what().
class HfConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

HfConfig read_hf_config(const std::filesystem::path& config_json);
HfConfig parse_hf_config(std::string_view json, const std::filesystem::path& source = "<string>");

}  // namespace strata::llm
