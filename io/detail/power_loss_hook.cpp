#include "io/detail/power_loss_hook.hpp"

#include <utility>

#include "io/power_loss_simulator.hpp"

namespace strata::io::detail {
namespace {

FileOp op_of(FileOpKind kind) {
  FileOp op;
  op.kind = kind;
  return op;
}

// Records `op` (its kind and numbers set) for `path` when the simulator covers that path.
void record_at(PowerLossSimulator& sim, const std::filesystem::path& path, FileOp op) {
  if (!sim.covers(path, op.path)) return;
  sim.record(std::move(op));
}

}  // namespace

void record_create_file(PowerLossSimulator& sim, const std::filesystem::path& path) {
  record_at(sim, path, op_of(FileOpKind::kCreateFile));
}

void record_truncate(PowerLossSimulator& sim, const std::filesystem::path& path) {
  record_at(sim, path, op_of(FileOpKind::kTruncate));
}

void record_allocate(PowerLossSimulator& sim, const std::filesystem::path& path,
                     std::uint64_t size_bytes) {
  FileOp op = op_of(FileOpKind::kAllocate);
  op.size_bytes = size_bytes;
  record_at(sim, path, std::move(op));
}

void record_write(PowerLossSimulator& sim, const std::filesystem::path& path,
                  std::uint64_t offset_bytes, std::span<const std::byte> bytes) {
  FileOp op = op_of(FileOpKind::kWrite);
  op.offset_bytes = offset_bytes;
  if (!sim.covers(path, op.path)) return;  // before copying the bytes
  op.data.assign(bytes.begin(), bytes.end());
  sim.record(std::move(op));
}

void record_fsync(PowerLossSimulator& sim, const std::filesystem::path& path) {
  record_at(sim, path, op_of(FileOpKind::kFsync));
}

void record_create_directory(PowerLossSimulator& sim, const std::filesystem::path& path) {
  record_at(sim, path, op_of(FileOpKind::kCreateDirectory));
}

void record_rename(PowerLossSimulator& sim, const std::filesystem::path& from,
                   const std::filesystem::path& to) {
  FileOp op = op_of(FileOpKind::kRename);
  // A rename into or out of the root is, for the image, a create or a remove.
  const bool from_inside = sim.covers(from, op.path);
  const bool to_inside = sim.covers(to, op.to);
  if (from_inside && to_inside) {
    sim.record(std::move(op));
  } else if (to_inside) {
    record_at(sim, to, op_of(FileOpKind::kCreateFile));
  } else if (from_inside) {
    record_at(sim, from, op_of(FileOpKind::kRemove));
  }
}

void record_remove(PowerLossSimulator& sim, const std::filesystem::path& path) {
  record_at(sim, path, op_of(FileOpKind::kRemove));
}

}  // namespace strata::io::detail
