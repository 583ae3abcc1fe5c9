// Whole-file reads, atomic whole-file writes and directory syncs: the small files strata keeps
// beside its data (manifests, safetensors exports, checkpoints' metadata, corpora), all built on
// FileHandle. Every failed system call throws IoError naming the operation, the path, the offset
// and errno's text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

#include "io/file_handle.hpp"

namespace strata::io {

// Every byte of the regular file at `path` (a directory or device is an error: EISDIR / EINVAL).
// A file that shrinks while being read gives the bytes that were there.
std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path);

// A file replaced whole, written as a stream: bytes are appended to `path` + ".tmp" and commit()
// fsyncs it, renames it over `path` and fsyncs the directory, so a reader sees the old file or the
// complete new one, never a torn one. Destroyed without a successful commit(), or when commit()
// fails, the temporary file is removed and `path` is untouched. Move-only; one thread at a time.
class AtomicFileWriter {
 public:
  static AtomicFileWriter create(const std::filesystem::path& path);
  AtomicFileWriter(AtomicFileWriter&& other) noexcept = default;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) = delete;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  void append(std::span<const std::byte> bytes);
  // Writes at `offset` instead, for writers that fill the file out of order (a streamed export
  // gathering pieces of a tensor from every rank); bytes never written read as zero. append()
  // continues after the furthest byte written.
  void write_at(std::uint64_t offset, std::span<const std::byte> bytes);
  std::uint64_t written_bytes() const { return written_bytes_; }  // the furthest byte written
  // Call once; after it (successful or not) append() and commit() are programmer errors.
  void commit();

 private:
  AtomicFileWriter(std::filesystem::path path, std::filesystem::path temporary, FileHandle file);
  std::filesystem::path path_;
  std::filesystem::path temporary_;
  FileHandle file_;  // invalid once committed (or moved from): nothing left to remove
  std::uint64_t written_bytes_ = 0;
};

// AtomicFileWriter over `chunks`, in order, for a file whose bytes are all at hand.
void write_file_atomically(const std::filesystem::path& path,
                           std::span<const std::span<const std::uint8_t>> chunks);
// The same for one block of text or bytes held in a string (manifests, JSON).
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

// fsync of a directory, so the entries created or renamed in it survive a crash.
void sync_directory(const std::filesystem::path& directory);

}  // namespace strata::io
