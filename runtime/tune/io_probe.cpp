#include "runtime/tune/io_probe.hpp"

#include <fcntl.h>

#include <chrono>
#include <deque>
#include <memory>
#include <random>

#include <fmt/format.h>

#include "io/make_engine.hpp"

namespace strata::runtime::tune {

std::string_view to_string(IoPattern pattern) {
  switch (pattern) {
    case IoPattern::kRead:
      return "read";
    case IoPattern::kWrite:
      return "write";
    case IoPattern::kMixed:
      return "mixed";
  }
  return "?";
}

IoRunResult run_io_pattern(io::StripedFile& striped, io::BufferPool& pool, bool use_fixed_buffers,
                           IoPattern pattern, std::uint64_t size_bytes, std::uint64_t block_bytes) {
  struct InFlight {
    io::Ticket ticket;
    io::BufferPool::Lease buffer;
  };
  const std::size_t depth = pool.buffer_count();
  std::deque<InFlight> in_flight;
  const auto started = std::chrono::steady_clock::now();
  std::uint64_t operations = 0;
  // Equal sequential blocks complete in about submission order, so waiting for the oldest first
  // costs little and keeps the loop bounded by the pool.
  auto retire_oldest = [&] {
    in_flight.front().ticket.get();
    in_flight.pop_front();
  };
  for (std::uint64_t offset = 0; offset < size_bytes; offset += block_bytes) {
    if (in_flight.size() == depth) retire_oldest();
    io::BufferPool::Lease buffer = pool.acquire();
    const std::span<std::byte> bytes = buffer.span().first(block_bytes);
    const std::optional<std::uint32_t> fixed =
        use_fixed_buffers ? std::optional(buffer.index()) : std::nullopt;
    const bool read = pattern == IoPattern::kRead ||
                      (pattern == IoPattern::kMixed && (offset / block_bytes) % 2 == 0);
    io::Ticket ticket = read ? striped.read(offset, bytes, fixed) : striped.write(offset, bytes, fixed);
    in_flight.push_back({std::move(ticket), std::move(buffer)});
    ++operations;
  }
  while (!in_flight.empty()) retire_oldest();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - started;
  return {elapsed.count(), size_bytes, operations};
}

IoPointResult measure_io_point(const IoPointSpec& spec) {
  // Twice the engine's depth submitted, as `strata bench io` does: a ring never waits for this
  // thread to notice a completion.
  io::BufferPool pool(2 * std::size_t{spec.queue_depth} * spec.rings, spec.block_bytes);
  std::mt19937_64 random(1);  // no file system or drive may shortcut zeros
  for (std::uint32_t i = 0; i < pool.buffer_count(); ++i) {
    for (std::byte& b : pool.buffer(i)) b = static_cast<std::byte>(random());
  }
  io::IoEngineOptions options;
  options.kind = spec.engine;
  options.block_size_bytes = spec.block_bytes;
  options.queue_depth = spec.queue_depth;
  options.rings = spec.rings;
  options.direct = spec.direct;
  options.fixed_buffers = pool.buffers();
  std::unique_ptr<io::IoEngine> engine = io::make_io_engine(options);

  std::vector<std::filesystem::path> paths;
  for (std::size_t i = 0; i < spec.dirs.size(); ++i) {
    std::filesystem::create_directories(spec.dirs[i]);
    paths.push_back(spec.dirs[i] / fmt::format("strata-tune-{}.dat", i));
  }
  const std::uint64_t size = (spec.size_bytes + spec.block_bytes - 1) / spec.block_bytes *
                             spec.block_bytes;
  IoPointResult result;
  result.engine_name = std::string(engine->name());
  {
    io::StripedFile striped = io::StripedFile::create(*engine, paths, size, spec.block_bytes);
    result.write_mb_per_s =
        run_io_pattern(striped, pool, true, IoPattern::kWrite, size, spec.block_bytes).mb_per_s();
    striped.sync().get();  // untimed, as fio's default end_fsync=0
    if (spec.direct == io::DirectIo::kOff) {
      // Buffered reads would otherwise measure the page cache.
      for (io::FileId file : striped.files()) {
        ::posix_fadvise(engine->file(file).fd(), 0, 0, POSIX_FADV_DONTNEED);
      }
    }
    result.read_mb_per_s =
        run_io_pattern(striped, pool, true, IoPattern::kRead, size, spec.block_bytes).mb_per_s();
    const IoRunResult mixed =
        run_io_pattern(striped, pool, true, IoPattern::kMixed, size, spec.block_bytes);
    result.mixed_mb_per_s = mixed.mb_per_s();
    const auto flush_start = std::chrono::steady_clock::now();
    striped.sync().get();
    const double flush_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - flush_start).count();
    result.flush_mb_per_s = static_cast<double>(mixed.bytes / 2) / std::max(flush_s, 1e-6) / 1e6;
  }
  engine.reset();
  for (const std::filesystem::path& path : paths) std::filesystem::remove(path);
  return result;
}

}  // namespace strata::runtime::tune
