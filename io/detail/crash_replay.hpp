// CrashReplay: the file-system model behind PowerLossSimulator::write_crash_image. It replays a
// log of FileOps over the snapshot the simulator took, keeping for every file (an inode: renames
// move it, they do not copy it) its durable bytes and the operations since its last fsync, and for
// every directory-entry operation whether its directory has been fsynced since. crash() then
// draws, with a seeded generator, what a power loss at that point leaves.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "io/power_loss_simulator.hpp"

namespace strata::io::detail {

class CrashReplay {
 public:
  CrashReplay(const std::vector<std::filesystem::path>& directories,
              const std::vector<std::pair<std::filesystem::path, std::vector<std::byte>>>& files);

  // `op` must outlive this object (the pending operations point at it).
  void apply(const FileOp& op);
  CrashImage crash(std::mt19937_64& random, CrashReport& report) const;

 private:
  using NodeId = std::uint32_t;
  using Names = std::map<std::filesystem::path, NodeId>;  // "" names the root
  struct Node {
    bool directory = false;
    std::vector<std::byte> durable;
    std::vector<const FileOp*> pending;  // writes, truncates, fallocates since the last fsync
  };
  struct EntryOp {
    const FileOp* op;
    NodeId parent;  // the directory whose fsync makes it durable
    NodeId node;    // what a create made
    bool synced = false;
  };

  NodeId add_node(bool directory);
  NodeId parent_of(const std::filesystem::path& path) const;
  std::vector<std::byte> crashed_bytes(const Node& node, std::mt19937_64& random,
                                       CrashReport& report) const;
  static void apply_entry(Names& names, const EntryOp& entry);

  std::vector<Node> nodes_;
  Names initial_;
  Names live_;
  std::vector<EntryOp> entries_;
};

}  // namespace strata::io::detail
