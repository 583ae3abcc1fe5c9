#include "runtime/plan/partition.hpp"

#include <algorithm>

#include "base/assert.hpp"
#include "base/units.hpp"

namespace strata::runtime {

std::uint64_t UnitLayout::shard_real_numel(std::uint32_t rank) const {
  const std::uint64_t begin = shard_begin(rank);
  if (begin >= numel) return 0;
  return std::min(shard_numel, numel - begin);
}

std::vector<float> UnitLayout::shard_of(std::span<const float> values, std::uint32_t rank) const {
  STRATA_ASSERT(values.size() == numel, "values of another unit");
  std::vector<float> shard(shard_numel, 0.0f);
  const std::uint64_t begin = std::min(numel, shard_begin(rank));
  std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(begin), shard_real_numel(rank),
              shard.begin());
  return shard;
}

UnitLayout make_unit_layout(const UnitSpec& unit, std::uint32_t ranks) {
  STRATA_ASSERT(ranks > 0, "no ranks");
  UnitLayout layout;
  layout.ranks = ranks;
  for (const TensorSpec& tensor : unit.tensors) {
    layout.tensors.push_back({layout.numel, tensor.numel()});
    layout.numel += tensor.numel();
  }
  const std::uint64_t per_rank = (layout.numel + ranks - 1) / ranks;
  layout.shard_numel = round_up(std::max<std::uint64_t>(per_rank, 1), kShardGranuleElements);
  layout.padded_numel = layout.shard_numel * ranks;
  return layout;
}

std::uint64_t sub_group_elements(std::uint64_t sub_group_numel) {
  return round_up(std::max<std::uint64_t>(sub_group_numel, 1), kShardGranuleElements);
}

std::vector<SubGroup> make_sub_groups(std::uint64_t shard_numel, std::uint64_t sub_group_numel) {
  const std::uint64_t size = sub_group_elements(sub_group_numel);
  std::vector<SubGroup> groups;
  for (std::uint64_t begin = 0; begin < shard_numel; begin += size) {
    groups.push_back({begin, std::min(size, shard_numel - begin)});
  }
  return groups;
}

}  // namespace strata::runtime
