// How a unit's tensors are flattened, padded and split into rank shards, and how a shard is cut
// into optimizer sub-groups. Pure arithmetic, shared by the Engine, checkpoints and tests.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/unit_spec.hpp"

namespace strata::runtime {

// Every shard holds a multiple of this many elements, so a bf16/fp16 shard is a multiple of 4 KiB
// (O_DIRECT) and an fp32 shard a multiple of 8 KiB.
inline constexpr std::uint64_t kShardGranuleElements = 2048;

struct TensorPlacement {
  std::uint64_t offset = 0;  // first element in the flattened unit
  std::uint64_t numel = 0;
};

struct UnitLayout {
  std::vector<TensorPlacement> tensors;
  std::uint64_t numel = 0;         // real elements
  std::uint64_t padded_numel = 0;  // ranks * shard_numel
  std::uint64_t shard_numel = 0;   // elements each rank owns
  std::uint32_t ranks = 1;

  std::uint64_t shard_begin(std::uint32_t rank) const { return rank * shard_numel; }
  // Real (non-padding) elements in `rank`'s shard.
  std::uint64_t shard_real_numel(std::uint32_t rank) const;
};

UnitLayout make_unit_layout(const UnitSpec& unit, std::uint32_t ranks);

struct SubGroup {
  std::uint64_t begin = 0;  // first element within the shard
  std::uint64_t numel = 0;
};

// The shard cut into sub-groups of at most `sub_group_numel` elements (rounded up to the granule).
std::vector<SubGroup> make_sub_groups(std::uint64_t shard_numel, std::uint64_t sub_group_numel);

}  // namespace strata::runtime
