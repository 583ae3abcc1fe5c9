#include "runtime/plan/preflight.hpp"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "base/units.hpp"
#include "runtime/config/byte_size.hpp"

namespace strata::runtime {

std::uint64_t nvme_bytes_per_path(const std::vector<tiers::ExtentSpec>& extents,
                                  std::size_t path_count, std::uint64_t stripe_unit,
                                  bool first_path) {
  std::uint64_t logical = 0;
  std::uint64_t manifest = 8 + 4 * 4 + 8 * 4 + 8;
  for (const tiers::ExtentSpec& extent : extents) {
    logical += 2 * round_up(std::max<std::uint64_t>(extent.length_bytes, 1), kDirectIoAlignment);
    manifest += 2 + extent.name.size() + 26;
  }
  const std::uint64_t units = (logical + stripe_unit - 1) / stripe_unit;
  const std::uint64_t per_file = (units + path_count - 1) / path_count * stripe_unit;
  return per_file + (first_path ? 2 * round_up(manifest, kDirectIoAlignment) : 0);
}

void check_nvme_paths(const NvmeTierConfig& nvme, const std::vector<tiers::ExtentSpec>& extents,
                      std::uint32_t rank) {
  if (nvme.paths.empty()) {
    throw NvmePathError("state is homed on NVMe but [tiers.nvme] paths is empty");
  }
  for (std::size_t i = 0; i < nvme.paths.size(); ++i) {
    const std::filesystem::path path = nvme.paths[i];
    std::error_code error;
    const std::filesystem::file_status status = std::filesystem::status(path, error);
    if (!std::filesystem::exists(status)) {
      throw NvmePathError(fmt::format(
          "NVMe path '{}' ([tiers.nvme] paths) does not exist: create the directory first",
          path.string()));
    }
    if (!std::filesystem::is_directory(status)) {
      throw NvmePathError(
          fmt::format("NVMe path '{}' ([tiers.nvme] paths) is not a directory", path.string()));
    }
    if (::access(path.c_str(), W_OK | X_OK) != 0) {
      throw NvmePathError(fmt::format("NVMe path '{}' ([tiers.nvme] paths) is not writable: {}",
                                      path.string(), std::strerror(errno)));
    }
    const std::uint64_t needed =
        nvme_bytes_per_path(extents, nvme.paths.size(), nvme.block_size, i == 0);
    // What the rank's files there already hold is reused in place (resume, or a rerun).
    std::uint64_t existing = 0;
    for (const std::string& name :
         {fmt::format("strata-rank{}.swap", rank), fmt::format("strata-rank{}.manifest.0", rank),
          fmt::format("strata-rank{}.manifest.1", rank)}) {
      struct stat info {};
      if (::stat((path / name).c_str(), &info) == 0) {
        existing += static_cast<std::uint64_t>(info.st_blocks) * 512;
      }
    }
    struct statvfs fs {};
    if (::statvfs(path.c_str(), &fs) != 0) {
      throw NvmePathError(
          fmt::format("statvfs of NVMe path '{}' failed: {}", path.string(), std::strerror(errno)));
    }
    const std::uint64_t free_bytes = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
    const std::uint64_t more = needed > existing ? needed - existing : 0;
    if (more > free_bytes) {
      throw NvmePathError(fmt::format(
          "NVMe path '{}' has {} free, but rank {}'s store preallocates {} there (short by {}): "
          "free space, add paths to [tiers.nvme] paths, or home less state on nvme",
          path.string(), format_binary_bytes(free_bytes), rank, format_binary_bytes(needed),
          format_binary_bytes(more - free_bytes)));
    }
  }
}

}  // namespace strata::runtime
