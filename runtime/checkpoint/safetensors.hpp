// safetensors files (https://github.com/huggingface/safetensors): the consolidated export and
// import of a model's parameters.
//   8 bytes: little-endian u64 N, the header's length
//   N bytes: JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"?: {..}}
//   the data: each tensor's little-endian elements at [begin, end) from the data's start.
// Writes F32, BF16 or F16 (rounded to nearest even from fp32); reads the same three, converting to
// fp32. Parsing is strict: anything malformed throws SafetensorsError naming the file, the tensor
// (when one is at fault) and what was wrong; it never crashes (fuzzed: tests/fuzz/).
// The Engine exports and imports with it; the built-in GPT's checkpoints (models/gpt) and the
// Hugging Face checkpoints (models/checkpoint, SafetensorsRules::kAnyCheckpoint) use it too: this
// is strata's one safetensors header parser.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "io/file_handle.hpp"
#include "io/io_error.hpp"
#include "io/whole_file.hpp"
#include "runtime/config/config.hpp"
#include "runtime/engine/unit_spec.hpp"

namespace strata::runtime {

class SafetensorsError : public std::runtime_error {
 public:
  SafetensorsError(std::string file, std::string tensor, std::string problem);
  const std::string& file() const { return file_; }
  const std::string& tensor() const { return tensor_; }  // empty when the header as a whole is bad
  const std::string& problem() const { return problem_; }

 private:
  std::string file_, tensor_, problem_;
};

// What a header may hold.
//   kStrataFile: F32, BF16 and F16 tensors, each entry exactly dtype, shape and data_offsets: the
//     files strata writes (exports, the built-in GPT's checkpoints).
//   kAnyCheckpoint: every dtype the format defines, and other keys of an entry ignored (as the
//     reference reader ignores them): a Hugging Face checkpoint may hold I64 or BOOL buffers, which
//     are listed (a loader skips them) but cannot be read as fp32.
// The rest (offsets, shapes, tiling, metadata) is checked the same way under both.
enum class SafetensorsRules { kStrataFile, kAnyCheckpoint };

struct SafetensorsEntry {
  std::string name;
  std::string dtype_name;      // as the header names it: "F32", "BF16", "F16", "I64", ...
  std::optional<DType> dtype;  // F32, BF16, F16: what read_fp32 converts; empty for the others
  std::vector<std::size_t> shape;
  std::size_t begin = 0;  // byte offsets from the start of the data section
  std::size_t end = 0;

  std::size_t numel() const;
};

// "F32", "BF16", "F16": the format's names of the floating DTypes.
const char* safetensors_dtype_name(DType dtype);
// "[7, 6]": a shape as the error messages write it.
std::string shape_text(std::span<const std::size_t> shape);

// A whole safetensors file in memory, its header validated: every entry's dtype is known, its
// byte range matches its shape, lies inside the data, and the ranges tile the data exactly
// (no overlap, no gap: the format's own rule against polyglot files).
class SafetensorsFile {
 public:
  // Throws io::IoError when the file cannot be read, SafetensorsError when it is malformed.
  static SafetensorsFile read(const std::filesystem::path& path,
                              SafetensorsRules rules = SafetensorsRules::kStrataFile);
  // `file_name` stands for the file in error messages.
  static SafetensorsFile parse(std::vector<std::uint8_t> bytes, std::string file_name,
                               SafetensorsRules rules = SafetensorsRules::kStrataFile);

