// Checkpoints of an Engine's training state, and its consolidated safetensors export/import.
// Engine::save / load / export_safetensors / import_safetensors forward here. docs/reliability.md
// describes the format and the crash-safety argument.
//
// A checkpoint is a directory:
//   manifest.json   format, version, step, loss scale, rank count, model shape (every unit's
//                   tensors, real numel and shard size), parameter dtype, optimizer, hashes, and
//                   per rank file the byte range and XXH3 checksum of every (unit, kind) segment
//   rank<R>.bin     rank R's shard of every unit, real elements only, fp32: master, then each
//                   optimizer moment the optimizer keeps
// It is written under "<dir>.tmp", every file fsynced, the manifest last, then swapped in as <dir>
// (checkpoint_rotation.hpp: an existing complete <dir> moves to "<dir>.old", removed once the new
// one is in place; every step durable). load() reads the newest complete one of "<dir>.tmp",
// <dir> and "<dir>.old", so a crash at any point loses nothing that was complete.
//
// Loading reshards: each rank reads, from whichever old ranks' files hold them, the elements of
// its own shard under the current rank count. Another model shape, parameter dtype or optimizer
// is a CheckpointMismatch naming what differs; a checksum mismatch or a missing or malformed file
// is a CheckpointCorruption naming the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "runtime/config/config.hpp"

namespace strata::runtime {

namespace detail {
class EngineState;
}

class CheckpointMismatch : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A run asked to start afresh over an NVMe store that holds a committed training step: refused
// before anything on disk changed. The message names the store, the model it holds, the step and
// the two ways out (resume, or overwrite explicitly).
class CommittedStoreExists : public std::runtime_error {
 public:
  CommittedStoreExists(const std::string& message, std::uint64_t step)
      : std::runtime_error(message), step_(step) {}
  std::uint64_t step() const { return step_; }

 private:
  std::uint64_t step_;
};

class CheckpointCorruption : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
// Collective: every rank calls them, with a directory on a file system every rank sees.
void save_checkpoint(EngineState& state, const std::filesystem::path& dir);
void load_checkpoint(EngineState& state, const std::filesystem::path& dir);
// Rank 0 writes the file (full tensors gathered from every rank); all ranks must call.
void export_safetensors(EngineState& state, const std::filesystem::path& file, DType dtype);
// Every rank reads the file and keeps its shard: master and parameters from the file, optimizer
// moments zero, step 0.
void import_safetensors(EngineState& state, const std::filesystem::path& file);
// The NVMe store records a byte length per extent, which cannot tell two shapes of equal padded
// size apart: beside it, "strata-rank<R>.model.json" (on the first path) describes the model.
// A fresh store writes it (atomically); a resumed one is checked against it (CheckpointMismatch
// naming the unit or tensor that differs).
void record_or_check_store_model(EngineState& state, bool resume);
// What the store's model description says it holds ("12 units, 1,234,567 parameters, adamw, 1
// rank(s), first unit \"emb\""), or why there is none; for messages, never throws.
std::string describe_stored_model(const EngineState& state);
}  // namespace detail

}  // namespace strata::runtime
