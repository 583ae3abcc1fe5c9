// Whole-file reads, atomic whole-file writes and directory syncs: the small files strata keeps
// beside its data (manifests, safetensors exports, checkpoints' metadata, corpora), all built on
// FileHandle. Every failed system call throws IoError naming the operation, the path, the offset
// and errno's text.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

namespace strata::io {

// Every byte of the regular file at `path` (a directory or device is an error: EISDIR / EINVAL).
// A file that shrinks while being read gives the bytes that were there.
std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path);

// Writes `chunks`, in order, to `path` + ".tmp", fsyncs it, renames it over `path` and fsyncs the
// directory: a reader sees the old file or the complete new one, never a torn one. On failure the
// temporary file is removed and `path` is untouched.
void write_file_atomically(const std::filesystem::path& path,
                           std::span<const std::span<const std::uint8_t>> chunks);
// The same for one block of text or bytes held in a string (manifests, JSON).
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

// fsync of a directory, so the entries created or renamed in it survive a crash.
void sync_directory(const std::filesystem::path& directory);

}  // namespace strata::io
