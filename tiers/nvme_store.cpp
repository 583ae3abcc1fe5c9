#include "tiers/nvme_store.hpp"

#include <algorithm>
#include <cstring>
#include <variant>

#include <fmt/format.h>
#include <xxhash.h>

#include "base/assert.hpp"
#include "base/units.hpp"
#include "io/aligned_buffer.hpp"
#include "io/file_handle.hpp"
#include "io/io_error.hpp"
#include "io/io_request.hpp"
#include "tiers/checksum.hpp"
#include "tiers/manifest.hpp"

namespace strata::tiers {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'M', 'F'};
constexpr std::uint32_t kVersion = 1;
constexpr std::uint64_t kNoStep = ~std::uint64_t{0};
// magic, version, rank, ranks, extent count, sequence, step, layout hash, body bytes
constexpr std::size_t kHeaderBytes = 8 + 4 * 4 + 8 * 4;
constexpr std::size_t kTrailerBytes = 8;
// name length, length, has_data, slot, step, checksum; the name's bytes follow the name length.
constexpr std::uint64_t kRecordBytesBesidesName = 2 + 8 + 1 + 1 + 8 + 8;

std::uint64_t checksum(std::span<const std::byte> bytes) { return xxh3(bytes); }

// Little-endian field writer/reader over a byte buffer (the manifest is written and read on the
// same kind of machine; x86-64 and Arm64 are both little-endian).
class Writer {
 public:
  explicit Writer(std::vector<std::byte>& out) : out_(out) {}
  template <typename T>
  void put(T value) {
    put_bytes(&value, sizeof(T));
  }
  // resize + memcpy rather than insert: GCC 12 warns falsely about insert of byte ranges at -O3.
  void put_bytes(const void* data, std::size_t size) {
    const std::size_t at = out_.size();
    out_.resize(at + size);
    if (size != 0) std::memcpy(out_.data() + at, data, size);
  }

 private:
  std::vector<std::byte>& out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}
  template <typename T>
  bool get(T& value) {
    if (position_ + sizeof(T) > in_.size()) return false;
    std::memcpy(&value, in_.data() + position_, sizeof(T));
    position_ += sizeof(T);
    return true;
  }
  bool get_string(std::size_t size, std::string& out) {
    if (position_ + size > in_.size()) return false;
    out.assign(reinterpret_cast<const char*>(in_.data() + position_), size);
    position_ += size;
    return true;
  }
  std::size_t position() const { return position_; }

 private:
  std::span<const std::byte> in_;
  std::size_t position_ = 0;
};

}  // namespace

std::variant<DecodedManifest, std::string> decode_manifest(std::span<const std::byte> bytes) {
  Reader reader(bytes);
  char magic[8];
  for (char& c : magic) {
    if (!reader.get(c)) return std::string("it is shorter than a manifest header (truncated)");
  }
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return std::string("it does not start with a strata manifest header (empty or overwritten)");
  }
  DecodedManifest manifest;
  std::uint32_t version = 0;
  std::uint32_t count = 0;
  std::uint64_t body_bytes = 0;
  if (!reader.get(version) || !reader.get(manifest.rank) || !reader.get(manifest.ranks) ||
      !reader.get(count) || !reader.get(manifest.sequence) || !reader.get(manifest.step) ||
      !reader.get(manifest.layout_hash) || !reader.get(body_bytes)) {
    return std::string("its header is truncated");
  }
  if (version != kVersion)
    return fmt::format("it has format version {}, expected {}", version, kVersion);
  // (Written so that a huge claimed size cannot wrap around: found writing the manifest fuzzer.)
  if (body_bytes < kHeaderBytes || body_bytes > bytes.size() ||
      bytes.size() - body_bytes < kTrailerBytes) {
    return fmt::format("it claims {} bytes but holds {} (truncated)", body_bytes, bytes.size());
  }
  std::uint64_t stored = 0;
  std::memcpy(&stored, bytes.data() + body_bytes, sizeof(stored));
  if (stored != checksum(bytes.first(body_bytes))) {
    return std::string("its checksum does not match (torn or corrupted write)");
  }
  // Every record takes at least 28 bytes: a count the body cannot hold is refused before
  // anything is allocated for it (found writing tests/fuzz/manifest_fuzz.cpp).
  if (count > (body_bytes - kHeaderBytes) / kRecordBytesBesidesName) {
    return fmt::format("it claims {} extent records but its body holds at most {}", count,
                       (body_bytes - kHeaderBytes) / kRecordBytesBesidesName);
  }
  manifest.records.resize(count);
  for (DecodedManifest::Record& record : manifest.records) {
    std::uint16_t name_bytes = 0;
    if (!reader.get(name_bytes) || !reader.get_string(name_bytes, record.name) ||
        !reader.get(record.length) || !reader.get(record.has_data) || !reader.get(record.slot) ||
        !reader.get(record.step) || !reader.get(record.checksum) || record.slot > 1) {
      return std::string("an extent record is malformed");
    }
  }
  if (reader.position() != body_bytes) return std::string("its extent records do not add up");
  return manifest;
}

