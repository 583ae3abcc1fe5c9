// Loads a checkpoint's weights unit by unit across data-parallel ranks: each rank reads only its
// 1/ranks slice of each unit's flat buffer from the files (pread of those bytes alone), and an
// all-gather assembles the whole unit on every rank, which is what Engine::set_master takes.
// Host memory peaks at one unit (plus one slice). Every rank calls; the checkpoint must have
// passed HfCheckpoint::check().
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <vector>

#include "models/decoder/decoder_model.hpp"
#include "models/checkpoint/hf_checkpoint.hpp"

namespace strata::runtime::comm {
class Communicator;
}

namespace strata::llm {

// Receives unit `index`'s whole flat fp32 buffer (valid during the call only).
using UnitSink = std::function<void(std::size_t index, std::span<const float> values)>;

// Ranks split each unit into equal slices of ceil(numel / ranks) elements; the last rank's may be
// short. A communicator whose collectives take device memory (NCCL) gets no split: every rank then
// reads the whole unit.
void load_units(const HfCheckpoint& checkpoint, const std::vector<UnitSpec>& units,
                runtime::comm::Communicator& comm, const UnitSink& sink);

// The same on one process, without a communicator (strata-eval, strata-generate, tests).
void load_units(const HfCheckpoint& checkpoint, const std::vector<UnitSpec>& units,
                const UnitSink& sink);

}  // namespace strata::llm
