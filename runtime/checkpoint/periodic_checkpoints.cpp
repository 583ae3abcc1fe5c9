#include "runtime/checkpoint/periodic_checkpoints.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "runtime/checkpoint/checkpoint_rotation.hpp"
#include "runtime/engine/engine.hpp"

namespace strata::runtime {
namespace {

constexpr std::string_view kPrefix = "step-";

// The step a directory entry belongs to: "step-N", "step-N.tmp" or "step-N.old"; nullopt for
// anything else (the directory may hold the user's own files too).
std::optional<std::uint64_t> step_of(std::string_view name) {
  if (!name.starts_with(kPrefix)) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  if (name.ends_with(".tmp") || name.ends_with(".old")) name.remove_suffix(4);
  std::uint64_t step = 0;
  const auto [end, error] = std::from_chars(name.data(), name.data() + name.size(), step);
  if (error != std::errc() || end != name.data() + name.size() || name.empty()) return std::nullopt;
  return step;
}

// Every step with an entry under `dir`, complete or not.
std::map<std::uint64_t, std::filesystem::path> step_entries(const std::filesystem::path& dir) {
  std::map<std::uint64_t, std::filesystem::path> steps;
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) return steps;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (const std::optional<std::uint64_t> step = step_of(entry.path().filename().string())) {
      steps.emplace(*step, step_checkpoint_path(dir, *step));
    }
  }
  return steps;
}

// Removes every copy of one checkpoint, each manifest first (never a torn "complete" one).
void discard_step(const std::filesystem::path& path) {
  for (const std::filesystem::path& copy :
       {detail::staging_path(path), detail::previous_path(path), path}) {
    detail::discard_checkpoint(copy);
  }
}

}  // namespace

std::filesystem::path step_checkpoint_path(const std::filesystem::path& dir, std::uint64_t step) {
  return dir / fmt::format("step-{:06}", step);
}

std::vector<StepCheckpoint> list_step_checkpoints(const std::filesystem::path& dir) {
  std::vector<StepCheckpoint> checkpoints;
  for (const auto& [step, path] : step_entries(dir)) {
    if (detail::newest_complete_checkpoint(path)) checkpoints.push_back({step, path});
  }
  return checkpoints;
}

std::optional<std::filesystem::path> resolve_checkpoint(const std::filesystem::path& path) {
  if (detail::newest_complete_checkpoint(path)) return path;
  const std::vector<StepCheckpoint> checkpoints = list_step_checkpoints(path);
  if (checkpoints.empty()) return std::nullopt;
  return checkpoints.back().path;
}

PeriodicCheckpoints::PeriodicCheckpoints(CheckpointConfig config, bool lead)
    : config_(std::move(config)), lead_(lead) {}

void PeriodicCheckpoints::start(std::uint64_t first_step, bool overwrite) const {
  if (!enabled()) return;
  std::vector<StepCheckpoint> ahead = list_step_checkpoints(config_.dir);
  std::erase_if(ahead, [&](const StepCheckpoint& c) { return c.step <= first_step; });
  if (ahead.empty()) return;
  if (!overwrite) {
    throw CheckpointsAhead(fmt::format(
        "[checkpoint] dir {} holds {} checkpoint(s) past step {}, where this run starts (newest: "
        "{}): its own checkpoints would replace them. Continue from it (strata-finetune "
        "--resume-from {}), or discard them explicitly (--overwrite)",
        config_.dir, ahead.size(), first_step, ahead.back().path.string(), config_.dir));
  }
  if (!lead_) return;
  for (const StepCheckpoint& checkpoint : ahead) discard_step(checkpoint.path);
}

std::optional<std::filesystem::path> PeriodicCheckpoints::after_step(Engine& engine) const {
  const std::uint64_t step = engine.step_count();
  if (!enabled() || step == 0 || step % config_.interval_steps != 0) return std::nullopt;
  const std::filesystem::path path = step_checkpoint_path(config_.dir, step);
  engine.save(path);  // collective; complete and durable on return
  if (lead_) remove_all_but_newest(step);
  return path;
}

// The newest `keep` complete checkpoints stay (the one just saved always among them); every other
// step's entries go, complete or left incomplete by a crash.
void PeriodicCheckpoints::remove_all_but_newest(std::uint64_t saved_step) const {
  const std::vector<StepCheckpoint> complete = list_step_checkpoints(config_.dir);
  std::vector<std::uint64_t> kept;
  kept.push_back(saved_step);
  for (auto it = complete.rbegin(); it != complete.rend() && kept.size() < config_.keep; ++it) {
    if (it->step < saved_step) kept.push_back(it->step);
  }
  for (const auto& [step, path] : step_entries(config_.dir)) {
    if (step < saved_step && std::find(kept.begin(), kept.end(), step) == kept.end()) {
      discard_step(path);
    }
  }
}

}  // namespace strata::runtime
