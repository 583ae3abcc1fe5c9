// PowerLossSimulator: what a power loss could leave on disk, for tests (the idea of TigerBeetle's
// storage simulator and of ALICE, "All File Systems Are Not Created Equal", OSDI '14).
//
// A SIGKILL leaves the page cache to the kernel, so every completed write survives it; a power
// loss keeps only what was made durable. While a simulator is alive, io/'s file layer reports to
// it every mutation under its root (io/detail/power_loss_hook.hpp): FileHandle creates, truncates,
// fallocates, writes and fsyncs, the engines' writes and fsyncs (after each system call that moved
// bytes), and directory entries created, renamed and removed (io/namespace_ops.hpp). Nothing is
// changed on the real disk; the simulator only keeps a log, with the bytes of every write.
//
// write_crash_image(n, seed, target) replays the first n operations of the log and writes, under
// `target`, a tree a power loss right after operation n could have left under `root`:
//   - a file's bytes are those it had at its last fsync, plus a seeded random subset of the
//     writes, truncates and fallocates made since (in their order), the last kept write torn:
//     only a prefix of it, a whole number of 512-byte sectors (possibly none), reaches the disk;
//   - a directory entry created, renamed or removed since the directory's last fsync may be
//     undone: of each directory's un-synced entry operations a seeded random prefix is kept (a
//     journaling file system commits metadata in order), so a create or rename not followed by a
//     directory fsync can vanish, along with what was written into the file;
//   - what was durable at operation n is always there, byte for byte.
// Each file operation chooses independently, so the image can mix files in any way an unordered
// write-back cache could. The same log, n and seed give the same image.
//
// Model limits (what the simulator does not cover): a rename is durable once its destination's
// directory is fsynced (strata renames only within one directory); fsync of a file does not make
// its directory entry durable (harsher than ext4, as POSIX allows); bytes of a durable write are
// never corrupted (bit rot is the fault injector's kFlipByteOnRead).
//
// Threading: the reports may come from any thread (a mutex orders them; operation numbers follow
// that order). One simulator may be alive at a time in a process; every engine and file writing
// under its root must be gone before it is destroyed (a report in flight would reach a dead
// object). write_crash_image may run while recording continues (its target must lie outside
// `root`). Paths are compared lexically after making them absolute: reach the root by one
// spelling (no symlink in between).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace strata::io {

enum class FileOpKind : std::uint8_t {
  kCreateFile,
  kCreateDirectory,
  kRename,
  kRemove,
  kTruncate,  // O_TRUNC of an existing file: size 0
  kAllocate,  // fallocate: the file grows to size_bytes (zeros), never shrinks
  kWrite,
  kFsync,  // of a file (its data) or of a directory (its entries)
};

// One recorded operation; paths are relative to the simulator's root.
struct FileOp {
  FileOpKind kind = FileOpKind::kWrite;
  std::filesystem::path path;
  std::filesystem::path to;  // kRename only
  std::uint64_t offset_bytes = 0;
  std::uint64_t size_bytes = 0;  // kAllocate
  std::vector<std::byte> data;   // kWrite
};

std::string describe(const FileOp& op);

// What one crash image lost, for tests to check the trials exercise every kind of loss.
struct CrashReport {
  std::uint64_t writes_pending = 0;  // writes not yet durable at the crash
  std::uint64_t writes_dropped = 0;
  std::uint64_t writes_torn = 0;
  std::uint64_t entries_pending = 0;  // entry operations not yet durable at the crash
  std::uint64_t entries_undone = 0;
};

// One name in a crash image: a directory, or a regular file with its bytes.
struct ImageEntry {
  bool directory = false;
  std::vector<std::byte> bytes;
};
// Paths relative to the root, parents before children (std::map's order does that).
using CrashImage = std::map<std::filesystem::path, ImageEntry>;

class PowerLossSimulator {
 public:
  // Installs this simulator and snapshots `root` (every file and directory under it counts as
  // durable). `root` must exist. No other simulator may be alive.
  explicit PowerLossSimulator(const std::filesystem::path& root);
  PowerLossSimulator(const PowerLossSimulator&) = delete;
  PowerLossSimulator& operator=(const PowerLossSimulator&) = delete;
  ~PowerLossSimulator();  // uninstalls

  // Operations recorded so far; a crash point is a number in [0, operations()].
  std::uint64_t operations() const;
  // A copy of the log (for messages and tests).
  std::vector<FileOp> log() const;
  // Stops recording: later operations happen after the power loss.
  void stop();

  // The tree a power loss right after the first `operations` recorded operations could leave
  // under the root, chosen by `seed` (see the file comment); what was lost is added to `report`.
  CrashImage crash_image(std::uint64_t operations, std::uint64_t seed, CrashReport& report) const;
  // The same image written under `target` (created; it must not exist and must lie outside the
  // root), for the code under test to reopen there.
  CrashReport write_crash_image(std::uint64_t operations, std::uint64_t seed,
                                const std::filesystem::path& target) const;

  const std::filesystem::path& root() const { return root_; }

  // Called by the hook (io/detail/power_loss_hook.cpp) with absolute or relative real paths;
  // those outside the root are ignored.
  void record(FileOp op);
  bool covers(const std::filesystem::path& path, std::filesystem::path& relative) const;

 private:
  std::filesystem::path root_;  // absolute, normalised
  struct Snapshot {
    std::vector<std::filesystem::path> directories;
    std::vector<std::pair<std::filesystem::path, std::vector<std::byte>>> files;
  } initial_;
  mutable std::mutex mutex_;
  std::vector<FileOp> log_;
  bool stopped_ = false;
};

}  // namespace strata::io
