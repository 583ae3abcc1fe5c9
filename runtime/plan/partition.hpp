// How a unit's tensors are flattened, padded and split into rank shards, and how a shard is cut
// into optimizer sub-groups. Pure arithmetic, shared by the Engine, checkpoints and tests.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/engine/unit_spec.hpp"

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
  // `rank`'s shard (shard_numel values, padding zero) of the whole unit's `values` (numel).
  std::vector<float> shard_of(std::span<const float> values, std::uint32_t rank) const;
};

UnitLayout make_unit_layout(const UnitSpec& unit, std::uint32_t ranks);
// The same layout from the tensors' element counts alone (a memory plan that knows a model's
// shapes, not its initialisers).
UnitLayout make_unit_layout(std::span<const std::uint64_t> tensor_numels, std::uint32_t ranks);

// The fp32 view of a gathered unit whose parameters are 16-bit: the elements of the tensors that
// have one (TensorSpec::fp32_view; EngineState::widens), packed into one buffer, so a tensor read
// only in bf16 takes no fp32 memory. Every tensor widened: the whole padded unit, at its own
// offsets (one run). Otherwise each run of adjacent widened tensors starts at the next element of
// the packed buffer with the run's own offset modulo kFp32ViewAlignElements (a pointer into the
// view is as aligned as into the unpadded one), and the buffer is a whole number of those.
inline constexpr std::uint64_t kFp32ViewAlignElements = 64;  // 256 bytes of fp32

struct Fp32ViewRun {
  std::uint64_t offset = 0;         // first element in the flattened unit
  std::uint64_t packed_offset = 0;  // first element in the packed view
  std::uint64_t numel = 0;
};

struct Fp32ViewPacking {
  static constexpr std::uint64_t kNone = ~std::uint64_t{0};
  std::vector<Fp32ViewRun> runs;
  std::vector<std::uint64_t> tensor_offsets;  // per tensor: its first packed element, or kNone
  std::uint64_t numel = 0;  // elements of the packed buffer: kFp32ViewAlignElements at least
};

// `widened[t]`: whether tensor t has an fp32 view.
Fp32ViewPacking pack_fp32_views(const UnitLayout& layout, const std::vector<bool>& widened);

struct SubGroup {
  std::uint64_t begin = 0;  // first element within the shard
  std::uint64_t numel = 0;
};

// A stretch of a unit's flattened elements whose tensors agree on TensorSpec::weight_decay.
struct DecayRun {
  std::uint64_t begin = 0;  // first element, relative to the range for_each_decay_run was given
  std::uint64_t numel = 0;
  bool weight_decay = true;
};

// Cuts [begin, begin + numel) of the unit's flattened elements (a sub-group of a rank's shard:
// begin = layout.shard_begin(rank) + sub.begin) into maximal runs of tensors with the same
// weight-decay flag and calls fn(const DecayRun&) for each, in order. Padding past the last tensor
// joins the run before it (a range of padding alone is one run, not decayed): padding is zero and
// stays zero either way. No allocation: the optimizer step calls it per sub-group.
template <typename Fn>
void for_each_decay_run(const UnitSpec& unit, const UnitLayout& layout, std::uint64_t begin,
                        std::uint64_t numel, Fn&& fn) {
  const std::uint64_t end = begin + numel;
  DecayRun run;
  bool open = false;
  for (std::size_t t = 0; t < unit.tensors.size(); ++t) {
    const TensorPlacement& placement = layout.tensors[t];
    const std::uint64_t low = std::max(begin, placement.offset);
    const std::uint64_t high = std::min(end, placement.offset + placement.numel);
    if (low >= high) continue;
    const bool decay = unit.tensors[t].weight_decay;
    if (!open) {
      run = {low - begin, 0, decay};
      open = true;
    } else if (decay != run.weight_decay) {
      run.numel = low - begin - run.begin;
      fn(static_cast<const DecayRun&>(run));
      run = {low - begin, 0, decay};
    }
  }
  if (!open) run = {0, 0, false};
  run.numel = numel - run.begin;
  if (run.numel > 0) fn(static_cast<const DecayRun&>(run));
}

// The elements of a full sub-group: the configured sub_group_size rounded up to the granule.
std::uint64_t sub_group_elements(std::uint64_t sub_group_numel);

// The shard cut into sub-groups of sub_group_elements(sub_group_numel) elements, the last partial.
std::vector<SubGroup> make_sub_groups(std::uint64_t shard_numel, std::uint64_t sub_group_numel);

}  // namespace strata::runtime
