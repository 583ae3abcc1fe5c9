// What an NVMe store directory already holds, read without opening the store (no lock taken, no
// file created or changed): a run about to start afresh asks before it truncates anything.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>

namespace strata::tiers {

// The step committed by the newest valid manifest copy of `rank`'s store in `directory` (the
// first of [tiers.nvme] paths); nullopt when no copy exists or none decodes (a store that was
// never committed, or one too damaged to resume, holds nothing to lose).
std::optional<std::uint64_t> committed_step_on_disk(const std::filesystem::path& directory,
                                                    std::uint32_t rank);

}  // namespace strata::tiers
