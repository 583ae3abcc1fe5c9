#include "io/detail/crash_replay.hpp"

#include <algorithm>
#include <cstring>
#include <optional>

#include "base/assert.hpp"

namespace strata::io::detail {
namespace {

// Torn writes reach the disk in whole sectors.
constexpr std::uint64_t kSectorBytes = 512;
constexpr std::uint32_t kNoNode = ~std::uint32_t{0};

bool within(const std::filesystem::path& path, const std::filesystem::path& base) {
  if (path == base) return true;
  const std::string& text = path.native();
  const std::string prefix = base.native() + "/";
  return !base.empty() && text.size() > prefix.size() &&
         text.compare(0, prefix.size(), prefix) == 0;
}

template <typename Map>
void erase_subtree(Map& names, const std::filesystem::path& path) {
  for (auto it = names.begin(); it != names.end();) {
    it = within(it->first, path) ? names.erase(it) : std::next(it);
  }
}

template <typename Map>
void move_subtree(Map& names, const std::filesystem::path& from, const std::filesystem::path& to) {
  std::vector<std::pair<std::filesystem::path, typename Map::mapped_type>> moved;
  for (auto it = names.begin(); it != names.end();) {
    if (!within(it->first, from)) {
      ++it;
      continue;
    }
    const std::filesystem::path rest = it->first.lexically_relative(from);
    moved.emplace_back(rest == "." ? to : to / rest, std::move(it->second));
    it = names.erase(it);
  }
  erase_subtree(names, to);  // rename replaces its target
  for (auto& [path, value] : moved) names.emplace(std::move(path), std::move(value));
}

void apply_to(std::vector<std::byte>& bytes, const FileOp& op, std::uint64_t write_bytes) {
  switch (op.kind) {
    case FileOpKind::kTruncate:
      bytes.clear();
      break;
    case FileOpKind::kAllocate:
      if (bytes.size() < op.size_bytes) bytes.resize(op.size_bytes, std::byte{0});
      break;
    case FileOpKind::kWrite:
      if (write_bytes == 0) break;
      if (bytes.size() < op.offset_bytes + write_bytes) {
        bytes.resize(op.offset_bytes + write_bytes, std::byte{0});
      }
      std::memcpy(bytes.data() + op.offset_bytes, op.data.data(), write_bytes);
      break;
    default:
      STRATA_ASSERT(false, "not a data operation");
  }
}

}  // namespace

CrashReplay::CrashReplay(
    const std::vector<std::filesystem::path>& directories,
    const std::vector<std::pair<std::filesystem::path, std::vector<std::byte>>>& files) {
  initial_[""] = add_node(true);
  for (const std::filesystem::path& directory : directories) initial_[directory] = add_node(true);
  for (const auto& [path, bytes] : files) {
    const NodeId node = add_node(false);
    nodes_[node].durable = bytes;
    initial_[path] = node;
  }
  live_ = initial_;
}

CrashReplay::NodeId CrashReplay::add_node(bool directory) {
  nodes_.push_back(Node{directory, {}, {}});
  return static_cast<NodeId>(nodes_.size() - 1);
}

CrashReplay::NodeId CrashReplay::parent_of(const std::filesystem::path& path) const {
  const auto found = live_.find(path.parent_path());
  return found == live_.end() ? kNoNode : found->second;
}

void CrashReplay::apply(const FileOp& op) {
  const auto found = live_.find(op.path);
  switch (op.kind) {
    case FileOpKind::kCreateFile:
    case FileOpKind::kCreateDirectory: {
      const NodeId node = add_node(op.kind == FileOpKind::kCreateDirectory);
      entries_.push_back({&op, parent_of(op.path), node});
      erase_subtree(live_, op.path);
      live_[op.path] = node;
      break;
    }
    case FileOpKind::kRename:
      entries_.push_back({&op, parent_of(op.to), kNoNode});
      move_subtree(live_, op.path, op.to);
      break;
    case FileOpKind::kRemove:
      entries_.push_back({&op, parent_of(op.path), kNoNode});
      erase_subtree(live_, op.path);
      break;
    case FileOpKind::kTruncate:
    case FileOpKind::kAllocate:
    case FileOpKind::kWrite:
      // A write through a descriptor whose name is gone changes nothing any name shows.
      if (found != live_.end()) nodes_[found->second].pending.push_back(&op);
      break;
    case FileOpKind::kFsync: {
      if (found == live_.end()) break;
      Node& node = nodes_[found->second];
      if (node.directory) {
        for (EntryOp& entry : entries_) entry.synced |= entry.parent == found->second;
      } else {
        for (const FileOp* pending : node.pending) {
          apply_to(node.durable, *pending, pending->data.size());
        }
        node.pending.clear();
      }
      break;
    }
  }
}

std::vector<std::byte> CrashReplay::crashed_bytes(const Node& node, std::mt19937_64& random,
                                                  CrashReport& report) const {
  // Per file: lose everything pending, keep everything, or a coin per operation, so that both
  // extremes come up often.
  const auto policy = std::uniform_int_distribution<int>(0, 2)(random);
  std::vector<bool> keep(node.pending.size());
  std::optional<std::size_t> last_write;
  for (std::size_t i = 0; i < node.pending.size(); ++i) {
    keep[i] = policy == 1 || (policy == 2 && std::bernoulli_distribution(0.5)(random));
    const bool is_write = node.pending[i]->kind == FileOpKind::kWrite;
    report.writes_pending += is_write ? 1 : 0;
    report.writes_dropped += is_write && !keep[i] ? 1 : 0;
    if (keep[i] && is_write) last_write = i;
  }
  std::vector<std::byte> bytes = node.durable;
  for (std::size_t i = 0; i < node.pending.size(); ++i) {
    if (!keep[i]) continue;
    const FileOp& op = *node.pending[i];
    std::uint64_t length = op.data.size();
    if (i == last_write && length > 0 && std::bernoulli_distribution(0.5)(random)) {
      const std::uint64_t sectors = length / kSectorBytes;
      const std::uint64_t whole = (length + kSectorBytes - 1) / kSectorBytes;
      // A strict prefix: at least one sector (or the sub-sector tail) does not land.
      length = std::uniform_int_distribution<std::uint64_t>(0, whole - 1)(random) * kSectorBytes;
      length = std::min(length, sectors * kSectorBytes);
      ++report.writes_torn;
    }
    apply_to(bytes, op, length);
  }
  return bytes;
}

void CrashReplay::apply_entry(Names& names, const EntryOp& entry) {
  const FileOp& op = *entry.op;
  const auto parent_exists = [&](const std::filesystem::path& path) {
    return path.parent_path().empty() || names.contains(path.parent_path());
  };
  switch (op.kind) {
    case FileOpKind::kCreateFile:
    case FileOpKind::kCreateDirectory:
      if (!parent_exists(op.path)) return;  // its directory was lost
      erase_subtree(names, op.path);
      names[op.path] = entry.node;
      return;
    case FileOpKind::kRename:
      if (names.contains(op.path) && parent_exists(op.to)) move_subtree(names, op.path, op.to);
      return;
    case FileOpKind::kRemove:
      erase_subtree(names, op.path);
      return;
    default:
      STRATA_ASSERT(false, "not an entry operation");
  }
}

CrashImage CrashReplay::crash(std::mt19937_64& random, CrashReport& report) const {
  // Directory entries: of each directory's un-synced operations, a random prefix survives.
  std::map<NodeId, std::vector<std::size_t>> unsynced;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (!entries_[i].synced) unsynced[entries_[i].parent].push_back(i);
  }
  std::vector<bool> keep(entries_.size(), true);
  for (const auto& [parent, list] : unsynced) {
    const std::size_t kept = std::uniform_int_distribution<std::size_t>(0, list.size())(random);
    for (std::size_t j = kept; j < list.size(); ++j) keep[list[j]] = false;
    report.entries_pending += list.size();
    report.entries_undone += list.size() - kept;
  }
  Names names = initial_;
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    if (keep[i]) apply_entry(names, entries_[i]);
  }
  CrashImage image;
  for (const auto& [path, node] : names) {
    if (path.empty()) continue;  // the root itself
    ImageEntry entry{nodes_[node].directory, {}};
    if (!entry.directory) entry.bytes = crashed_bytes(nodes_[node], random, report);
    image.emplace(path, std::move(entry));
  }
  return image;
}

}  // namespace strata::io::detail