NvmeStore::NvmeStore(io::IoEngine& engine, const NvmeStoreOptions& options,
                     std::vector<ExtentSpec> extents)
    : engine_(&engine), options_(options) {
  if (options_.paths.empty()) {
    throw std::invalid_argument("NvmeStore: no NVMe paths configured ([tiers.nvme] paths)");
  }
  STRATA_ASSERT(options_.rank < options_.ranks, "rank out of range");
  checksums_ = std::make_unique<ChecksumWorker>(2 * extents.size() + 2);
  const std::uint64_t logical_bytes = lay_out_extents(std::move(extents));
  for (const auto& dir : options_.paths) {
    swap_paths_.push_back(dir / fmt::format("strata-rank{}.swap", options_.rank));
  }
  lock_store();
  const bool resume = should_resume();
  for (int copy = 0; copy < 2; ++copy) {
    std::error_code ignored;
    const std::uintmax_t size = std::filesystem::file_size(manifest_path(copy), ignored);
    manifest_sizes_on_disk_[copy] = size == static_cast<std::uintmax_t>(-1) ? 0 : size;
  }
  create_files(logical_bytes);
  if (resume) resumed_ = load_manifest();
}

std::uint64_t NvmeStore::lay_out_extents(std::vector<ExtentSpec> extents) {
  std::uint64_t offset = 0;
  for (ExtentSpec& spec : extents) {
    Extent extent;
    extent.slot_bytes = round_up(std::max<std::uint64_t>(spec.length_bytes, 1), kDirectIoAlignment);
    extent.offset_bytes = offset;
    offset += 2 * extent.slot_bytes;
    extent.spec = std::move(spec);
    extents_.push_back(std::move(extent));
  }
  for (std::size_t i = 0; i < extents_.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      STRATA_ASSERT(extents_[i].spec.name != extents_[j].spec.name, "duplicate extent name");
    }
  }
  std::uint64_t manifest_body = kHeaderBytes + kTrailerBytes;
  for (const Extent& extent : extents_)
    manifest_body += kRecordBytesBesidesName + extent.spec.name.size();
  manifest_bytes_ = round_up(manifest_body, kDirectIoAlignment);
  return offset;
}

void NvmeStore::lock_store() {
  // Exclusive use of these files before any of them is opened (kCreate truncates).
  const std::filesystem::path lock_path =
      options_.paths.front() / fmt::format("strata-rank{}.lock", options_.rank);
  lock_ = io::FileHandle::open(lock_path, {io::CreateMode::kCreate, io::DirectIo::kOff});
  if (!lock_.try_lock_exclusive()) {
    throw StoreBusy(fmt::format(
        "the NVMe store of rank {} at {} is in use by another strata run "
        "(another process, or another Engine in this one): two runs must not share [tiers.nvme] "
        "paths",
        options_.rank, options_.paths.front().string()));
  }
}

bool NvmeStore::should_resume() const {
  const bool manifest_exists =
      std::filesystem::exists(manifest_path(0)) || std::filesystem::exists(manifest_path(1));
  bool resume = false;
  switch (options_.mode) {
    case StoreOpenMode::kCreate:
      resume = false;
      break;
    case StoreOpenMode::kResume:
      if (!manifest_exists) {
        throw StoreCorruption(fmt::format("cannot resume: no store manifest at {} or {}",
                                          manifest_path(0).string(), manifest_path(1).string()));
      }
      resume = true;
      break;
    case StoreOpenMode::kCreateOrResume:
      resume = manifest_exists;
      break;
  }
  if (resume) {
    for (const auto& path : swap_paths_) {
      if (!std::filesystem::exists(path)) {
        throw StoreCorruption(
            fmt::format("cannot resume: the manifest exists but swap file {} "
                        "is missing",
                        path.string()));
      }
    }
  }
  return resume;
}

