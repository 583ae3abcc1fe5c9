// HfCheckpoint: the weights of a Hugging Face model folder, read tensor by tensor and byte range
// by byte range, never whole: `model.safetensors`, or `model.safetensors.index.json` and the
// shards its weight_map names. Only the safetensors headers are read when opening.
//
// Names: the model's tensors are matched by TensorSpec::hf_name. GPT-2 checkpoints exist with and
// without the `transformer.` prefix (GPT2LMHeadModel vs GPT2Model); the checkpoint's style is
// detected and kept (stored_name), so an export writes the names it read.
// Skipped, never loaded: `*.rotary_emb.inv_freq`, GPT-2's `*.attn.bias` / `*.attn.masked_bias`
// (causal masks stored as buffers), and `lm_head.weight` when the model's head is tied (it is the
// embedding). Anything else the model lacks, or a model tensor missing or of another shape, is a
// CheckpointError naming the tensor and the file.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/decoder/decoder_model.hpp"
#include "models/checkpoint/file_io.hpp"
#include "runtime/checkpoint/safetensors.hpp"

namespace strata::llm {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr const char* kSingleFileName = "model.safetensors";
inline constexpr const char* kIndexFileName = "model.safetensors.index.json";

// Non-parameter buffers a checkpoint may hold (rotary inverse frequencies, attention masks).
bool is_known_buffer(const std::string& stored_name);
// `hf_name` (GPT-2's with the `transformer.` prefix) as a checkpoint of that style stores it.
std::string stored_name(const std::string& hf_name, bool gpt2_prefix_stripped);

class HfCheckpoint {
 public:
  // Throws CheckpointError when neither file exists or the index is malformed,
  // runtime::SafetensorsError for a malformed shard, io::IoError when one cannot be read.
  static HfCheckpoint open(const std::filesystem::path& model_dir);

  const std::filesystem::path& dir() const { return dir_; }
  const std::vector<std::filesystem::path>& files() const { return paths_; }
  bool sharded() const { return sharded_; }
  // The name under which the checkpoint stores the tensor the model calls `hf_name`.
  std::string stored_name(const std::string& hf_name) const;
  bool gpt2_prefix_stripped() const { return gpt2_prefix_stripped_; }

  // Every tensor of `units` present with its shape and a convertible dtype, and nothing else
  // but the skipped buffers. Throws CheckpointError naming the tensor and the file.
  void check(const std::vector<UnitSpec>& units) const;
  // Elements [first, first + out.size()) of the unit's flat buffer (tensors in spec order), as
  // fp32: one pread per tensor the range touches. check() must have passed.
  void read_unit_range(const UnitSpec& unit, std::size_t first, std::span<float> out) const;
  // Bytes of tensor data read so far (tests: each rank reads only its share).
  std::uint64_t bytes_read() const { return bytes_read_->load(); }

 private:
  struct Location {
    std::size_t file = 0;
    const runtime::SafetensorsEntry* tensor = nullptr;
  };
  const Location& locate(const std::string& hf_name) const;

  std::filesystem::path dir_;
  bool sharded_ = false;
  bool gpt2_prefix_stripped_ = false;
  std::vector<std::filesystem::path> paths_;
  // One per path, its header read (SafetensorsRules::kAnyCheckpoint); Location points into its
  // entries, which stay put when the vector moves.
  std::vector<runtime::SafetensorsReader> files_;
  std::map<std::string, Location> tensors_;  // by stored name
  std::unique_ptr<std::atomic<std::uint64_t>> bytes_read_ =
      std::make_unique<std::atomic<std::uint64_t>>(0);
};

}  // namespace strata::llm
