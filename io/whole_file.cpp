#include "io/whole_file.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>
#include <utility>

#include "base/assert.hpp"
#include "io/io_error.hpp"
#include "io/namespace_ops.hpp"

namespace strata::io {

std::vector<std::uint8_t> read_file_bytes(const std::filesystem::path& path) {
  const FileHandle file =
      FileHandle::open(path, {CreateMode::kOpenExisting, DirectIo::kOff, Access::kReadOnly});
  if (!file.is_regular_file()) {
    const int error_number = std::filesystem::is_directory(path) ? EISDIR : EINVAL;
    throw IoError("read (not a regular file)", path.string(), 0, 0, error_number);
  }
  std::vector<std::uint8_t> bytes(file.size_bytes());
  const std::size_t got = file.read_at(0, std::as_writable_bytes(std::span(bytes)));
  bytes.resize(got);  // the file shrank under us
  return bytes;
}

void sync_directory(const std::filesystem::path& directory) {
  FileHandle::open_directory(directory).sync();
}

AtomicFileWriter AtomicFileWriter::create(const std::filesystem::path& path) {
  std::filesystem::path temporary = path;
  temporary += ".tmp";
  FileHandle file = FileHandle::open(temporary, {CreateMode::kCreateTruncate, DirectIo::kOff});
  return AtomicFileWriter(path, std::move(temporary), std::move(file));
}

AtomicFileWriter::AtomicFileWriter(std::filesystem::path path, std::filesystem::path temporary,
                                   FileHandle file)
    : path_(std::move(path)), temporary_(std::move(temporary)), file_(std::move(file)) {}

AtomicFileWriter::~AtomicFileWriter() {
  if (file_.valid()) {
    file_ = FileHandle();
    // A failure to remove changes nothing the caller can act on (the error that got us here,
    // if any, is the news).
    try {
      remove_entry(temporary_);
    } catch (const IoError&) {
    }
  }
}

void AtomicFileWriter::append(std::span<const std::byte> bytes) {
  STRATA_ASSERT(file_.valid(), "append after commit");
  file_.write_at(written_bytes_, bytes);
  written_bytes_ += bytes.size();
}

void AtomicFileWriter::write_at(std::uint64_t offset, std::span<const std::byte> bytes) {
  STRATA_ASSERT(file_.valid(), "write after commit");
  file_.write_at(offset, bytes);
  written_bytes_ = std::max(written_bytes_, offset + bytes.size());
}

void AtomicFileWriter::commit() {
  STRATA_ASSERT(file_.valid(), "commit twice");
  file_.sync();
  file_ = FileHandle();
  try {
    rename_entry(temporary_, path_);
  } catch (const IoError&) {
    try {
      remove_entry(temporary_);
    } catch (const IoError&) {
    }
    throw;
  }
  sync_directory(path_.has_parent_path() ? path_.parent_path() : std::filesystem::path("."));
}

void write_file_atomically(const std::filesystem::path& path,
                           std::span<const std::span<const std::uint8_t>> chunks) {
  AtomicFileWriter file = AtomicFileWriter::create(path);
  for (const std::span<const std::uint8_t> chunk : chunks) file.append(std::as_bytes(chunk));
  file.commit();
}

void write_file_atomically(const std::filesystem::path& path, std::string_view text) {
  const std::span<const std::uint8_t> chunks[] = {
      {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()}};
  write_file_atomically(path, chunks);
}

}  // namespace strata::io
