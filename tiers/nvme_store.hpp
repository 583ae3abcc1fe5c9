// NvmeStore: the crash-safe home of one rank's state on NVMe.
//
// Layout. The rank's swap files (one per configured path, "strata-rank<R>.swap") form one striped
// logical space (io::StripedFile). Every extent (one shard of one state kind of one unit) has a
// fixed place in it with two slots, A and B, each its length rounded up to 4 KiB. A write for step
// s goes to the slot that does not hold the extent's committed data, so the committed bytes are
// never overwritten before a newer commit names the other slot.
//
// Commit. commit(step) waits for the step's writes, fsyncs the swap files (when durable), then
// writes the manifest: extent names, lengths, committed slot, step and XXH3 checksum of each
// extent's bytes, closed by a checksum of the whole manifest. The manifest has two copies
// ("strata-rank<R>.manifest.0/.1", on the first path) written alternately and fsynced, so a torn
// manifest write leaves the other copy intact; opening picks the valid copy with the highest
// sequence number, unless the slots where it differs from the other valid copy fail their
// checksums: then it falls back to the other (so opening reads, once, the extents the newest
// commit changed). After a crash at any instant the store reopens at the last committed step.
//
// A failed manifest write or fsync leaves that manifest possibly durable while the commit failed:
// before any slot is written again the copy is overwritten with zeros and fsynced, so a manifest
// that may be on disk never names a slot being overwritten.
//
// The swap files' and manifests' directories are fsynced after opening (when durable), so the
// entries of newly created files survive a power loss.
//
// Verification. Every read is checked against the manifest's checksum; a mismatch is a
// StoreCorruption naming the file, offset, extent and step: corrupt bytes are never used. The
// hashing runs on the store's checksum thread (tiers/checksum_worker.hpp), overlapping the I/O and
// the caller's work: a write's ticket and a read's StoreRead complete once hashed / verified.
//
// Exclusion: the store holds an exclusive flock on "strata-rank<R>.lock" in the first path for its
// lifetime; a second store on the same paths and rank fails with StoreBusy before touching a file.
//
// Threading: one owner thread calls write/read/commit; tickets may be waited on from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/engine.hpp"
#include "io/aligned_buffer.hpp"
#include "io/file_handle.hpp"
#include "io/striped_file.hpp"
#include "io/ticket.hpp"
#include "tiers/checksum_worker.hpp"
#include "tiers/manifest.hpp"

namespace strata::tiers {

using ExtentId = std::uint32_t;

struct ExtentSpec {
  std::string name;            // unique, e.g. "h.3/exp_avg"
  std::uint64_t length_bytes;  // logical bytes; the slot is rounded up to 4 KiB
};

enum class StoreOpenMode : std::uint8_t {
  kCreate,          // start afresh (existing swap files and manifests are overwritten)
  kResume,          // reopen the committed store; an error if there is none
  kCreateOrResume,  // resume when a manifest exists, else create
};

struct NvmeStoreOptions {
  std::vector<std::filesystem::path> paths;  // directories, one per drive; at least one
  std::uint32_t rank = 0;
  std::uint32_t ranks = 1;
  bool durable = true;                  // fsync data before the manifest, and the manifest
  std::uint64_t stripe_unit_bytes = 0;  // 0: the engine's block size
  StoreOpenMode mode = StoreOpenMode::kCreateOrResume;
  // Host memory for copies of extents' newest bytes ([tiers.host] nvme_read_cache): an extent
  // gets one when it is first written and the bytes are left (first written, first cached; whole
  // slots), and its reads are then served from the copy. Writes still go to the drives, so the
  // committed state on NVMe is what it would be without the cache. 0: no cache.
  std::uint64_t read_cache_bytes = 0;
};

// A slot's bytes do not match their committed checksum, or a manifest is unusable.
class StoreCorruption : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Another store (another process, or another Engine in this one) holds these files: two runs
// sharing NVMe paths and a rank would overwrite each other's committed state.
class StoreBusy : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The store on disk was written for another model shape or rank count.
class StoreMismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class NvmeStore;

// A read in flight. wait() blocks until the bytes have landed and been verified against their
// checksum (by the store's checksum thread, tiers/checksum_worker.hpp), then throws
// StoreCorruption on a mismatch and rethrows any io::IoError.
class StoreRead {
 public:
  StoreRead() = default;
  void wait() { ticket_.get(); }
  bool poll() const { return ticket_.poll(); }

 private:
  friend class NvmeStore;
  io::Ticket ticket_;
};

class NvmeStore {
 public:
  // Opens the store for `extents` (the same list, in the same order, on every reopen).
  // Throws StoreMismatch when a resumed store was written for another layout, StoreCorruption when
  // no manifest copy is valid, io::IoError for file errors (path and errno named).
  NvmeStore(io::IoEngine& engine, const NvmeStoreOptions& options, std::vector<ExtentSpec> extents);
  NvmeStore(const NvmeStore&) = delete;
  NvmeStore& operator=(const NvmeStore&) = delete;
  ~NvmeStore();  // waits for writes in flight; never commits

  // True when the store was reopened at a committed step (kResume, or kCreateOrResume that found
  // a manifest).
  bool resumed() const { return resumed_; }
  // The last committed step; nullopt before the first commit.
  std::optional<std::uint64_t> committed_step() const { return committed_step_; }
  bool has_data(ExtentId extent) const;
  // Whether the extent has a write since the last commit (its newest bytes are uncommitted).
  bool has_pending(ExtentId extent) const;

  std::size_t extent_count() const { return extents_.size(); }
  const ExtentSpec& extent(ExtentId extent) const { return extents_[extent].spec; }
  std::optional<ExtentId> find(std::string_view name) const;
  // Bytes a read or write buffer of this extent must have: length rounded up to 4 KiB.
  std::uint64_t slot_bytes(ExtentId extent) const { return extents_[extent].slot_bytes; }

