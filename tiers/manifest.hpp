// The NVMe store's manifest decoder, public so the fuzzer (tests/fuzz/manifest_fuzz.cpp) and tests
// can feed it arbitrary bytes. The format is described in tiers/nvme_store.hpp; NvmeStore is the
// only writer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <variant>
#include <vector>

namespace strata::tiers {

struct DecodedManifest {
  std::uint32_t rank = 0;
  std::uint32_t ranks = 0;
  std::uint64_t sequence = 0;
  std::uint64_t step = ~std::uint64_t{0};  // ~0: nothing committed yet
  std::uint64_t layout_hash = 0;
  struct Record {
    std::string name;
    std::uint64_t length = 0;
    std::uint8_t has_data = 0;
    std::uint8_t slot = 0;
    std::uint64_t step = 0;
    std::uint64_t checksum = 0;
  };
  std::vector<Record> records;
};

// The manifest in `bytes`, or a reason it is unusable (torn, truncated, corrupt, another format).
// Never reads outside `bytes`, whatever they hold.
std::variant<DecodedManifest, std::string> decode_manifest(std::span<const std::byte> bytes);

}  // namespace strata::tiers
