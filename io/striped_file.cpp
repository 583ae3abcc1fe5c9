#include "io/striped_file.hpp"

#include <algorithm>

#include "base/assert.hpp"

namespace strata::io {

StripedFile::StripedFile(IoEngine& engine, std::vector<FileId> files,
                         std::uint64_t stripe_unit_bytes)
    : engine_(&engine),
      files_(std::move(files)),
      stripe_unit_bytes_(stripe_unit_bytes == 0 ? engine.options().block_size_bytes
                                                : stripe_unit_bytes) {
  STRATA_ASSERT(!files_.empty());
  STRATA_ASSERT(stripe_unit_bytes_ > 0 && is_aligned(stripe_unit_bytes_, kDirectIoAlignment),
                "stripe unit must be a multiple of 4 KiB");
}

StripedFile StripedFile::create(IoEngine& engine, std::span<const std::filesystem::path> paths,
                                std::uint64_t size_bytes, std::uint64_t stripe_unit_bytes) {
  STRATA_ASSERT(!paths.empty());
  const std::uint64_t unit =
      stripe_unit_bytes == 0 ? engine.options().block_size_bytes : stripe_unit_bytes;
  const std::uint64_t units = (size_bytes + unit - 1) / unit;
  const std::uint64_t per_file_bytes = (units + paths.size() - 1) / paths.size() * unit;
  std::vector<FileId> files;
  files.reserve(paths.size());
  for (const std::filesystem::path& path : paths) {
    files.push_back(engine.open_file(path, per_file_bytes));
  }
  return StripedFile(engine, std::move(files), unit);
}

StripedFile::Location StripedFile::locate(std::uint64_t logical_offset_bytes) const {
  const std::uint64_t unit = logical_offset_bytes / stripe_unit_bytes_;
  return {static_cast<std::uint32_t>(unit % files_.size()),
          unit / files_.size() * stripe_unit_bytes_ + logical_offset_bytes % stripe_unit_bytes_};
}

Ticket StripedFile::read(std::uint64_t offset_bytes, std::span<std::byte> buffer,
                         std::optional<std::uint32_t> fixed_buffer_index) {
  return submit(IoOp::kRead, offset_bytes, buffer, fixed_buffer_index);
}

Ticket StripedFile::write(std::uint64_t offset_bytes, std::span<const std::byte> buffer,
                          std::optional<std::uint32_t> fixed_buffer_index) {
  const IoRequest as_request = IoRequest::write(0, 0, buffer);
  return submit(IoOp::kWrite, offset_bytes, as_request.buffer, fixed_buffer_index);
}

Ticket StripedFile::sync() {
  std::vector<IoRequest> requests;
  requests.reserve(files_.size());
  for (FileId file : files_) {
    requests.push_back(IoRequest::fsync(file));
  }
  return engine_->submit(requests);
}

Ticket StripedFile::submit(IoOp op, std::uint64_t offset_bytes, std::span<std::byte> buffer,
                           std::optional<std::uint32_t> fixed_buffer_index) {
  // One request per stripe unit touched; the engine splits units larger than its block size.
  std::vector<IoRequest> requests;
  requests.reserve(buffer.size() / stripe_unit_bytes_ + 2);
  std::uint64_t done = 0;
  while (done < buffer.size()) {
    const std::uint64_t logical = offset_bytes + done;
    const std::uint64_t in_unit = stripe_unit_bytes_ - logical % stripe_unit_bytes_;
    const std::uint64_t length = std::min<std::uint64_t>(in_unit, buffer.size() - done);
    const Location where = locate(logical);
    requests.push_back({op, files_[where.file_index], where.offset_bytes,
                        buffer.subspan(done, length), fixed_buffer_index});
    done += length;
  }
  return engine_->submit(requests);
}

}  // namespace strata::io