  // Writes `data` (slot_bytes long, 4 KiB aligned; bytes past the length are padding) to the slot
  // not holding the committed data. The buffer must live until the ticket completes. A second write
  // of the same extent before commit waits for the first and replaces it.
  // fixed_buffer_index: the engine's registered buffer holding `data` (io::IoRequest), if any.
  io::Ticket write(ExtentId extent, std::span<const std::byte> data,
                   std::optional<std::uint32_t> fixed_buffer_index = std::nullopt);
  // Reads the extent's newest bytes (written this step, else committed) into `buffer`.
  StoreRead read(ExtentId extent, std::span<std::byte> buffer,
                 std::optional<std::uint32_t> fixed_buffer_index = std::nullopt);

  // Drops the extent's write since the last commit (waiting for it first): its newest bytes are
  // the committed ones again, and the next write goes to the same free slot. What undoes a
  // speculative optimizer update (runtime/engine/speculation.hpp) exactly; a no-op without a write.
  void discard(ExtentId extent);

  // Makes every write since the last commit the committed state of `step`. On failure (a write
  // or the manifest failed) throws, and the previous commit stays the committed state.
  void commit(std::uint64_t step);

  // Byte counters; any thread may read them while the owner reads and writes (the Engine reports
  // a step's bytes while its update worker is already writing the next forward's units).
  std::uint64_t bytes_written() const { return bytes_written_.load(std::memory_order_relaxed); }
  std::uint64_t bytes_read() const {  // from the drives only
    return bytes_read_.load(std::memory_order_relaxed);
  }
  std::uint64_t bytes_read_from_cache() const {
    return bytes_read_from_cache_.load(std::memory_order_relaxed);
  }
  std::uint64_t read_cache_bytes_used() const {
    return cache_used_bytes_.load(std::memory_order_relaxed);
  }
  const std::vector<std::filesystem::path>& swap_files() const { return swap_paths_; }
  std::filesystem::path manifest_path(int copy) const;

 private:
  struct SlotState {
    bool has_data = false;
    std::uint8_t slot = 0;
    std::uint64_t step = 0;
    std::uint64_t checksum = 0;
  };
  struct Extent {
    ExtentSpec spec;
    std::uint64_t offset_bytes = 0;  // of slot A in the logical space; slot B follows
    std::uint64_t slot_bytes = 0;
    SlotState committed;
    std::optional<SlotState> pending;
    // The pending write's checksum, set by the checksum thread before pending_write completes.
    std::shared_ptr<std::uint64_t> pending_checksum;
    io::Ticket pending_write;
    // NvmeStoreOptions::read_cache_bytes: the newest bytes (pending, else committed) in host
    // memory once the extent was written with room left; empty otherwise.
    io::AlignedBuffer cached;
  };
  void keep_in_cache(Extent& extent, std::span<const std::byte> data);

  // The constructor's steps: extents_ laid out in the logical space (whose size it returns) and
  // the manifest's size; the lock taken (throws StoreBusy); whether to resume, by
  // options_.mode (throws StoreCorruption when resuming finds no manifest or a swap file gone).
  std::uint64_t lay_out_extents(std::vector<ExtentSpec> extents);
  void lock_store();
  bool should_resume() const;
  void create_files(std::uint64_t logical_bytes);
  void sync_directories();
  void invalidate_doubtful_manifest();
  bool load_manifest();  // false when no manifest exists
  // The copies that decode, newest sequence first; why the others do not, appended to `reasons`.
  std::vector<DecodedManifest> read_valid_manifests(std::string& reasons);
  void check_layout(const DecodedManifest& manifest) const;  // throws StoreMismatch
  // The first slot where `manifest` names bytes `other` does not and they fail their checksum
  // (described for a message); empty when all verify.
  std::string first_bad_slot(const DecodedManifest& manifest, const DecodedManifest& other);
  std::vector<std::byte> encode_manifest(std::uint64_t sequence, std::uint64_t step,
                                         const std::vector<SlotState>& states) const;
  std::uint64_t layout_hash() const;
  std::string describe(const Extent& extent, std::uint8_t slot) const;

  io::IoEngine* engine_;
  NvmeStoreOptions options_;
  std::vector<Extent> extents_;
  std::vector<std::filesystem::path> swap_paths_;
  std::optional<io::StripedFile> swap_;
  io::FileId manifest_files_[2] = {0, 0};
  std::uint64_t manifest_bytes_ = 0;                  // fixed size of each copy, 4 KiB multiple
  std::uint64_t manifest_sizes_on_disk_[2] = {0, 0};  // before opening grew them
  // flock'ed "strata-rank<R>.lock" on the first path, held for the store's life (and released
  // if the constructor throws, since members are destroyed then).
  io::FileHandle lock_;
  std::uint64_t manifest_sequence_ = 0;
  // A commit failed after its manifest write was issued: that copy may be durable (see write()).
  bool manifest_in_doubt_ = false;
  std::optional<std::uint64_t> committed_step_;
  bool resumed_ = false;
  std::atomic<std::uint64_t> bytes_written_ = 0;
  std::atomic<std::uint64_t> bytes_read_ = 0;
  std::atomic<std::uint64_t> bytes_read_from_cache_ = 0;
  std::atomic<std::uint64_t> cache_used_bytes_ = 0;  // changed by the owner only
  // XXH3 of writes and verification of reads, off the owner thread. Last: destroyed first, after
  // the destructor has waited for the writes.
  std::unique_ptr<ChecksumWorker> checksums_;
};

}  // namespace strata::tiers
