// decoder_units(): the parameter layout of each family, named as its Hugging Face checkpoint is.
#include <string>

#include "base/assert.hpp"
#include "models/decoder/decoder_layout.hpp"
#include "models/decoder/decoder_model.hpp"

namespace strata::llm {
namespace {

class UnitBuilder {
 public:
  UnitBuilder(std::string name, UnitKind kind, std::string hf_prefix, float init_std)
      : hf_prefix_(std::move(hf_prefix)), init_std_(init_std) {
    unit_.name = std::move(name);
    unit_.kind = kind;
  }

  // Matrices and embeddings: normal(initializer_range), decayed. `hf_name` overrides the
  // checkpoint name (lm_head.weight lives outside the model's prefix).
  void matrix(const std::string& name, std::size_t rows, std::size_t cols,
              const std::string& hf_name = "") {
    add(name, {rows, cols}, runtime::TensorInit::normal(init_std_), hf_name);
  }
  // Norm gains start at 1, biases at 0; neither is decayed (decay would pull a gain to 0).
  void gain(const std::string& name, std::size_t size) {
    add(name, {size}, runtime::TensorInit::ones());
  }
  void bias(const std::string& name, std::size_t size) {
    add(name, {size}, runtime::TensorInit::zeros());
  }

  UnitSpec take() { return std::move(unit_); }
  UnitSpec& unit() { return unit_; }

 private:
  void add(const std::string& name, std::vector<std::size_t> shape, runtime::TensorInit init,
           const std::string& hf_name = "") {
    TensorSpec spec;
    spec.name = name;
    spec.hf_name = hf_name.empty() ? hf_prefix_ + name : hf_name;
    spec.shape = std::move(shape);
    spec.init = init;
    spec.weight_decay = spec.shape.size() >= 2;
    spec.offset = unit_.numel;
    unit_.numel += spec.numel();
    unit_.tensors.push_back(std::move(spec));
  }

