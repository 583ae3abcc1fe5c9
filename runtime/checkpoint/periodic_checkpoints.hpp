// Periodic checkpoints: what [checkpoint] dir / interval_steps / keep mean (docs/config.md). A run
// loop calls after_step() once per optimizer step; every interval_steps it saves the Engine's whole
// training state (Engine::save: atomic, runtime/checkpoint/checkpoint_rotation.hpp) as
//   <dir>/step-000120          (the step, zero padded to six digits, wider when it needs)
// and then removes all but the newest `keep`, so an older checkpoint goes only once a newer one is
// complete. A run continues from one with Engine::load (strata-finetune --resume-from PATH, where
// PATH is one checkpoint or the [checkpoint] dir, meaning its newest).
//
// Checkpoints past the step a run starts at belong to a run that went further: the run would
// replace them with its own, so start() refuses (CheckpointsAhead, naming the directory and the
// step) unless told to overwrite, which removes them first.
//
// Collective: every rank calls start() and after_step() with the same directory (one every rank
// sees); only rank 0 (`lead`) removes anything.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <vector>

#include "runtime/config/config.hpp"

namespace strata::runtime {

class Engine;

// A fresh or resumed run whose [checkpoint] dir holds checkpoints past its first step.
class CheckpointsAhead : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "<dir>/step-000120".
std::filesystem::path step_checkpoint_path(const std::filesystem::path& dir, std::uint64_t step);

struct StepCheckpoint {
  std::uint64_t step = 0;
  std::filesystem::path path;  // "<dir>/step-N", what Engine::load takes
};

// The complete checkpoints under `dir` (those whose newest complete copy is "step-N", or
// "step-N.tmp" / "step-N.old" after a crash mid-save), oldest first; none when `dir` is absent.
std::vector<StepCheckpoint> list_step_checkpoints(const std::filesystem::path& dir);

// What `--resume-from PATH` loads: PATH itself when it is a checkpoint (complete, or with a
// complete .tmp / .old beside it), else the newest step checkpoint under PATH. nullopt when
// neither.
std::optional<std::filesystem::path> resolve_checkpoint(const std::filesystem::path& path);

class PeriodicCheckpoints {
 public:
  PeriodicCheckpoints(CheckpointConfig config, bool lead);

  bool enabled() const { return config_.interval_steps > 0; }

  // Before the first step of a run starting at `first_step`: checkpoints past it are refused
  // (CheckpointsAhead), or removed with `overwrite`. Nothing happens when disabled.
  void start(std::uint64_t first_step, bool overwrite) const;
  // After a step: when the Engine's step is a multiple of interval_steps, saves it and keeps the
  // newest `keep`; returns the saved path, nullopt when none was due.
  std::optional<std::filesystem::path> after_step(Engine& engine) const;

 private:
  void remove_all_but_newest(std::uint64_t saved_step) const;

  CheckpointConfig config_;
  bool lead_;
};

}  // namespace strata::runtime
