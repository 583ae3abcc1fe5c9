#include "runtime/checkpoint/checkpoint_rotation.hpp"

#include "io/namespace_ops.hpp"
#include "io/whole_file.hpp"

namespace strata::runtime::detail {
namespace {

std::filesystem::path with_suffix(const std::filesystem::path& dir, const char* suffix) {
  std::filesystem::path result = dir;
  result += suffix;
  return result;
}

void sync_parent(const std::filesystem::path& dir) {
  io::sync_directory(std::filesystem::absolute(dir).parent_path());
}

void reached(const PublishHook& hook, PublishStep step) {
  if (hook) hook(step);
}

}  // namespace

std::filesystem::path staging_path(const std::filesystem::path& dir) {
  return with_suffix(dir, ".tmp");
}

std::filesystem::path previous_path(const std::filesystem::path& dir) {
  return with_suffix(dir, ".old");
}

bool is_complete_checkpoint(const std::filesystem::path& candidate) {
  return std::filesystem::is_regular_file(candidate / kManifestName);
}

void discard_checkpoint(const std::filesystem::path& candidate) {
  if (!std::filesystem::exists(candidate)) return;
  if (io::remove_entry(candidate / kManifestName)) io::sync_directory(candidate);
  io::remove_tree(candidate);
}

void prepare_staging(const std::filesystem::path& dir, const PublishHook& hook) {
  const std::filesystem::path staged = staging_path(dir);
  if (is_complete_checkpoint(staged)) publish_checkpoint(dir, hook);
  discard_checkpoint(staged);
  io::make_directories(staged);
  sync_parent(dir);
}

void publish_checkpoint(const std::filesystem::path& dir, const PublishHook& hook) {
  const std::filesystem::path previous = previous_path(dir);
  if (is_complete_checkpoint(dir)) {
    // "<dir>" is complete, so "<dir>.old" (older still) may go.
    discard_checkpoint(previous);
    sync_parent(dir);
    reached(hook, PublishStep::kOldDiscarded);
    io::rename_entry(dir, previous);
    sync_parent(dir);
    reached(hook, PublishStep::kCurrentRetired);
  } else {
    // No complete "<dir>" (a crash left only "<dir>.old", or nothing): keep "<dir>.old" until the
    // new one is in place; an incomplete "<dir>" holds nothing worth keeping.
    io::remove_tree(dir);
  }
  io::rename_entry(staging_path(dir), dir);
  sync_parent(dir);
  reached(hook, PublishStep::kNewInPlace);
  discard_checkpoint(previous);
  sync_parent(dir);
}

std::optional<std::filesystem::path> newest_complete_checkpoint(const std::filesystem::path& dir) {
  for (const std::filesystem::path& candidate : {staging_path(dir), dir, previous_path(dir)}) {
    if (is_complete_checkpoint(candidate)) return candidate;
  }
  return std::nullopt;
}

}  // namespace strata::runtime::detail
