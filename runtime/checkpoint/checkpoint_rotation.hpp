// How a checkpoint directory is swapped in without ever losing the newest complete checkpoint.
// save_checkpoint stages every file under "<dir>.tmp" and calls publish_checkpoint; load_checkpoint
// reads newest_complete_checkpoint. docs/reliability.md gives the crash argument step by step.
//
// A checkpoint directory is *complete* when its manifest.json exists: the manifest is the last
// file written, after every rank file was fsynced, and it is itself written atomically (temporary
// file, fsync, rename, directory fsync), so its presence proves the rest is durable. Removing a
// directory removes its manifest first, so a half-removed directory is never taken for complete.
//
// The three names, newest first: "<dir>.tmp" (a finished save not yet swapped in), "<dir>",
// "<dir>.old" (the one before). At every point of publish_checkpoint at least one of them is
// complete and the newest complete one is the newest checkpoint that was ever complete; a complete
// directory is only removed once a newer complete one is in place under "<dir>".
#pragma once

#include <filesystem>
#include <functional>
#include <optional>

namespace strata::runtime::detail {

// The file whose presence marks a checkpoint directory complete (written last, atomically).
inline constexpr const char* kManifestName = "manifest.json";

// The points between the durable steps of publish_checkpoint, for tests that crash there.
enum class PublishStep {
  kOldDiscarded,    // "<dir>.old" removed (only when "<dir>" was complete)
  kCurrentRetired,  // "<dir>" renamed to "<dir>.old"
  kNewInPlace,      // "<dir>.tmp" renamed to "<dir>"
};
// Called after each step; a test hook throws to simulate a crash there. Empty: no hook.
using PublishHook = std::function<void(PublishStep)>;

std::filesystem::path staging_path(const std::filesystem::path& dir);   // "<dir>.tmp"
std::filesystem::path previous_path(const std::filesystem::path& dir);  // "<dir>.old"

// manifest.json exists in `candidate` (see the file comment for why that is enough).
bool is_complete_checkpoint(const std::filesystem::path& candidate);

// Removes `candidate`, its manifest first (so a crash midway leaves it incomplete, not torn).
void discard_checkpoint(const std::filesystem::path& candidate);

// Before a save stages anything: a complete "<dir>.tmp" left by a crash is the newest checkpoint,
// so it is published first; then an empty "<dir>.tmp" is created. Rank 0 only.
void prepare_staging(const std::filesystem::path& dir, const PublishHook& hook = {});

// Swaps the complete staged "<dir>.tmp" in as "<dir>": the previous "<dir>" (if complete) becomes
// "<dir>.old" and is removed once the new one is in place; every step is made durable (parent
// directory fsync) before the next. Rank 0 only.
void publish_checkpoint(const std::filesystem::path& dir, const PublishHook& hook = {});

// The newest complete one of "<dir>.tmp", "<dir>", "<dir>.old"; nullopt when none is complete.
std::optional<std::filesystem::path> newest_complete_checkpoint(const std::filesystem::path& dir);

}  // namespace strata::runtime::detail
