// Sequential I/O over a striped file at a fixed depth: the loop `strata bench io` times and
// `strata tune` runs over its grid of block size x queue depth x rings. One request per block,
// as many in flight as the pool has buffers, retired in submission order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

#include "io/buffer_pool.hpp"
#include "io/engine_options.hpp"
#include "io/striped_file.hpp"

namespace strata::runtime::tune {

// kMixed alternates read and write block by block (a 50/50 mix, what the optimizer's pipeline
// does: reads of the next sub-group in flight with writes of the previous one).
enum class IoPattern { kRead, kWrite, kMixed };
std::string_view to_string(IoPattern pattern);

struct IoRunResult {
  double seconds = 0;
  std::uint64_t bytes = 0;
  std::uint64_t operations = 0;
  double mb_per_s() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e6 : 0; }
};

// Moves `size_bytes` (a multiple of block_bytes) through `striped` with every buffer of `pool` in
// flight. A mixed run reads even blocks and writes odd ones, so its reads find written data.
// Throws io::IoError.
IoRunResult run_io_pattern(io::StripedFile& striped, io::BufferPool& pool, bool use_fixed_buffers,
                           IoPattern pattern, std::uint64_t size_bytes, std::uint64_t block_bytes);

// One point of the tuning grid, measured on its own engine and file over `dirs` (striped):
// the file is written first (untimed for the read and mixed patterns) so reads hit real extents.
struct IoPointSpec {
  std::vector<std::filesystem::path> dirs;
  std::uint64_t size_bytes = 0;
  std::uint64_t block_bytes = 0;
  std::uint32_t queue_depth = 1;
  std::uint32_t rings = 1;
  io::DirectIo direct = io::DirectIo::kOn;
  io::IoEngineKind engine = io::IoEngineKind::kAuto;
};

struct IoPointResult {
  double read_mb_per_s = 0;
  double write_mb_per_s = 0;
  double mixed_mb_per_s = 0;
  // The bytes the mixed run wrote over the seconds the fsync after it took: what a durable commit
  // ([tiers.nvme] fsync = true) costs per byte a step writes (a drive or a virtual disk with a
  // write cache takes the writes fast and pays at the flush).
  double flush_mb_per_s = 0;
  std::string engine_name;
};

// Measures write, read and mixed at one point; removes its files afterwards. Throws io::IoError.
IoPointResult measure_io_point(const IoPointSpec& spec);

}  // namespace strata::runtime::tune
