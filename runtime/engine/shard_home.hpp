// Where one state kind of one unit shard lives, and the one place that tells the tiers apart.
// Not a public header (the Engine's, runtime/engine/engine_state.hpp).
//
// A shard lives in one of three places, as the Engine's data path sees it:
//   kAddressable   memory the CPU reads and writes in place: the host tier, or device memory when
//                  it is host memory and the Engine addresses it directly (the host device)
//   kStagedDevice  device memory reached only through streams (CUDA, or DeviceAccess::kStaged)
//   kNvme          extents of the NVMe store, one per optimizer sub-group
// ShardHome::residence() is the only code that derives this from the tier; everything that moves
// shard bytes (runtime/engine/shard_io.cpp) switches on the Residence it returns.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "base/dtype.hpp"
#include "cpu_adam/typed_span.hpp"
#include "runtime/plan/buffer_plan.hpp"
#include "tiers/device/device.hpp"
#include "tiers/nvme_store.hpp"
#include "tiers/pinned_pool.hpp"

namespace strata::runtime::detail {

using Kind = ShardKind;
inline constexpr std::size_t kKindCount = kShardKindCount;
// The kind's name in NVMe extent names and checkpoint manifests. kParam is "param16", the name
// stores were written with before fp32 parameters existed; it stays so that they remain readable.
std::string_view kind_name(Kind kind);

enum class Residence : std::uint8_t { kAddressable, kStagedDevice, kNvme };

struct ShardHome {
  Tier tier = Tier::kDevice;
  DType dtype = DType::kFp32;
  bool quantized = false;  // int8 moment blocks (KindPlacement::quantized)
  std::uint64_t numel = 0;
  // Where each sub-group starts in the home's bytes: encoded formats size sub-groups separately.
  std::vector<std::uint64_t> group_offsets;
  tiers::DeviceBuffer device;  // tier device
  tiers::PinnedBuffer host;    // tier host
  // Set for Residence::kAddressable: the bytes the CPU addresses (host buffer, or device buffer on
  // the direct path).
  std::byte* memory = nullptr;
  std::vector<tiers::ExtentId> extents;  // tier nvme: one per sub-group

  Residence residence() const {
    if (memory != nullptr) return Residence::kAddressable;
    return tier == Tier::kDevice ? Residence::kStagedDevice : Residence::kNvme;
  }
  std::uint64_t element_bytes() const { return dtype_bytes(dtype); }
  cpu_adam::StateDType state_dtype() const {
    return KindPlacement{true, tier, dtype, quantized}.state_dtype();
  }
  // Bytes of a sub-group of `count` elements (whole int8 blocks), and of the whole shard.
  std::uint64_t bytes(std::uint64_t count) const {
    return KindPlacement{true, tier, dtype, quantized}.bytes(count);
  }
  std::uint64_t total_bytes() const { return group_offsets.empty() ? 0 : group_offsets.back(); }
  std::byte* group_at(std::size_t group) const { return memory + group_offsets[group]; }
  tiers::DeviceSpan group_span(std::size_t group) const {
    return device.span(group_offsets[group], group_offsets[group + 1] - group_offsets[group]);
  }
  std::byte* at(std::uint64_t element) const { return memory + element * element_bytes(); }
  tiers::DeviceSpan device_span(std::uint64_t element, std::uint64_t count) const {
    return device.span(element * element_bytes(), count * element_bytes());
  }
};

// The pinned buffers a caller lends for one access to one sub-group whose home is not
// addressable: the CPU works on the home's memory in place, or on the staging for its residence.
struct GroupStaging {
  std::byte* device = nullptr;  // kStagedDevice: room for one sub-group of the kind
  std::byte* nvme = nullptr;    // kNvme: the same, aligned for direct I/O
};

}  // namespace strata::runtime::detail
