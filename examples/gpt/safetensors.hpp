// safetensors checkpoints of the GPT's parameters (https://github.com/huggingface/safetensors):
//   8 bytes: little-endian u64 N, the header's length
//   N bytes: JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"?: {..}}
//   the data: each tensor's little-endian elements at [begin, end) from the data's start.
// Writes F32, BF16 or F16 (rounded to nearest even from the fp32 parameters); reads the same
// three, converting to fp32. Parsing is strict: anything malformed throws SafetensorsError naming
// the file, the tensor (when one is at fault) and what was wrong; it never crashes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/gpt/parameter_store.hpp"
#include "runtime/config.hpp"

namespace strata::gpt {

class SafetensorsError : public std::runtime_error {
 public:
  SafetensorsError(std::string file, std::string tensor, std::string problem);
  const std::string& file() const { return file_; }
  const std::string& tensor() const { return tensor_; }  // empty when the header as a whole is bad
  const std::string& problem() const { return problem_; }

 private:
  std::string file_, tensor_, problem_;
};

struct SafetensorsEntry {
  std::string name;
  runtime::DType dtype = runtime::DType::kFp32;
  std::vector<std::size_t> shape;
  std::size_t begin = 0;  // byte offsets from the start of the data section
  std::size_t end = 0;
};

// A whole safetensors file in memory, its header validated: every entry's dtype is known, its
// byte range matches its shape, lies inside the data, and the ranges tile the data exactly
// (no overlap, no gap: the format's own rule against polyglot files).
class SafetensorsFile {
 public:
  // Throws FileError when the file cannot be read, SafetensorsError when it is malformed.
  static SafetensorsFile read(const std::filesystem::path& path);
  // `file_name` stands for the file in error messages.
  static SafetensorsFile parse(std::vector<std::uint8_t> bytes, std::string file_name);

  const std::string& file_name() const { return file_name_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // by begin offset
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // The entry's elements converted to fp32; `out` holds exactly its element count.
  void read_fp32(const SafetensorsEntry& entry, std::span<float> out) const;

 private:
  std::string file_name_;
  std::vector<std::uint8_t> bytes_;
  std::size_t data_offset_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Reads unit `index`'s flat fp32 buffer (UnitSpec::numel elements) for the writer: lets a holder
// that is not a ParameterStore (the Engine, gathering unit by unit) export a checkpoint.
using UnitReader = std::function<std::span<const float>(std::size_t index)>;
// Receives unit `index`'s flat fp32 buffer from the loader, once the whole file has checked out.
using UnitWriter = std::function<void(std::size_t index, std::span<const float> values)>;

// Writes every tensor of `units` as `dtype`, in unit order, atomically (temporary + rename).
void save_safetensors(const std::filesystem::path& path, const std::vector<UnitSpec>& units,
                      const UnitReader& read_unit, runtime::DType dtype,
                      const std::map<std::string, std::string>& metadata = {});
void save_safetensors(const std::filesystem::path& path, const ParameterStore& params,
                      runtime::DType dtype,
                      const std::map<std::string, std::string>& metadata = {});

// Fills every tensor of `params` from the file. A tensor of the model missing from the file, a
// shape that differs from the model's, or a tensor in the file the model does not have (e.g.
// lm_head.weight for a tied model) is a SafetensorsError. `params` is untouched on error.
void load_safetensors(const std::filesystem::path& path, ParameterStore& params);
// The same checks against `units`; then write_unit(u, values) for every unit in order.
void load_safetensors(const std::filesystem::path& path, const std::vector<UnitSpec>& units,
                      const UnitWriter& write_unit);

}  // namespace strata::gpt