  const std::string& file_name() const { return file_name_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // by begin offset
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // The entry's elements converted to fp32; `out` holds exactly its element count. Throws
  // SafetensorsError when the entry's dtype is not F32, BF16 or F16.
  void read_fp32(const SafetensorsEntry& entry, std::span<float> out) const;

 private:
  std::string file_name_;
  std::vector<std::uint8_t> bytes_;
  std::size_t data_offset_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// The same validated header over a file left on disk: the data is read on demand, a range at a
// time, so a file larger than memory can be imported (Engine::import_safetensors streams it).
class SafetensorsReader {
 public:
  // Reads and checks the header (the same rules as SafetensorsFile, the data's length taken from
  // the file's size; a header over 100,000,000 bytes is refused unread). Throws io::IoError when
  // unreadable or not a regular file, SafetensorsError when malformed.
  static SafetensorsReader open(const std::filesystem::path& path,
                                SafetensorsRules rules = SafetensorsRules::kStrataFile);

  const std::string& file_name() const { return file_name_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // by begin offset
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* find(const std::string& name) const;
  // Elements [first, first + out.size()) of the entry, converted to fp32 (no buffer of its own:
  // 16-bit elements are read into `out` and widened in place). Throws io::IoError (or
  // SafetensorsError when the file was cut short since it was opened, or the entry's dtype is not
  // F32, BF16 or F16).
  void read_fp32(const SafetensorsEntry& entry, std::size_t first, std::span<float> out) const;

 private:
  std::string file_name_;
  io::FileHandle file_;
  std::size_t data_offset_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// A safetensors file written as a stream: the header (every tensor of `units`, in unit order, as
// `dtype`, named as save_safetensors names them) is written at once, then each unit's elements a
// range at a time, in any order; commit() checks every element was written once and makes the
// file appear atomically (io::AtomicFileWriter). Holds no more than a fixed conversion buffer.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::filesystem::path& path, const std::vector<UnitSpec>& units,
                    DType dtype, const std::map<std::string, std::string>& metadata,
                    bool prefix_unit_names);
  // Elements [first, first + values.size()) of unit `unit`'s flattened tensors (its tensors
  // concatenated in spec order; the range must lie inside the unit).
  void write(std::size_t unit, std::uint64_t first, std::span<const float> values);
  void commit();

 private:
  DType dtype_;
  io::AtomicFileWriter file_;
  std::uint64_t data_offset_ = 0;            // bytes before the data
  std::vector<std::uint64_t> unit_offsets_;  // each unit's first byte within the data
  std::vector<std::uint64_t> unit_numels_;
  std::uint64_t elements_expected_ = 0;
  std::uint64_t elements_written_ = 0;
  std::vector<std::uint16_t> converted_;  // one chunk in the 16-bit dtype
};

// Unit `index`'s flat fp32 values (its tensors concatenated in spec order) for the writer.
using UnitReader = std::function<std::vector<float>(std::size_t index)>;
// Receives unit `index`'s flat fp32 values from the loader, once the whole file has checked out.
using UnitWriter = std::function<void(std::size_t index, std::span<const float> values)>;

// Writes every tensor of `units` as `dtype`, in unit order, atomically (SafetensorsWriter).
// Tensor names in the file are the TensorSpec names, prefixed by `unit.name + "."` when
// `prefix_unit_names` (the Engine's tensor names are only unique within a unit).
void save_safetensors(const std::filesystem::path& path, const std::vector<UnitSpec>& units,
                      const UnitReader& read_unit, DType dtype,
                      const std::map<std::string, std::string>& metadata = {},
                      bool prefix_unit_names = false);
// The same names and shapes checked against `units` (a tensor missing, a shape that differs, or a
// tensor in the file the model does not have is a SafetensorsError; nothing is written then);
// then write_unit(u, values) for every unit in order. The file is read a unit at a time
// (SafetensorsReader), never whole.
void load_safetensors(const std::filesystem::path& path, const std::vector<UnitSpec>& units,
                      const UnitWriter& write_unit, bool prefix_unit_names = false);

// The pieces of load_safetensors, for callers that stream (Engine::import_safetensors): the file's
// tensors checked against `units` (the errors above), then any range of a unit's flattened
// elements, [first, first + out.size()), read from the file in fp32.
void check_model_tensors(const SafetensorsReader& file, const std::vector<UnitSpec>& units,
                         bool prefix_unit_names);
void read_unit_range(const SafetensorsReader& file, const UnitSpec& unit, std::uint64_t first,
                     std::span<float> out, bool prefix_unit_names);

}  // namespace strata::runtime
