#include "examples/llm/host_weights.hpp"

#include "base/assert.hpp"
#include "examples/llm/hf_checkpoint.hpp"

namespace strata::llm {
namespace {

UnitParams shared_of(const DecoderModel& model, const HostWeights& weights, std::size_t unit) {
  if (!model.units()[unit].reads_embedding) return {};
  return weights.views(0);
}

}  // namespace

HostWeights HostWeights::load(const std::filesystem::path& model_dir,
                              const std::vector<UnitSpec>& units) {
  const HfCheckpoint checkpoint = HfCheckpoint::open(model_dir);
  checkpoint.check(units);
  HostWeights weights;
  weights.values_.resize(units.size());
  for (std::size_t u = 0; u < units.size(); ++u) {
    weights.values_[u].resize(units[u].numel);
    checkpoint.read_unit_range(units[u], 0, weights.values_[u]);  // straight into place
  }
  weights.make_views(units);
  return weights;
}

HostWeights::HostWeights(const std::vector<UnitSpec>& units,
                         std::vector<std::vector<float>> values)
    : values_(std::move(values)) {
  STRATA_ASSERT(values_.size() == units.size());
  make_views(units);
}

void HostWeights::make_views(const std::vector<UnitSpec>& units) {
  views_.clear();
  for (std::size_t u = 0; u < units.size(); ++u) {
    STRATA_ASSERT(values_[u].size() == units[u].numel);
    views_.push_back(split_unit(units[u], std::span<const float>(values_[u])));
  }
}

void forward_all(DecoderModel& model, const HostWeights& weights) {
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    model.forward_unit(u, weights.views(u), shared_of(model, weights, u));
  }
}

void decode_all(DecoderModel& model, const HostWeights& weights) {
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    model.decode_unit(u, weights.views(u), shared_of(model, weights, u));
  }
}

}  // namespace strata::llm