NvmeStore::~NvmeStore() {
  for (Extent& extent : extents_) {
    if (extent.pending_write.valid()) extent.pending_write.wait();
  }
}

std::filesystem::path NvmeStore::manifest_path(int copy) const {
  return options_.paths.front() / fmt::format("strata-rank{}.manifest.{}", options_.rank, copy);
}

void NvmeStore::create_files(std::uint64_t logical_bytes) {
  const io::CreateMode mode = options_.mode == StoreOpenMode::kCreate
                                  ? io::CreateMode::kCreateTruncate
                                  : io::CreateMode::kCreate;
  const std::uint64_t unit = options_.stripe_unit_bytes != 0 ? options_.stripe_unit_bytes
                                                             : engine_->options().block_size_bytes;
  const std::uint64_t units = (logical_bytes + unit - 1) / unit;
  const std::uint64_t per_file = (units + swap_paths_.size() - 1) / swap_paths_.size() * unit;
  std::vector<io::FileId> files;
  for (const auto& path : swap_paths_) files.push_back(engine_->open_file(path, per_file, mode));
  swap_.emplace(*engine_, std::move(files), unit);
  for (int copy = 0; copy < 2; ++copy) {
    manifest_files_[copy] = engine_->open_file(manifest_path(copy), manifest_bytes_, mode);
  }
  if (options_.durable) sync_directories();
}

void NvmeStore::sync_directories() {
  // The files may have just been created: without an fsync of their directories a power loss can
  // drop the entries, and with them every commit made into the files. Through the engine (not
  // io::sync_directory) so its fault injector sees, and can fail, these fsyncs too.
  std::vector<std::filesystem::path> synced;
  for (const std::filesystem::path& directory : options_.paths) {
    if (std::find(synced.begin(), synced.end(), directory) != synced.end()) continue;
    synced.push_back(directory);
    engine_->sync(engine_->add_file(io::FileHandle::open_directory(directory))).get();
  }
}

std::uint64_t NvmeStore::layout_hash() const {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  for (const Extent& extent : extents_) {
    XXH3_64bits_update(state, extent.spec.name.data(), extent.spec.name.size());
    XXH3_64bits_update(state, &extent.spec.length_bytes, sizeof(extent.spec.length_bytes));
  }
  const std::uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash;
}

std::vector<std::byte> NvmeStore::encode_manifest(std::uint64_t sequence, std::uint64_t step,
                                                  const std::vector<SlotState>& states) const {
  std::vector<std::byte> out;
  out.reserve(manifest_bytes_);
  Writer writer(out);
  writer.put_bytes(kMagic, sizeof(kMagic));
  writer.put(kVersion);
  writer.put(options_.rank);
  writer.put(options_.ranks);
  writer.put(static_cast<std::uint32_t>(extents_.size()));
  writer.put(sequence);
  writer.put(step);
  writer.put(layout_hash());
  const std::size_t body_at = out.size();
  writer.put(std::uint64_t{0});  // body bytes, patched below
  for (std::size_t i = 0; i < extents_.size(); ++i) {
    const std::string& name = extents_[i].spec.name;
    writer.put(static_cast<std::uint16_t>(name.size()));
    writer.put_bytes(name.data(), name.size());
    writer.put(extents_[i].spec.length_bytes);
    writer.put(static_cast<std::uint8_t>(states[i].has_data));
    writer.put(states[i].slot);
    writer.put(states[i].step);
    writer.put(states[i].checksum);
  }
  const std::uint64_t body_bytes = out.size();
  std::memcpy(out.data() + body_at, &body_bytes, sizeof(body_bytes));
  writer.put(checksum(std::span(out).first(body_bytes)));
  STRATA_ASSERT(out.size() <= manifest_bytes_, "manifest larger than its reserved size");
  out.resize(manifest_bytes_, std::byte{0});
  return out;
}

