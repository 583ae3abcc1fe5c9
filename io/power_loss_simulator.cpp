#include "io/power_loss_simulator.hpp"

#include <algorithm>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "base/assert.hpp"
#include "io/detail/crash_replay.hpp"
#include "io/detail/power_loss_hook.hpp"
#include "io/file_handle.hpp"
#include "io/whole_file.hpp"

namespace strata::io {
namespace {

std::filesystem::path normalised(const std::filesystem::path& path) {
  return std::filesystem::absolute(path).lexically_normal();
}

// Sets `relative` to `path` relative to `root` ("" for the root); false when it lies outside.
bool relative_to(const std::filesystem::path& root, const std::filesystem::path& path,
                 std::filesystem::path& relative) {
  std::filesystem::path rest = normalised(path).lexically_relative(root);
  if (rest.empty() || *rest.begin() == "..") return false;
  relative = rest == "." ? std::filesystem::path() : std::move(rest);
  return true;
}

const char* kind_name(FileOpKind kind) {
  switch (kind) {
    case FileOpKind::kCreateFile:
      return "create";
    case FileOpKind::kCreateDirectory:
      return "mkdir";
    case FileOpKind::kRename:
      return "rename";
    case FileOpKind::kRemove:
      return "remove";
    case FileOpKind::kTruncate:
      return "truncate";
    case FileOpKind::kAllocate:
      return "fallocate";
    case FileOpKind::kWrite:
      return "write";
    case FileOpKind::kFsync:
      return "fsync";
  }
  return "?";
}

// Writes only the blocks holding a non-zero byte: preallocated swap files are mostly zeros, and
// the trials write hundreds of images.
void write_sparse(const FileHandle& file, std::span<const std::byte> bytes) {
  constexpr std::size_t kBlockBytes = 4096;
  for (std::size_t at = 0; at < bytes.size(); at += kBlockBytes) {
    const std::span<const std::byte> block =
        bytes.subspan(at, std::min(kBlockBytes, bytes.size() - at));
    if (std::any_of(block.begin(), block.end(), [](std::byte b) { return b != std::byte{0}; })) {
      file.write_at(at, block);
    }
  }
}

void write_image(const CrashImage& image, const std::filesystem::path& target) {
  std::filesystem::create_directories(target);
  for (const auto& [path, entry] : image) {
    if (entry.directory) {
      std::filesystem::create_directory(target / path);
      continue;
    }
    const FileHandle file =
        FileHandle::open(target / path, {CreateMode::kCreateTruncate, DirectIo::kOff});
    write_sparse(file, entry.bytes);
    std::filesystem::resize_file(target / path, entry.bytes.size());
  }
}

}  // namespace

std::string describe(const FileOp& op) {
  switch (op.kind) {
    case FileOpKind::kRename:
      return "rename " + op.path.string() + " -> " + op.to.string();
    case FileOpKind::kAllocate:
      return "fallocate " + op.path.string() + " to " + std::to_string(op.size_bytes) + " bytes";
    case FileOpKind::kWrite:
      return "write " + op.path.string() + " [" + std::to_string(op.offset_bytes) + ", " +
             std::to_string(op.offset_bytes + op.data.size()) + ")";
    default:
      return std::string(kind_name(op.kind)) + " " + op.path.string();
  }
}

PowerLossSimulator::PowerLossSimulator(const std::filesystem::path& root)
    : root_(normalised(root)) {
  if (!std::filesystem::is_directory(root_)) {
    throw std::invalid_argument("PowerLossSimulator: root " + root_.string() +
                                " is not a directory");
  }
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root_)) {
    const std::filesystem::path relative = entry.path().lexically_relative(root_);
    if (entry.is_directory()) {
      initial_.directories.push_back(relative);
    } else if (entry.is_regular_file()) {
      const std::vector<std::uint8_t> bytes = read_file_bytes(entry.path());
      const auto* first = reinterpret_cast<const std::byte*>(bytes.data());
      initial_.files.emplace_back(relative, std::vector<std::byte>(first, first + bytes.size()));
    }
  }
  PowerLossSimulator* expected = nullptr;
  const bool installed = detail::g_power_loss.compare_exchange_strong(expected, this);
  STRATA_ASSERT(installed, "only one PowerLossSimulator may be alive at a time");
}

PowerLossSimulator::~PowerLossSimulator() {
  detail::g_power_loss.store(nullptr);
}

bool PowerLossSimulator::covers(const std::filesystem::path& path,
                                std::filesystem::path& relative) const {
  return relative_to(root_, path, relative);
}

void PowerLossSimulator::record(FileOp op) {
  std::lock_guard lock(mutex_);
  if (!stopped_) log_.push_back(std::move(op));
}

std::uint64_t PowerLossSimulator::operations() const {
  std::lock_guard lock(mutex_);
  return log_.size();
}

std::vector<FileOp> PowerLossSimulator::log() const {
  std::lock_guard lock(mutex_);
  return log_;
}

void PowerLossSimulator::stop() {
  std::lock_guard lock(mutex_);
  stopped_ = true;
}

CrashImage PowerLossSimulator::crash_image(std::uint64_t operations, std::uint64_t seed,
                                           CrashReport& report) const {
  // The replay points into the log: it is held still (and not copied) while it runs.
  std::lock_guard lock(mutex_);
  if (operations > log_.size()) {
    throw std::invalid_argument("PowerLossSimulator: crash after operation " +
                                std::to_string(operations) + ", but only " +
                                std::to_string(log_.size()) + " were recorded");
  }
  detail::CrashReplay replay(initial_.directories, initial_.files);
  for (std::uint64_t i = 0; i < operations; ++i) replay.apply(log_[i]);
  std::mt19937_64 random(seed);
  return replay.crash(random, report);
}

CrashReport PowerLossSimulator::write_crash_image(std::uint64_t operations, std::uint64_t seed,
                                                  const std::filesystem::path& target) const {
  std::filesystem::path inside;
  if (covers(target, inside)) {
    throw std::invalid_argument("PowerLossSimulator: the crash image's target " + target.string() +
                                " lies inside the recorded root " + root_.string());
  }
  if (std::filesystem::exists(target)) {
    throw std::invalid_argument("PowerLossSimulator: the crash image's target " + target.string() +
                                " already exists");
  }
  CrashReport report;
  write_image(crash_image(operations, seed, report), target);
  return report;
}

}  // namespace strata::io
