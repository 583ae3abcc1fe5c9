// What a model registers with the Engine: units (gathered at once, typically one transformer
// block), each a list of named tensors with a shape and an initialiser.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::runtime {

enum class InitKind : std::uint8_t { kNormal, kZeros, kOnes };

struct TensorInit {
  InitKind kind = InitKind::kNormal;
  float std = 0.02f;  // kNormal: standard deviation (mean 0)

  static TensorInit normal(float std) { return {InitKind::kNormal, std}; }
  static TensorInit zeros() { return {InitKind::kZeros, 0.0f}; }
  static TensorInit ones() { return {InitKind::kOnes, 0.0f}; }
};

struct TensorSpec {
  std::string name;
  std::vector<std::uint64_t> shape;
  TensorInit init;
  // Whether [optimizer] weight_decay applies to this tensor. GPT-2 practice: matrices and
  // embeddings decay; biases and LayerNorm gains and biases do not.
  bool weight_decay = true;
  // With bf16 parameters, whether the Engine widens this tensor into the gathered unit's fp32
  // view. false: GatheredUnit::tensor() is empty for it and the model reads tensor_bf16() alone
  // (the CUDA decoder's bf16 products), so no gather spends a cast on it. Ignored with fp32 or
  // fp16 parameters (no bf16 view to read instead): every tensor has its fp32 view then.
  bool fp32_view = true;

  std::uint64_t numel() const {
    std::uint64_t count = 1;
    for (std::uint64_t extent : shape) count *= extent;
    return count;
  }
};

struct UnitSpec {
  std::string name;
  std::vector<TensorSpec> tensors;
};

}  // namespace strata::runtime