std::vector<DecodedManifest> NvmeStore::read_valid_manifests(std::string& reasons) {
  io::AlignedBuffer buffer = io::AlignedBuffer::allocate(manifest_bytes_);
  std::vector<DecodedManifest> valid;
  for (int copy = 0; copy < 2; ++copy) {
    if (manifest_sizes_on_disk_[copy] < manifest_bytes_) {
      reasons +=
          fmt::format("; {}: it has {} bytes, not {} (truncated or missing)",
                      manifest_path(copy).string(), manifest_sizes_on_disk_[copy], manifest_bytes_);
      continue;
    }
    engine_->submit(io::IoRequest::read(manifest_files_[copy], 0, buffer.span())).get();
    auto decoded = decode_manifest(buffer.span());
    if (auto* reason = std::get_if<std::string>(&decoded)) {
      reasons += fmt::format("; {}: {}", manifest_path(copy).string(), *reason);
      continue;
    }
    valid.push_back(std::move(std::get<DecodedManifest>(decoded)));
  }
  std::sort(valid.begin(), valid.end(),
            [](const auto& a, const auto& b) { return a.sequence > b.sequence; });
  return valid;
}

void NvmeStore::check_layout(const DecodedManifest& manifest) const {
  if (manifest.ranks != options_.ranks || manifest.rank != options_.rank) {
    throw StoreMismatch(
        fmt::format("the NVMe store at {} was written by rank {} of {} ranks; this "
                    "run is rank {} of {}",
                    options_.paths.front().string(), manifest.rank, manifest.ranks, options_.rank,
                    options_.ranks));
  }
  if (manifest.records.size() != extents_.size()) {
    throw StoreMismatch(
        fmt::format("the NVMe store at {} holds {} extents; this model needs {} "
                    "(another model shape, or other state kinds: another optimizer type, placement "
                    "or [optimizer] master_rounding)",
                    options_.paths.front().string(), manifest.records.size(), extents_.size()));
  }
  for (std::size_t i = 0; i < extents_.size(); ++i) {
    const DecodedManifest::Record& record = manifest.records[i];
    const ExtentSpec& spec = extents_[i].spec;
    if (record.name != spec.name || record.length != spec.length_bytes) {
      throw StoreMismatch(
          fmt::format("the NVMe store at {} has extent {} '{}' of {} bytes; this "
                      "model needs '{}' of {} bytes (another model shape or dtype)",
                      options_.paths.front().string(), i, record.name, record.length, spec.name,
                      spec.length_bytes));
    }
  }
  STRATA_ASSERT(manifest.layout_hash == layout_hash(), "layout hash differs for an equal layout");
}

std::string NvmeStore::first_bad_slot(const DecodedManifest& manifest,
                                      const DecodedManifest& other) {
  for (std::size_t i = 0; i < extents_.size(); ++i) {
    const DecodedManifest::Record& record = manifest.records[i];
    const DecodedManifest::Record& theirs = other.records[i];
    if (record.has_data == 0 || (theirs.has_data != 0 && theirs.slot == record.slot &&
                                 theirs.checksum == record.checksum)) {
      continue;  // nothing to read, or the same bytes both name
    }
    const Extent& extent = extents_[i];
    io::AlignedBuffer buffer = io::AlignedBuffer::allocate(extent.slot_bytes);
    swap_->read(extent.offset_bytes + record.slot * extent.slot_bytes, buffer.span()).get();
    if (checksum(buffer.span().first(extent.spec.length_bytes)) != record.checksum) {
      return describe(extent, record.slot);
    }
  }
  return {};
}

bool NvmeStore::load_manifest() {
  std::string reasons;
  const std::vector<DecodedManifest> valid = read_valid_manifests(reasons);
  if (valid.empty()) {
    throw StoreCorruption(
        fmt::format("no valid store manifest for rank {}{}", options_.rank, reasons));
  }
  for (const DecodedManifest& manifest : valid) check_layout(manifest);
  // With two valid copies, the newer is taken only if the slots where it differs from the older
  // hold its bytes: a commit whose manifest reached the disk though its fsync failed, followed by
  // writes into its slots (or a lost data write), falls back to the older commit, whose slots
  // were never written after it.
  std::size_t chosen = 0;
  if (valid.size() == 2) {
    const std::string newer_bad = first_bad_slot(valid[0], valid[1]);
    if (!newer_bad.empty()) {
      const std::string older_bad = first_bad_slot(valid[1], valid[0]);
      if (!older_bad.empty()) {
        throw StoreCorruption(fmt::format(
            "neither store manifest of rank {} matches the data: sequence {} (step {}) fails its "
            "checksum in {}, sequence {} (step {}) in {}",
            options_.rank, valid[0].sequence, valid[0].step, newer_bad, valid[1].sequence,
            valid[1].step, older_bad));
      }
      chosen = 1;
    }
  }
  const DecodedManifest& best = valid[chosen];
  for (std::size_t i = 0; i < extents_.size(); ++i) {
    const DecodedManifest::Record& record = best.records[i];
    extents_[i].committed = {record.has_data != 0, record.slot, record.step, record.checksum};
  }
  // After a fallback the rejected copy still decodes and names slots the next step writes:
  // invalidated before the first write, then the next commit overwrites it.
  manifest_sequence_ = best.sequence;
  manifest_in_doubt_ = chosen == 1;
  if (best.step != kNoStep) committed_step_ = best.step;
  return true;
}

