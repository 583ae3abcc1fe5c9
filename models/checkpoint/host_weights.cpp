#include "models/checkpoint/host_weights.hpp"

#include <unistd.h>

#include <stdexcept>

#include <fmt/format.h>

#include "base/assert.hpp"
#include "runtime/config/byte_size.hpp"

namespace strata::llm {
namespace {

// Runs `call(unit, views, shared)` for every unit in order, fetching streamed units per use.
template <typename Call>
void for_each_unit(const DecoderModel& model, const HostWeights& weights, const Call& call) {
  std::vector<float> slot, embedding_slot;
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    const std::vector<std::span<const float>> views = weights.fetch(u, slot);
    std::vector<std::span<const float>> shared;
    if (model.units()[u].reads_embedding) shared = weights.fetch(0, embedding_slot);
    call(u, views, shared);
  }
}

}  // namespace

HostWeights HostWeights::load(const std::filesystem::path& model_dir,
                              const std::vector<UnitSpec>& units,
                              std::uint64_t resident_budget_bytes) {
  HfCheckpoint checkpoint = HfCheckpoint::open(model_dir);
  checkpoint.check(units);
  HostWeights weights;
  weights.units_ = units;
  weights.values_.resize(units.size());
  std::uint64_t used = 0;
  bool streamed = false;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::uint64_t bytes = units[u].numel * sizeof(float);
    if (bytes > resident_budget_bytes - used) {
      streamed = true;
      continue;
    }
    used += bytes;
    weights.values_[u].resize(units[u].numel);
    checkpoint.read_unit_range(units[u], 0, weights.values_[u]);  // straight into place
  }
  if (streamed) weights.checkpoint_.emplace(std::move(checkpoint));
  weights.make_views();
  return weights;
}

HostWeights::HostWeights(const std::vector<UnitSpec>& units,
                         std::vector<std::vector<float>> values)
    : units_(units), values_(std::move(values)) {
  STRATA_ASSERT(values_.size() == units.size());
  for (std::size_t u = 0; u < units.size(); ++u) {
    STRATA_ASSERT(values_[u].size() == units[u].numel, "every unit resident");
  }
  make_views();
}

void HostWeights::make_views() {
  views_.clear();
  for (std::size_t u = 0; u < units_.size(); ++u) {
    views_.push_back(resident(u) ? split_unit(units_[u], std::span<const float>(values_[u]))
                                 : std::vector<std::span<const float>>{});
  }
}

std::size_t HostWeights::resident_units() const {
  std::size_t count = 0;
  for (std::size_t u = 0; u < units_.size(); ++u) count += resident(u) ? 1 : 0;
  return count;
}

std::uint64_t HostWeights::resident_bytes() const {
  std::uint64_t bytes = 0;
  for (const std::vector<float>& unit : values_) bytes += unit.size() * sizeof(float);
  return bytes;
}

std::span<const float> HostWeights::unit(std::size_t index) const {
  STRATA_ASSERT(resident(index), "unit() of a streamed unit: use fetch()");
  return values_[index];
}

const std::vector<std::span<const float>>& HostWeights::views(std::size_t index) const {
  STRATA_ASSERT(resident(index), "views() of a streamed unit: use fetch()");
  return views_[index];
}

std::vector<std::span<const float>> HostWeights::fetch(std::size_t index,
                                                       std::vector<float>& slot) const {
  if (resident(index)) return views_[index];
  slot.resize(units_[index].numel);
  checkpoint_->read_unit_range(units_[index], 0, slot);
  return split_unit(units_[index], std::span<const float>(slot));
}

std::uint64_t default_resident_budget() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return HostWeights::kAllResident;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_size) / 4 * 3;
}

std::uint64_t parse_resident_budget(const std::string& text) {
  if (text == "auto") return default_resident_budget();
  const std::optional<std::uint64_t> bytes = runtime::parse_byte_size(text);
  if (!bytes) {
    throw std::invalid_argument("--resident-budget: \"" + text +
                                "\" is neither auto nor a size (e.g. 12GiB, 500MB, 0)");
  }
  return *bytes;
}

std::string describe_residency(const HostWeights& weights, const std::filesystem::path& model_dir) {
  if (weights.resident_units() == weights.unit_count()) return "";
  return fmt::format(
      "weights: {} of {} units resident ({} MB, --resident-budget); the others are read from {} "
      "on every pass",
      weights.resident_units(), weights.unit_count(), weights.resident_bytes() / 1000000,
      model_dir.string());
}

void forward_all(DecoderModel& model, const HostWeights& weights) {
  for_each_unit(model, weights, [&](std::size_t u, UnitParams views, UnitParams shared) {
    model.forward_unit(u, views, shared);
  });
}

void decode_all(DecoderModel& model, const HostWeights& weights) {
  for_each_unit(model, weights, [&](std::size_t u, UnitParams views, UnitParams shared) {
    model.decode_unit(u, views, shared);
  });
}

}  // namespace strata::llm
