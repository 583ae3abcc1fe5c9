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
  std::vector<std::uint64_t> numels;
  numels.reserve(unit.tensors.size());
  for (const TensorSpec& tensor : unit.tensors) numels.push_back(tensor.numel());
  return make_unit_layout(numels, ranks);
}

UnitLayout make_unit_layout(std::span<const std::uint64_t> tensor_numels, std::uint32_t ranks) {
  STRATA_ASSERT(ranks > 0, "no ranks");
  UnitLayout layout;
  layout.ranks = ranks;
  for (const std::uint64_t numel : tensor_numels) {
    layout.tensors.push_back({layout.numel, numel});
    layout.numel += numel;
  }
  const std::uint64_t per_rank = (layout.numel + ranks - 1) / ranks;
  layout.shard_numel = round_up(std::max<std::uint64_t>(per_rank, 1), kShardGranuleElements);
  layout.padded_numel = layout.shard_numel * ranks;
  return layout;
}

Fp32ViewPacking pack_fp32_views(const UnitLayout& layout, const std::vector<bool>& widened) {
  STRATA_ASSERT(widened.size() == layout.tensors.size(), "one widened flag per tensor");
  Fp32ViewPacking packing;
  packing.tensor_offsets.assign(layout.tensors.size(), Fp32ViewPacking::kNone);
  if (std::all_of(widened.begin(), widened.end(), [](bool w) { return w; })) {
    packing.runs.push_back({0, 0, layout.padded_numel});
    for (std::size_t t = 0; t < layout.tensors.size(); ++t) {
      packing.tensor_offsets[t] = layout.tensors[t].offset;
    }
    packing.numel = layout.padded_numel;
    return packing;
  }
  std::uint64_t end = 0;  // of the packed runs so far
  for (std::size_t t = 0; t < layout.tensors.size(); ++t) {
    if (!widened[t]) continue;
    const TensorPlacement& tensor = layout.tensors[t];
    if (!packing.runs.empty()) {
      Fp32ViewRun& last = packing.runs.back();
      if (last.offset + last.numel == tensor.offset) {  // adjacent: the run goes on
        packing.tensor_offsets[t] = last.packed_offset + last.numel;
        last.numel += tensor.numel;
        end += tensor.numel;
        continue;
      }
    }
    // The first element at or past `end` with the tensor's offset modulo the alignment.
    const std::uint64_t residue = tensor.offset % kFp32ViewAlignElements;
    std::uint64_t start = end - end % kFp32ViewAlignElements + residue;
    if (start < end) start += kFp32ViewAlignElements;
    packing.runs.push_back({tensor.offset, start, tensor.numel});
    packing.tensor_offsets[t] = start;
    end = start + tensor.numel;
  }
  packing.numel = std::max(kFp32ViewAlignElements, round_up(end, kFp32ViewAlignElements));
  return packing;
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
