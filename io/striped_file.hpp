// StripedFile: one logical address space laid across several files (one per NVMe path) in stripe
// units, so that one large request keeps every drive busy at once. Unit k of the logical space
// lives in file k % N at offset (k / N) * stripe_unit.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <vector>

#include "io/engine.hpp"

namespace strata::io {

class StripedFile {
 public:
  struct Location {
    std::uint32_t file_index;  // index into files(), not a FileId
    std::uint64_t offset_bytes;
  };

  // `files` are registered with `engine`, which must outlive this object. stripe_unit_bytes: a
  // multiple of 4 KiB; 0 means the engine's block size.
  StripedFile(IoEngine& engine, std::vector<FileId> files, std::uint64_t stripe_unit_bytes = 0);

  // Opens (creating) one file per path through engine.open_file, each preallocated to its share
  // of size_bytes (rounded up to whole stripe units).
  static StripedFile create(IoEngine& engine, std::span<const std::filesystem::path> paths,
                            std::uint64_t size_bytes, std::uint64_t stripe_unit_bytes = 0);

  // One ticket for the whole logical range, whatever files it spans. The buffer rules of IoRequest
  // apply (alignment on O_DIRECT files; the buffer lives until the ticket completes).
  Ticket read(std::uint64_t offset_bytes, std::span<std::byte> buffer,
              std::optional<std::uint32_t> fixed_buffer_index = std::nullopt);
  Ticket write(std::uint64_t offset_bytes, std::span<const std::byte> buffer,
               std::optional<std::uint32_t> fixed_buffer_index = std::nullopt);
  // fsync of every file, one ticket.
  Ticket sync();

  Location locate(std::uint64_t logical_offset_bytes) const;
  const std::vector<FileId>& files() const noexcept { return files_; }
  std::uint64_t stripe_unit_bytes() const noexcept { return stripe_unit_bytes_; }

 private:
  Ticket submit(IoOp op, std::uint64_t offset_bytes, std::span<std::byte> buffer,
                std::optional<std::uint32_t> fixed_buffer_index);

  IoEngine* engine_;
  std::vector<FileId> files_;
  std::uint64_t stripe_unit_bytes_;
};

}  // namespace strata::io