bool NvmeStore::has_data(ExtentId id) const {
  const Extent& extent = extents_[id];
  return extent.committed.has_data || extent.pending.has_value();
}

bool NvmeStore::has_pending(ExtentId id) const { return extents_[id].pending.has_value(); }

void NvmeStore::discard(ExtentId id) {
  Extent& extent = extents_[id];
  // The slot may be written again at once: the discarded write must not still be landing there.
  if (extent.pending_write.valid()) extent.pending_write.wait();
  extent.pending.reset();
  extent.pending_write = io::Ticket();
  extent.pending_checksum.reset();
  // The read cache holds the discarded bytes: the committed ones are read from the drive again
  // (the extent is cached anew by its next write).
  if (extent.cached.size() > 0) {
    cache_used_bytes_ -= extent.slot_bytes;
    extent.cached = io::AlignedBuffer();
  }
}

std::optional<ExtentId> NvmeStore::find(std::string_view name) const {
  for (std::size_t i = 0; i < extents_.size(); ++i) {
    if (extents_[i].spec.name == name) return static_cast<ExtentId>(i);
  }
  return std::nullopt;
}

std::string NvmeStore::describe(const Extent& extent, std::uint8_t slot) const {
  const std::uint64_t offset = extent.offset_bytes + slot * extent.slot_bytes;
  const io::StripedFile::Location location = swap_->locate(offset);
  return fmt::format("extent '{}' slot {} ({} at offset {})", extent.spec.name,
                     slot == 0 ? 'A' : 'B', swap_paths_[location.file_index].string(),
                     location.offset_bytes);
}

io::Ticket NvmeStore::write(ExtentId id, std::span<const std::byte> data,
                            std::optional<std::uint32_t> fixed_buffer_index) {
  Extent& extent = extents_[id];
  STRATA_ASSERT(data.size() == extent.slot_bytes, "write buffer must be slot_bytes long");
  // A failed commit may have left a durable manifest naming the slot about to be written.
  if (manifest_in_doubt_) invalidate_doubtful_manifest();
  // Replacing a pending write: let the first finish so the two never race on one slot.
  if (extent.pending_write.valid()) extent.pending_write.wait();
  SlotState next;
  next.has_data = true;
  next.slot = extent.committed.has_data ? static_cast<std::uint8_t>(1 - extent.committed.slot) : 0;
  const std::uint64_t offset = extent.offset_bytes + next.slot * extent.slot_bytes;
  extent.pending = next;  // its checksum is copied in at commit, from pending_checksum
  extent.pending_checksum = std::make_shared<std::uint64_t>(0);
  extent.pending_write =
      checksums_->hash_write(swap_->write(offset, data, fixed_buffer_index),
                             data.first(extent.spec.length_bytes), extent.pending_checksum);
  bytes_written_ += data.size();
  keep_in_cache(extent, data);
  return extent.pending_write;
}

// The copy is taken now, on the owner thread: the caller's buffer holds its final bytes when it
// calls write(), and a later read must see them whether or not the drive has.
void NvmeStore::keep_in_cache(Extent& extent, std::span<const std::byte> data) {
  if (extent.cached.size() == 0) {
    if (cache_used_bytes_ + extent.slot_bytes > options_.read_cache_bytes) return;
    extent.cached = io::AlignedBuffer::allocate(extent.slot_bytes);
    cache_used_bytes_ += extent.slot_bytes;
  }
  std::memcpy(extent.cached.data(), data.data(), extent.slot_bytes);
}

