// Proves UnitLayout::shard_of: each rank's shard of a unit's values is its slice of the flattened
// unit, padded with zeros past the last real element, and the shards together are the unit; and
// pack_fp32_views: the widened tensors of a unit packed without overlap, each as aligned as in
// the unit, in a buffer no larger than their elements and the alignment's slack need.
#include <cstdint>
#include <string>
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

TEST(Partition, Fp32ViewsOfEveryTensorAreTheWholePaddedUnit) {
  const std::vector<std::uint64_t> numels{3, 5000, 7};
  const UnitLayout layout = make_unit_layout(numels, 2);
  const Fp32ViewPacking packing = pack_fp32_views(layout, {true, true, true});
  EXPECT_EQ(packing.numel, layout.padded_numel);
  ASSERT_EQ(packing.runs.size(), 1u);
  EXPECT_EQ(packing.runs[0].numel, layout.padded_numel);
  for (std::size_t t = 0; t < numels.size(); ++t) {
    EXPECT_EQ(packing.tensor_offsets[t], layout.tensors[t].offset) << "tensor " << t;
  }
}

TEST(Partition, Fp32ViewsOfSomeTensorsArePackedAlignedAsInTheUnit) {
  // norm (100) | q (4096) | k (1000) | bias (13) | norm2 (100) | w (70) | bias2 (3), one rank.
  const std::vector<std::uint64_t> numels{100, 4096, 1000, 13, 100, 70, 3};
  const std::vector<bool> widened{true, false, false, true, true, false, true};
  const UnitLayout layout = make_unit_layout(numels, 1);
  const Fp32ViewPacking packing = pack_fp32_views(layout, widened);
  std::uint64_t widened_numel = 0;
  std::vector<bool> used(packing.numel, false);
  for (std::size_t t = 0; t < numels.size(); ++t) {
    SCOPED_TRACE("tensor " + std::to_string(t));
    if (!widened[t]) {
      EXPECT_EQ(packing.tensor_offsets[t], Fp32ViewPacking::kNone);
      continue;
    }
    widened_numel += numels[t];
    const std::uint64_t at = packing.tensor_offsets[t];
    ASSERT_NE(at, Fp32ViewPacking::kNone);
    EXPECT_EQ(at % kFp32ViewAlignElements, layout.tensors[t].offset % kFp32ViewAlignElements);
    ASSERT_LE(at + numels[t], packing.numel);
    for (std::uint64_t i = at; i < at + numels[t]; ++i) {
      ASSERT_FALSE(used[i]) << "element " << i << " packed twice";
      used[i] = true;
    }
  }
  // Three runs: the first norm; the bias and the norm after it (adjacent); the last bias.
  ASSERT_EQ(packing.runs.size(), 3u);
  EXPECT_EQ(packing.tensor_offsets[4], packing.tensor_offsets[3] + 13);
  for (const Fp32ViewRun& run : packing.runs) {  // each run is its tensors' elements, in order
    bool found = false;
    for (std::size_t t = 0; t < numels.size(); ++t) {
      if (widened[t] && layout.tensors[t].offset == run.offset) {
        EXPECT_EQ(run.packed_offset, packing.tensor_offsets[t]);
        found = true;
      }
    }
    EXPECT_TRUE(found) << "a run at " << run.offset << " that starts no widened tensor";
  }
  EXPECT_EQ(packing.numel % kFp32ViewAlignElements, 0u);
  EXPECT_LE(packing.numel, widened_numel + packing.runs.size() * kFp32ViewAlignElements +
                               kFp32ViewAlignElements);
  EXPECT_LT(packing.numel, layout.padded_numel / 4);
}

TEST(Partition, Fp32ViewsOfNoTensorTakeOneAlignmentUnit) {
  const std::vector<std::uint64_t> numels{4096, 4096};
  const Fp32ViewPacking packing = pack_fp32_views(make_unit_layout(numels, 1), {false, false});
  EXPECT_TRUE(packing.runs.empty());
  EXPECT_EQ(packing.numel, kFp32ViewAlignElements);
  EXPECT_EQ(packing.tensor_offsets[0], Fp32ViewPacking::kNone);
  EXPECT_EQ(packing.tensor_offsets[1], Fp32ViewPacking::kNone);
}

}  // namespace
}  // namespace strata::runtime
