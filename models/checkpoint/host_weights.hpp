// HostWeights: a model folder's checkpoint as fp32 units for inference without an Engine
// (strata-eval, strata-generate, tests), and the loops that run a DecoderModel's forward or
// decoding step over them, unit by unit.
//
// Host memory is bounded by a resident budget: units are kept in memory, in order, while they fit
// it; every other unit is read from the folder's safetensors again each time a pass needs it, into
// one buffer the size of the largest unit (two when a tied head reads a streamed embedding). So
// a model larger than RAM still evaluates and generates, at the cost of re-reading the streamed
// units per pass, and results are bitwise the same whatever the budget.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "models/decoder/decoder_model.hpp"
#include "models/checkpoint/hf_checkpoint.hpp"

namespace strata::llm {

class HostWeights {
 public:
  static constexpr std::uint64_t kAllResident = std::numeric_limits<std::uint64_t>::max();

  // The checkpoint of `model_dir`, checked against `units` (CheckpointError naming the tensor
  // and the file otherwise). Units stay resident, in order, while their fp32 bytes fit
  // `resident_budget_bytes`; the others are streamed.
  static HostWeights load(const std::filesystem::path& model_dir,
                          const std::vector<UnitSpec>& units,
                          std::uint64_t resident_budget_bytes = kAllResident);
  // Filled from flat unit buffers (tests): every unit resident.
  HostWeights(const std::vector<UnitSpec>& units, std::vector<std::vector<float>> values);

  std::size_t unit_count() const { return units_.size(); }
  bool resident(std::size_t index) const { return !values_[index].empty(); }
  std::size_t resident_units() const;
  std::uint64_t resident_bytes() const;
  // A resident unit's values and its spans per tensor, spec order.
  std::span<const float> unit(std::size_t index) const;
  const std::vector<std::span<const float>>& views(std::size_t index) const;
  // Unit `index` for one use: the resident copy's views, or the unit read from the folder into
  // `slot` (which the caller keeps while it uses the views).
  std::vector<std::span<const float>> fetch(std::size_t index, std::vector<float>& slot) const;

 private:
  HostWeights() = default;
  void make_views();

  std::vector<UnitSpec> units_;
  std::vector<std::vector<float>> values_;  // empty: streamed
  std::vector<std::vector<std::span<const float>>> views_;
  std::optional<HfCheckpoint> checkpoint_;  // set when some unit is streamed
};

// The default resident budget of the programs: three quarters of the machine's physical memory.
std::uint64_t default_resident_budget();
// A --resident-budget value: "auto" (the default above) or a size ("12GiB", "500MB", "0": stream
// every unit). std::invalid_argument naming the value otherwise.
std::uint64_t parse_resident_budget(const std::string& text);
// The programs' note when some units are streamed (empty when all are resident).
std::string describe_residency(const HostWeights& weights, const std::filesystem::path& model_dir);

// forward_unit for every unit in order (the tied head gets the embedding as `shared`).
void forward_all(DecoderModel& model, const HostWeights& weights);
// decode_unit for every unit in order, after feed().
void decode_all(DecoderModel& model, const HostWeights& weights);

}  // namespace strata::llm
