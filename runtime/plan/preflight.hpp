// Checks made before the Engine preallocates anything on NVMe, so a bad path or a full drive is
// refused at startup with the path and the shortfall named, never midway through training.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "runtime/config/config.hpp"
#include "tiers/nvme_store.hpp"

namespace strata::runtime {

class NvmePathError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bytes the store for `extents` preallocates in each of `path_count` swap files (two 4 KiB-rounded
// slots per extent, striped in `stripe_unit` pieces), the first path's two manifests included.
std::uint64_t nvme_bytes_per_path(const std::vector<tiers::ExtentSpec>& extents,
                                  std::size_t path_count, std::uint64_t stripe_unit,
                                  bool first_path);

// Every path exists, is a directory, is writable, and has room (statvfs) for what this rank's
// store will preallocate there beyond what its swap file already holds. Throws NvmePathError.
void check_nvme_paths(const NvmeTierConfig& nvme, const std::vector<tiers::ExtentSpec>& extents,
                      std::uint32_t rank);

}  // namespace strata::runtime
