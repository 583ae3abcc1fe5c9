// Proves UnitLayout::shard_of: each rank's shard of a unit's values is its slice of the flattened
// unit, padded with zeros past the last real element, and the shards together are the unit.
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/plan/partition.hpp"

namespace strata::runtime {
namespace {

TEST(Partition, ShardOfIsTheRanksSliceZeroPadded) {
  const UnitSpec spec{"u", {{"w", {50, 100}, TensorInit::zeros()}}};  // 5000 elements
  const UnitLayout layout = make_unit_layout(spec, 3);
  ASSERT_EQ(layout.shard_numel, kShardGranuleElements);  // ceil(5000 / 3) rounded up: 2048
  std::vector<float> values(layout.numel);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i + 1);

  std::vector<float> joined;
  for (std::uint32_t rank = 0; rank < 3; ++rank) {
    const std::vector<float> shard = layout.shard_of(values, rank);
    ASSERT_EQ(shard.size(), layout.shard_numel);
    for (std::uint64_t i = 0; i < shard.size(); ++i) {
      const std::uint64_t element = layout.shard_begin(rank) + i;
      const float expected = element < layout.numel ? values[element] : 0.0f;
      ASSERT_EQ(shard[i], expected) << "rank " << rank << " element " << i;
    }
    joined.insert(joined.end(), shard.begin(), shard.end());
  }
  joined.resize(layout.numel);
  EXPECT_EQ(joined, values);
}

}  // namespace
}  // namespace strata::runtime
