#include "tiers/store_probe.hpp"

#include <span>
#include <system_error>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "io/whole_file.hpp"
#include "tiers/manifest.hpp"

namespace strata::tiers {

std::optional<std::uint64_t> committed_step_on_disk(const std::filesystem::path& directory,
                                                    std::uint32_t rank) {
  std::optional<DecodedManifest> newest;
  for (int copy = 0; copy < 2; ++copy) {
    const std::filesystem::path path =
        directory / fmt::format("strata-rank{}.manifest.{}", rank, copy);
    std::error_code error;
    if (!std::filesystem::is_regular_file(path, error)) continue;
    const std::vector<std::uint8_t> bytes = io::read_file_bytes(path);
    auto decoded = decode_manifest(std::as_bytes(std::span(bytes)));
    auto* manifest = std::get_if<DecodedManifest>(&decoded);
    if (manifest == nullptr) continue;
    if (!newest || manifest->sequence > newest->sequence) newest = std::move(*manifest);
  }
  if (!newest || newest->step == ~std::uint64_t{0}) return std::nullopt;
  return newest->step;
}

}  // namespace strata::tiers