  UnitSpec unit_;
  std::string hf_prefix_;
  float init_std_;
};

void require(bool condition, const HfConfig& config, const std::string& key,
             const std::string& problem) {
  if (!condition) {
    throw HfConfigError(config.source.string() + ": key \"" + key + "\": " + problem);
  }
}

void check_shape(const HfConfig& c) {
  require(c.hidden_size > 0, c, "hidden_size", "must be positive");
  require(c.intermediate_size > 0, c, "intermediate_size", "must be positive");
  require(c.num_layers > 0, c, "num_hidden_layers", "must be positive");
  require(c.num_heads > 0 && c.head_dim > 0, c, "num_attention_heads", "must be positive");
  require(c.num_kv_heads > 0 && c.num_heads % c.num_kv_heads == 0, c, "num_key_value_heads",
          "must divide num_attention_heads");
  require(c.vocab_size > 0, c, "vocab_size", "must be positive");
  require(c.max_position_embeddings > 0, c, "max_position_embeddings", "must be positive");
  if (c.is_gpt2()) {
    require(c.num_heads * c.head_dim == c.hidden_size && c.num_kv_heads == c.num_heads, c,
            "n_head", "GPT-2 heads must tile n_embd");
    require(c.tie_word_embeddings, c, "tie_word_embeddings", "GPT-2's head is tied");
  } else {
    require(c.head_dim % 2 == 0, c, "head_dim", "must be even (rotary embeddings)");
  }
}

UnitSpec gpt2_layer(const HfConfig& c, std::uint32_t layer, float init_std) {
  const std::size_t d = c.hidden_size;
  const std::size_t inner = c.intermediate_size;
  UnitBuilder b("layers." + std::to_string(layer), UnitKind::kLayer,
                "transformer.h." + std::to_string(layer) + ".", init_std);
  b.gain("ln_1.weight", d);
  b.bias("ln_1.bias", d);
  b.matrix("attn.c_attn.weight", d, 3 * d);
  b.bias("attn.c_attn.bias", 3 * d);
  b.matrix("attn.c_proj.weight", d, d);
  b.bias("attn.c_proj.bias", d);
  b.gain("ln_2.weight", d);
  b.bias("ln_2.bias", d);
  b.matrix("mlp.c_fc.weight", d, inner);
  b.bias("mlp.c_fc.bias", inner);
  b.matrix("mlp.c_proj.weight", inner, d);
  b.bias("mlp.c_proj.bias", d);
  b.unit().layer = layer;
  return b.take();
}

UnitSpec rope_layer(const HfConfig& c, std::uint32_t layer, float init_std) {
  const std::size_t d = c.hidden_size;
  const std::size_t q_width = std::size_t{c.num_heads} * c.head_dim;
  const std::size_t kv_width = std::size_t{c.num_kv_heads} * c.head_dim;
  const std::size_t inner = c.intermediate_size;
  UnitBuilder b("layers." + std::to_string(layer), UnitKind::kLayer,
                "model.layers." + std::to_string(layer) + ".", init_std);
  b.gain("input_layernorm.weight", d);
  const struct {
    const char* name;
    std::size_t width;
  } projections[] = {{"q_proj", q_width}, {"k_proj", kv_width}, {"v_proj", kv_width}};
  for (const auto& projection : projections) {
    b.matrix(std::string("self_attn.") + projection.name + ".weight", projection.width, d);
    if (c.attention_qkv_bias) {
      b.bias(std::string("self_attn.") + projection.name + ".bias", projection.width);
    }
  }
  b.matrix("self_attn.o_proj.weight", d, q_width);
  b.gain("post_attention_layernorm.weight", d);
  b.matrix("mlp.gate_proj.weight", inner, d);
  b.matrix("mlp.up_proj.weight", inner, d);
  b.matrix("mlp.down_proj.weight", d, inner);
  b.unit().layer = layer;
  return b.take();
}

// split_unit for parameters (const) and gradients alike.
template <typename Element>
std::vector<std::span<Element>> split_flat(const UnitSpec& unit, std::span<Element> flat) {
  STRATA_ASSERT(flat.size() == unit.numel, "flat buffer of the unit's size");
  std::vector<std::span<Element>> views;
  views.reserve(unit.tensors.size());
  for (const TensorSpec& tensor : unit.tensors) {
    views.push_back(flat.subspan(tensor.offset, tensor.numel()));
  }
  return views;
}

}  // namespace

std::size_t TensorSpec::numel() const {
  std::size_t count = 1;
  for (const std::size_t extent : shape) count *= extent;
  return count;
}

std::vector<UnitSpec> decoder_units(const HfConfig& config) {
  check_shape(config);
  const auto init_std = static_cast<float>(config.initializer_range);
  const std::size_t d = config.hidden_size;
  const std::size_t vocab = config.vocab_size;
  const bool gpt2 = config.is_gpt2();
  std::vector<UnitSpec> units;
  units.reserve(config.num_layers + 2);

  UnitBuilder embed("embed", UnitKind::kEmbedding, gpt2 ? "transformer." : "model.", init_std);
  if (gpt2) {
    embed.matrix("wte.weight", vocab, d);
    embed.matrix("wpe.weight", config.max_position_embeddings, d);
  } else {
    embed.matrix("embed_tokens.weight", vocab, d);
  }
  units.push_back(embed.take());

  for (std::uint32_t layer = 0; layer < config.num_layers; ++layer) {
    units.push_back(gpt2 ? gpt2_layer(config, layer, init_std)
                         : rope_layer(config, layer, init_std));
  }

  UnitBuilder head("head", UnitKind::kHead, gpt2 ? "transformer." : "model.", init_std);
  if (gpt2) {
    head.gain("ln_f.weight", d);
    head.bias("ln_f.bias", d);
  } else {
    head.gain("norm.weight", d);
  }
  if (!config.tie_word_embeddings) head.matrix("lm_head.weight", vocab, d, "lm_head.weight");
  head.unit().reads_embedding = config.tie_word_embeddings;
  units.push_back(head.take());
  return units;
}

runtime::UnitSpec engine_unit(const UnitSpec& unit) {
  runtime::UnitSpec engine;
  engine.name = unit.name;
  for (const TensorSpec& tensor : unit.tensors) {
    runtime::TensorSpec spec;
    spec.name = tensor.name;
    spec.shape.assign(tensor.shape.begin(), tensor.shape.end());
    spec.init = tensor.init;
    spec.weight_decay = tensor.weight_decay;
    engine.tensors.push_back(std::move(spec));
  }
  return engine;
}

std::vector<std::span<const float>> split_unit(const UnitSpec& unit, std::span<const float> flat) {
  return split_flat(unit, flat);
}

std::vector<std::span<float>> split_unit(const UnitSpec& unit, std::span<float> flat) {
  return split_flat(unit, flat);
}

std::vector<std::span<const std::uint16_t>> split_unit(const UnitSpec& unit,
                                                       std::span<const std::uint16_t> flat) {
  return split_flat(unit, flat);
}

namespace detail {

std::size_t tensor_index(const UnitSpec& unit, std::string_view name) {
  for (std::size_t i = 0; i < unit.tensors.size(); ++i) {
    if (unit.tensors[i].name == name) return i;
  }
  return kAbsent;
}

LayerLayout layer_layout(const UnitSpec& u) {
  LayerLayout l;
  const bool gpt2 = tensor_index(u, "ln_1.weight") != kAbsent;
  if (gpt2) {
    l.norm1_weight = tensor_index(u, "ln_1.weight");
    l.norm1_bias = tensor_index(u, "ln_1.bias");
    l.qkv_weight = tensor_index(u, "attn.c_attn.weight");
    l.qkv_bias = tensor_index(u, "attn.c_attn.bias");
    l.out_weight = tensor_index(u, "attn.c_proj.weight");
    l.out_bias = tensor_index(u, "attn.c_proj.bias");
    l.norm2_weight = tensor_index(u, "ln_2.weight");
    l.norm2_bias = tensor_index(u, "ln_2.bias");
    l.fc_weight = tensor_index(u, "mlp.c_fc.weight");
    l.fc_bias = tensor_index(u, "mlp.c_fc.bias");
    l.proj_weight = tensor_index(u, "mlp.c_proj.weight");
    l.proj_bias = tensor_index(u, "mlp.c_proj.bias");
    return l;
  }
  l.norm1_weight = tensor_index(u, "input_layernorm.weight");
  l.q_weight = tensor_index(u, "self_attn.q_proj.weight");
  l.q_bias = tensor_index(u, "self_attn.q_proj.bias");
  l.k_weight = tensor_index(u, "self_attn.k_proj.weight");
  l.k_bias = tensor_index(u, "self_attn.k_proj.bias");
  l.v_weight = tensor_index(u, "self_attn.v_proj.weight");
  l.v_bias = tensor_index(u, "self_attn.v_proj.bias");
  l.o_weight = tensor_index(u, "self_attn.o_proj.weight");
  l.norm2_weight = tensor_index(u, "post_attention_layernorm.weight");
  l.gate_weight = tensor_index(u, "mlp.gate_proj.weight");
  l.up_weight = tensor_index(u, "mlp.up_proj.weight");
  l.down_weight = tensor_index(u, "mlp.down_proj.weight");
  return l;
}

HeadLayout head_layout(const UnitSpec& u) {
  HeadLayout h;
  const bool gpt2 = tensor_index(u, "ln_f.weight") != kAbsent;
  h.norm_weight = tensor_index(u, gpt2 ? "ln_f.weight" : "norm.weight");
  h.norm_bias = gpt2 ? tensor_index(u, "ln_f.bias") : kAbsent;
  h.lm_head = tensor_index(u, "lm_head.weight");
  return h;
}

}  // namespace detail
}  // namespace strata::llm
