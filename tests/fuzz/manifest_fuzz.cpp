// libFuzzer target: the NVMe store's manifest decoder (tiers/manifest.hpp) on arbitrary bytes.
// The first input byte chooses whether the harness repairs the trailing checksum (at the body size
// the input claims), so the fuzzer also reaches the record parser behind the checksum. Any input
// must decode or give a reason; never crash, allocate without bound or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <xxhash.h>

#include "tiers/manifest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool repair = (data[0] & 1) != 0;
  std::vector<std::byte> bytes(size - 1);
  if (size > 1) std::memcpy(bytes.data(), data + 1, size - 1);
  constexpr std::size_t kBodyField = 8 + 4 * 4 + 8 * 3;  // where the body size is
  if (repair && bytes.size() >= kBodyField + 8) {
    std::uint64_t body = 0;
    std::memcpy(&body, bytes.data() + kBodyField, 8);
    if (body <= bytes.size() && bytes.size() - body >= 8) {
      const std::uint64_t sum = XXH3_64bits(bytes.data(), body);
      std::memcpy(bytes.data() + body, &sum, 8);
    }
  }
  const auto decoded = strata::tiers::decode_manifest(bytes);
  static_cast<void>(decoded);
  return 0;
}
