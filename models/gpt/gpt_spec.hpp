// The GPT-2 decoder's parameters as the ZeRO-3 Engine sees them: an ordered list of units, each an
// ordered list of tensor specs (name, shape, initialiser). The model owns no parameters; whoever
// holds them (ParameterStore, the Engine) lays each unit out as these tensors, in this order.
//
// Units, in forward order:
//   0            "embed"    wte.weight [vocab, d], wpe.weight [seq_len, d]
//   1 .. layers  "h.{i}"    one pre-LayerNorm transformer block (12 tensors, below)
//   layers + 1   "head"     ln_f.weight, ln_f.bias [d] (+ lm_head.weight [vocab, d] when untied)
// Tensor names follow Hugging Face GPT-2 (Conv1D weights are [in, out]: y = x·W + b); see
// docs/gpt.md. With a tied head the head unit reads wte.weight from the embedding unit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/config/config.hpp"

namespace strata::gpt {

enum class InitKind { kNormal, kZeros, kOnes };

struct TensorSpec {
  std::string name;                // e.g. "h.3.attn.c_attn.weight"
  std::vector<std::size_t> shape;  // row-major
  InitKind init = InitKind::kZeros;
  float init_std = 0.0f;   // kNormal only: N(0, init_std²)
  std::size_t offset = 0;  // elements from the start of the unit's flat buffer
  // [optimizer] weight_decay applies (runtime::TensorSpec::weight_decay): matrices and embeddings
  // only, never biases or LayerNorm gains and biases, as GPT-2 and nanoGPT train.
  bool weight_decay = true;

  std::size_t numel() const;
};

enum class UnitKind { kEmbedding, kBlock, kHead };

struct UnitSpec {
  std::string name;  // "embed", "h.{i}", "head"
  UnitKind kind = UnitKind::kBlock;
  std::uint32_t layer = 0;  // kBlock only
  std::vector<TensorSpec> tensors;
  std::size_t numel = 0;  // sum of the tensors' numel; the flat buffer's length
  // true for the head unit of a tied model: its forward and backward also read the embedding
  // unit's parameters (wte), so the caller passes them as `shared` (see GptModel).
  bool reads_embedding = false;
};

// Tensor order inside a block unit (indices into UnitSpec::tensors).
enum BlockTensor : std::size_t {
  kLn1Weight,
  kLn1Bias,
  kAttnWeight,
  kAttnBias,
  kAttnProjWeight,
  kAttnProjBias,
  kLn2Weight,
  kLn2Bias,
  kFcWeight,
  kFcBias,
  kMlpProjWeight,
  kMlpProjBias,
  kBlockTensorCount
};
enum EmbeddingTensor : std::size_t { kTokenEmbedding, kPositionEmbedding };
enum HeadTensor : std::size_t { kLnfWeight, kLnfBias, kLmHeadWeight };

// Checks the shape (heads divide d_model, all sizes non-zero) and returns the units. Throws
// std::invalid_argument naming the bad field.
std::vector<UnitSpec> gpt_units(const runtime::ModelConfig& config);

// Fills `values` (elements [first_element, ...) of tensor `spec` of unit `unit_name`) with the
// spec's initialiser: runtime::init_tensor_range, the Engine's own, so a ParameterStore and an
// Engine rank initialising only its shard produce the same bits, on every platform.
void initialize_tensor(std::string_view unit_name, const TensorSpec& spec, std::uint64_t seed,
                       std::span<float> values, std::size_t first_element = 0);

// Fills `values` = elements [first_element, first_element + values.size()) of the unit's flat
// buffer, whichever tensors that range crosses: what a ZeRO-3 rank initialising only its shard of
// the unit calls. The bits equal those of initialising the whole unit.
void initialize_unit_range(const UnitSpec& unit, std::uint64_t seed, std::span<float> values,
                           std::size_t first_element);

// Splits a unit's flat buffer into one span per tensor, in spec order.
std::vector<std::span<const float>> split_unit(const UnitSpec& unit, std::span<const float> flat);
std::vector<std::span<float>> split_unit(const UnitSpec& unit, std::span<float> flat);

}  // namespace strata::gpt
