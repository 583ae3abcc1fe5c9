#include "models/gpt/gpt_spec.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "base/assert.hpp"
#include "runtime/engine/param_init.hpp"

namespace strata::gpt {
namespace {

constexpr float kInitStd = 0.02f;

void add_tensor(UnitSpec& unit, std::string name, std::vector<std::size_t> shape, InitKind init,
                float init_std = 0.0f) {
  // Every tensor of rank >= 2 is a matrix or an embedding; the vectors are biases and LayerNorm
  // parameters, which weight decay would only pull towards zero (or a gain of 0).
  const bool weight_decay = shape.size() >= 2;
  TensorSpec spec{std::move(name), std::move(shape), init, init_std, unit.numel, weight_decay};
  unit.numel += spec.numel();
  unit.tensors.push_back(std::move(spec));
}

void require_positive(std::uint32_t value, const char* field) {
  if (value == 0) {
    throw std::invalid_argument(std::string("GPT model: ") + field + " must be positive");
  }
}

}  // namespace

std::size_t TensorSpec::numel() const {
  std::size_t count = 1;
  for (const std::size_t dim : shape) {
    count *= dim;
  }
  return count;
}

std::vector<UnitSpec> gpt_units(const runtime::ModelConfig& config) {
  require_positive(config.layers, "layers");
  require_positive(config.d_model, "d_model");
  require_positive(config.heads, "heads");
  require_positive(config.seq_len, "seq_len");
  require_positive(config.vocab, "vocab");
  if (config.d_model % config.heads != 0) {
    throw std::invalid_argument("GPT model: heads (" + std::to_string(config.heads) +
                                ") must divide d_model (" + std::to_string(config.d_model) + ")");
  }
  const std::size_t d = config.d_model;
  const std::size_t vocab = config.vocab;
  // GPT-2: residual projections start smaller so the residual stream's variance does not grow
  // with depth (two projections per block add to it).
  const float residual_std = kInitStd / std::sqrt(2.0f * static_cast<float>(config.layers));

  std::vector<UnitSpec> units;
  units.reserve(config.layers + 2);

  UnitSpec embed;
  embed.name = "embed";
  embed.kind = UnitKind::kEmbedding;
  add_tensor(embed, "wte.weight", {vocab, d}, InitKind::kNormal, kInitStd);
  add_tensor(embed, "wpe.weight", {config.seq_len, d}, InitKind::kNormal, kInitStd);
  units.push_back(std::move(embed));

  for (std::uint32_t layer = 0; layer < config.layers; ++layer) {
    const std::string prefix = "h." + std::to_string(layer) + ".";
    UnitSpec block;
    block.name = "h." + std::to_string(layer);
    block.kind = UnitKind::kBlock;
    block.layer = layer;
    add_tensor(block, prefix + "ln_1.weight", {d}, InitKind::kOnes);
    add_tensor(block, prefix + "ln_1.bias", {d}, InitKind::kZeros);
    add_tensor(block, prefix + "attn.c_attn.weight", {d, 3 * d}, InitKind::kNormal, kInitStd);
    add_tensor(block, prefix + "attn.c_attn.bias", {3 * d}, InitKind::kZeros);
    add_tensor(block, prefix + "attn.c_proj.weight", {d, d}, InitKind::kNormal, residual_std);
    add_tensor(block, prefix + "attn.c_proj.bias", {d}, InitKind::kZeros);
    add_tensor(block, prefix + "ln_2.weight", {d}, InitKind::kOnes);
    add_tensor(block, prefix + "ln_2.bias", {d}, InitKind::kZeros);
    add_tensor(block, prefix + "mlp.c_fc.weight", {d, 4 * d}, InitKind::kNormal, kInitStd);
    add_tensor(block, prefix + "mlp.c_fc.bias", {4 * d}, InitKind::kZeros);
    add_tensor(block, prefix + "mlp.c_proj.weight", {4 * d, d}, InitKind::kNormal, residual_std);
    add_tensor(block, prefix + "mlp.c_proj.bias", {d}, InitKind::kZeros);
    STRATA_ASSERT(block.tensors.size() == kBlockTensorCount);
    units.push_back(std::move(block));
  }

  UnitSpec head;
  head.name = "head";
  head.kind = UnitKind::kHead;
  head.reads_embedding = config.tied_head;
  add_tensor(head, "ln_f.weight", {d}, InitKind::kOnes);
  add_tensor(head, "ln_f.bias", {d}, InitKind::kZeros);
  if (!config.tied_head) {
    add_tensor(head, "lm_head.weight", {vocab, d}, InitKind::kNormal, kInitStd);
  }
  units.push_back(std::move(head));
  return units;
}

void initialize_tensor(std::string_view unit_name, const TensorSpec& spec, std::uint64_t seed,
                       std::span<float> values, std::size_t first_element) {
  STRATA_ASSERT(first_element + values.size() <= spec.numel());
  // The Engine's own initialiser: the same (seed, unit, tensor, element) gives the same bits
  // whether a ParameterStore fills the whole model or an Engine rank fills only its shard.
  runtime::TensorSpec engine_spec;
  engine_spec.name = spec.name;
  engine_spec.shape.assign(spec.shape.begin(), spec.shape.end());
  switch (spec.init) {
    case InitKind::kNormal:
      engine_spec.init = runtime::TensorInit::normal(spec.init_std);
      break;
    case InitKind::kZeros:
      engine_spec.init = runtime::TensorInit::zeros();
      break;
    case InitKind::kOnes:
      engine_spec.init = runtime::TensorInit::ones();
      break;
  }
  runtime::init_tensor_range(seed, unit_name, engine_spec, first_element, values);
}

void initialize_unit_range(const UnitSpec& unit, std::uint64_t seed, std::span<float> values,
                           std::size_t first_element) {
  STRATA_ASSERT(first_element + values.size() <= unit.numel);
  const std::size_t range_end = first_element + values.size();
  for (const TensorSpec& tensor : unit.tensors) {
    const std::size_t begin = std::max(first_element, tensor.offset);
    const std::size_t end = std::min(range_end, tensor.offset + tensor.numel());
    if (begin < end) {
      initialize_tensor(unit.name, tensor, seed, values.subspan(begin - first_element, end - begin),
                        begin - tensor.offset);
    }
  }
}

std::vector<std::span<const float>> split_unit(const UnitSpec& unit, std::span<const float> flat) {
  STRATA_ASSERT(flat.size() == unit.numel);
  std::vector<std::span<const float>> views;
  views.reserve(unit.tensors.size());
  for (const TensorSpec& tensor : unit.tensors) {
    views.push_back(flat.subspan(tensor.offset, tensor.numel()));
  }
  return views;
}

std::vector<std::span<float>> split_unit(const UnitSpec& unit, std::span<float> flat) {
  STRATA_ASSERT(flat.size() == unit.numel);
  std::vector<std::span<float>> views;
  views.reserve(unit.tensors.size());
  for (const TensorSpec& tensor : unit.tensors) {
    views.push_back(flat.subspan(tensor.offset, tensor.numel()));
  }
  return views;
}

}  // namespace strata::gpt
