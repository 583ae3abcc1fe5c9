// HostWeights: every unit of a model folder's checkpoint in host memory as fp32 (strata-eval,
// strata-generate and tests: inference without an Engine; host memory O(model)), and the loops
// that run a DecoderModel's forward or decoding step over them, unit by unit.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <vector>

#include "examples/llm/decoder_model.hpp"

namespace strata::llm {

class HostWeights {
 public:
  // The checkpoint of `model_dir`, checked against `units` (CheckpointError naming the tensor
  // and the file otherwise).
  static HostWeights load(const std::filesystem::path& model_dir,
                          const std::vector<UnitSpec>& units);
  // Filled from flat unit buffers (tests).
  HostWeights(const std::vector<UnitSpec>& units, std::vector<std::vector<float>> values);

  std::size_t unit_count() const { return values_.size(); }
  std::span<const float> unit(std::size_t index) const { return values_[index]; }
  // One span per tensor of unit `index`, spec order.
  const std::vector<std::span<const float>>& views(std::size_t index) const {
    return views_[index];
  }

 private:
  HostWeights() = default;
  void make_views(const std::vector<UnitSpec>& units);

  std::vector<std::vector<float>> values_;
  std::vector<std::vector<std::span<const float>>> views_;
};

// forward_unit for every unit in order (the tied head gets the embedding as `shared`).
void forward_all(DecoderModel& model, const HostWeights& weights);
// decode_unit for every unit in order, after feed().
void decode_all(DecoderModel& model, const HostWeights& weights);

}  // namespace strata::llm