StoreRead NvmeStore::read(ExtentId id, std::span<std::byte> buffer,
                          std::optional<std::uint32_t> fixed_buffer_index) {
  Extent& extent = extents_[id];
  STRATA_ASSERT(buffer.size() == extent.slot_bytes, "read buffer must be slot_bytes long");
  if (extent.cached.size() > 0) {  // the newest bytes, as written: no drive, nothing to verify
    std::memcpy(buffer.data(), extent.cached.data(), extent.slot_bytes);
    bytes_read_from_cache_ += buffer.size();
    auto done = std::make_shared<io::detail::TicketState>(1);
    done->complete_piece(buffer.size(), nullptr);
    StoreRead read;
    read.ticket_ = io::Ticket(std::move(done));
    return read;
  }
  if (extent.pending_write.valid()) extent.pending_write.get();  // read your own writes
  const std::optional<SlotState>& newest =
      extent.pending ? extent.pending : std::optional(extent.committed);
  if (!newest->has_data) {
    throw std::logic_error(
        fmt::format("extent '{}' was read before anything was written to it", extent.spec.name));
  }
  // A pending write's checksum was set before its ticket completed (waited for above).
  auto expected = std::make_shared<const std::uint64_t>(extent.pending ? *extent.pending_checksum
                                                                       : newest->checksum);
  StoreRead read;
  read.ticket_ = checksums_->verify_read(
      swap_->read(extent.offset_bytes + newest->slot * extent.slot_bytes, buffer,
                  fixed_buffer_index),
      std::span<const std::byte>(buffer).first(extent.spec.length_bytes), std::move(expected),
      fmt::format(
          "{} committed at step {}", describe(extent, newest->slot),
          extent.pending ? std::string("(this step, uncommitted)") : std::to_string(newest->step)));
  bytes_read_ += buffer.size();
  return read;
}

void NvmeStore::invalidate_doubtful_manifest() {
  // The copy the failed commit wrote (the next sequence's) is overwritten with zeros, which no
  // decoder accepts, and made durable: then only the committed manifest can name slots, and the
  // slots it names are never the ones written next. If this fails too, write() throws before
  // touching any slot and the store stays in doubt.
  const io::FileId file = manifest_files_[(manifest_sequence_ + 1) % 2];
  const io::AlignedBuffer zeros = io::AlignedBuffer::allocate(manifest_bytes_);  // zeroed
  engine_->submit(io::IoRequest::write(file, 0, zeros.span())).get();
  if (options_.durable) engine_->sync(file).get();
  manifest_in_doubt_ = false;
}

void NvmeStore::commit(std::uint64_t step) {
  // 1. Every write of this step must have landed; a failed one fails the commit.
  std::exception_ptr failure;
  for (Extent& extent : extents_) {
    if (!extent.pending_write.valid()) continue;
    extent.pending_write.wait();
    if (!extent.pending_write.ok() && !failure) failure = extent.pending_write.error();
    if (extent.pending) extent.pending->checksum = *extent.pending_checksum;
  }
  if (failure) std::rethrow_exception(failure);
  // 2. Data durable before any manifest names it.
  if (options_.durable) swap_->sync().get();
  // 3. The manifest copy not holding the newest commit, then its fsync.
  std::vector<SlotState> states;
  states.reserve(extents_.size());
  for (const Extent& extent : extents_) {
    SlotState state = extent.pending ? *extent.pending : extent.committed;
    if (extent.pending) state.step = step;
    states.push_back(state);
  }
  const std::uint64_t sequence = manifest_sequence_ + 1;
  const std::vector<std::byte> encoded = encode_manifest(sequence, step, states);
  io::AlignedBuffer buffer = io::AlignedBuffer::allocate(encoded.size());
  std::memcpy(buffer.data(), encoded.data(), encoded.size());
  const io::FileId file = manifest_files_[sequence % 2];
  try {
    engine_->submit(io::IoRequest::write(file, 0, buffer.span())).get();
    if (options_.durable) engine_->sync(file).get();
  } catch (...) {
    // A failed write or fsync says nothing of what reached the disk: this manifest may be durable
    // and name the slots just written. Until it is invalidated no slot may be written again.
    manifest_in_doubt_ = true;
    throw;
  }
  manifest_in_doubt_ = false;
  // 4. Only now is the step committed in memory too.
  manifest_sequence_ = sequence;
  committed_step_ = step;
  for (std::size_t i = 0; i < extents_.size(); ++i) {
    extents_[i].committed = states[i];
    extents_[i].pending.reset();
    extents_[i].pending_write = io::Ticket();
    extents_[i].pending_checksum.reset();
  }
}

}  // namespace strata::tiers
