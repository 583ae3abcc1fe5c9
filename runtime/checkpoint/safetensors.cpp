#include "runtime/checkpoint/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "base/assert.hpp"
#include "base/dtype.hpp"
#include "io/whole_file.hpp"

namespace strata::runtime {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies it as is");

constexpr std::size_t kLengthBytes = 8;
constexpr const char* kMetadataKey = "__metadata__";

std::optional<DType> floating_dtype(const std::string& name) {
  for (const DType candidate : {DType::kFp32, DType::kBf16, DType::kFp16}) {
    if (name == safetensors_dtype_name(candidate)) return candidate;
  }
  return std::nullopt;
}

// Bytes per element of every dtype the format defines; 0: not one of them.
std::size_t format_element_bytes(const std::string& name) {
  static const std::map<std::string, std::size_t> kSizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
      {"U64", 8}, {"I32", 4}, {"U32", 4},  {"I16", 2},     {"U16", 2},
      {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  const auto found = kSizes.find(name);
  return found == kSizes.end() ? 0 : found->second;
}

// The entry's dtype by `rules`: the floating three, or (kAnyCheckpoint) any the format defines.
// Returns the bytes per element.
std::size_t read_dtype(const nlohmann::json& dtype, SafetensorsRules rules, const std::string& file,
                       SafetensorsEntry& entry) {
  if (dtype.is_string()) {
    entry.dtype_name = dtype.get<std::string>();
    entry.dtype = floating_dtype(entry.dtype_name);
  }
  if (rules == SafetensorsRules::kStrataFile) {
    if (!entry.dtype) {
      throw SafetensorsError(
          file, entry.name,
          "unknown or unsupported dtype " + dtype.dump() + " (supported: F32, BF16, F16)");
    }
    return dtype_bytes(*entry.dtype);
  }
  const std::size_t element_bytes = format_element_bytes(entry.dtype_name);
  if (element_bytes == 0) throw SafetensorsError(file, entry.name, "unknown dtype " + dtype.dump());
  return element_bytes;
}

// Throws when the entry's dtype cannot be read as fp32 (kAnyCheckpoint lists such
// entries).
void check_readable(const SafetensorsEntry& entry, const std::string& file) {
  if (!entry.dtype) {
    throw SafetensorsError(
        file, entry.name,
        "dtype " + entry.dtype_name + " cannot be read as parameters (supported: F32, BF16, F16)");
  }
}

// Reads a non-negative integer that fits size_t, else throws.
std::size_t read_count(const nlohmann::json& value, const std::string& file,
                       const std::string& tensor, const std::string& what) {
  if (!value.is_number_unsigned()) {
    throw SafetensorsError(file, tensor,
                           what + " must be a non-negative integer, got " + value.dump());
  }
  const auto count = value.get<std::uint64_t>();
  if (count > std::numeric_limits<std::size_t>::max()) {
    throw SafetensorsError(file, tensor, what + " is too large");
  }
  return static_cast<std::size_t>(count);
}

SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& value,
                             const std::string& file, SafetensorsRules rules) {
  if (!value.is_object()) {
    throw SafetensorsError(file, name, "entry must be an object, got " + value.dump());
  }
  for (const auto& [key, unused] : value.items()) {
    if (rules == SafetensorsRules::kStrataFile && key != "dtype" && key != "shape" &&
        key != "data_offsets") {
      throw SafetensorsError(file, name,
                             "unknown key '" + key + "' (allowed: dtype, shape, data_offsets)");
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) {
      throw SafetensorsError(file, name, std::string("missing '") + key + "'");
    }
  }
  SafetensorsEntry entry;
  entry.name = name;
  const std::size_t element_bytes = read_dtype(value["dtype"], rules, file, entry);
  const nlohmann::json& shape = value["shape"];
  if (!shape.is_array()) {
    throw SafetensorsError(file, name, "shape must be an array, got " + shape.dump());
  }
  std::size_t elements = 1;
  for (const nlohmann::json& dim : shape) {
    const std::size_t extent = read_count(dim, file, name, "shape dimension");
    if (extent != 0 && elements > std::numeric_limits<std::size_t>::max() / 8 / extent) {
      throw SafetensorsError(file, name, "shape " + shape.dump() + " overflows");
    }
    elements *= extent;
    entry.shape.push_back(extent);
  }
  const nlohmann::json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    throw SafetensorsError(file, name, "data_offsets must be [begin, end], got " + offsets.dump());
  }
  entry.begin = read_count(offsets[0], file, name, "data_offsets begin");
  entry.end = read_count(offsets[1], file, name, "data_offsets end");
  if (entry.end < entry.begin) {
    throw SafetensorsError(file, name, "data_offsets " + offsets.dump() + " end before begin");
  }
  const std::size_t expected = elements * element_bytes;
  if (entry.end - entry.begin != expected) {
    throw SafetensorsError(file, name,
                           "shape " + shape.dump() + " of " + entry.dtype_name + " needs " +
                               std::to_string(expected) + " bytes, data_offsets " + offsets.dump() +
                               " hold " + std::to_string(entry.end - entry.begin));
  }
  return entry;
}

std::string tensor_name(const UnitSpec& unit, const TensorSpec& tensor, bool prefix) {
  return prefix ? unit.name + "." + tensor.name : tensor.name;
}

std::uint64_t unit_numel(const UnitSpec& unit) {
  std::uint64_t numel = 0;
  for (const TensorSpec& tensor : unit.tensors) numel += tensor.numel();
  return numel;
}

std::vector<std::size_t> shape_of(const TensorSpec& tensor) {
  return {tensor.shape.begin(), tensor.shape.end()};
}

// The header's length from the file's first 8 bytes (`prefix`, at least what the file has of
// them), checked against the file's length.
std::uint64_t header_length(std::span<const std::uint8_t> prefix, std::uint64_t file_bytes,
                            const std::string& name) {
  if (file_bytes < kLengthBytes || prefix.size() < kLengthBytes) {
    throw SafetensorsError(name, "",
                           "file of " + std::to_string(file_bytes) +
                               " bytes is shorter than the 8-byte header length");
  }
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, prefix.data(), kLengthBytes);
  if (header_bytes > file_bytes - kLengthBytes) {
    throw SafetensorsError(name, "",
                           "header length " + std::to_string(header_bytes) + " exceeds the " +
                               std::to_string(file_bytes - kLengthBytes) +
                               " bytes after the length field");
  }
  return header_bytes;
}

struct ParsedHeader {
  std::vector<SafetensorsEntry> entries;  // by begin offset
  std::map<std::string, std::string> metadata;
};

// The JSON header: every entry valid and inside the `data_bytes` of data, the entries tiling it.
ParsedHeader parse_header(std::string_view text, std::size_t data_bytes, const std::string& name,
                          SafetensorsRules rules) {
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& error) {
    throw SafetensorsError(name, "", std::string("header is not valid JSON: ") + error.what());
  }
  if (!header.is_object()) {
    throw SafetensorsError(
        name, "", "header must be a JSON object, got a " + std::string(header.type_name()));
  }
  ParsedHeader parsed;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) {
        throw SafetensorsError(name, "", "__metadata__ must be an object of strings");
      }
      for (const auto& [meta_key, meta_value] : value.items()) {
        if (!meta_value.is_string()) {
          throw SafetensorsError(name, "",
                                 "__metadata__ value of '" + meta_key + "' must be a string, got " +
                                     meta_value.dump());
        }
        parsed.metadata[meta_key] = meta_value.get<std::string>();
      }
      continue;
    }
    SafetensorsEntry entry = parse_entry(key, value, name, rules);
    if (entry.end > data_bytes) {
      throw SafetensorsError(name, key,
                             "data_offsets [" + std::to_string(entry.begin) + ", " +
                                 std::to_string(entry.end) + "] run past the " +
                                 std::to_string(data_bytes) + " data bytes");
    }
    parsed.entries.push_back(std::move(entry));
  }
  std::vector<SafetensorsEntry>& entries = parsed.entries;
  std::sort(entries.begin(), entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  std::size_t covered = 0;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const SafetensorsEntry& entry = entries[i];
    if (entry.begin < covered) {
      throw SafetensorsError(name, entry.name,
                             "data_offsets [" + std::to_string(entry.begin) + ", " +
                                 std::to_string(entry.end) + "] overlap tensor '" +
                                 entries[i - 1].name + "'");
    }
    if (entry.begin > covered) {
      throw SafetensorsError(name, entry.name,
                             "data bytes [" + std::to_string(covered) + ", " +
                                 std::to_string(entry.begin) + ") before it belong to no tensor");
    }
    covered = entry.end;
  }
  if (covered != data_bytes) {
    throw SafetensorsError(name, "",
                           "data bytes [" + std::to_string(covered) + ", " +
                               std::to_string(data_bytes) + ") belong to no tensor");
  }
  return parsed;
}

const SafetensorsEntry* find_entry(const std::vector<SafetensorsEntry>& entries,
                                   const std::string& name) {
  for (const SafetensorsEntry& entry : entries) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

// 16-bit elements `half[i]` (at the front of `out`'s bytes) widened to fp32 in place: from the
// last element down, element i's float (bytes [4i, 4i + 4)) only overwrites halves 2i and 2i + 1,
// which are already converted (or are i itself, read first).
void widen_in_place(DType dtype, std::span<float> out) {
  auto* bytes = reinterpret_cast<std::byte*>(out.data());
  for (std::size_t i = out.size(); i-- > 0;) {
    std::uint16_t half = 0;
    std::memcpy(&half, bytes + 2 * i, 2);
    out[i] = dtype == DType::kBf16 ? to_float(Bf16{half}) : to_float(Fp16{half});
  }
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFp32:
      return "F32";
    case DType::kBf16:
      return "BF16";
    case DType::kFp16:
      return "F16";
    case DType::kUint8:
    case DType::kUint64:
      break;  // never a tensor of a safetensors file strata reads or writes
  }
  return "?";
}

std::string shape_text(std::span<const std::size_t> shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  }
  return text + "]";
}

std::size_t SafetensorsEntry::numel() const {
  std::size_t count = 1;
  for (const std::size_t extent : shape) count *= extent;
  return count;
}

SafetensorsError::SafetensorsError(std::string file, std::string tensor, std::string problem)
    : std::runtime_error("safetensors '" + file + "'" +
                         (tensor.empty() ? std::string() : ", tensor '" + tensor + "'") + ": " +
                         problem),
      file_(std::move(file)),
      tensor_(std::move(tensor)),
      problem_(std::move(problem)) {}

SafetensorsFile SafetensorsFile::read(const std::filesystem::path& path, SafetensorsRules rules) {
  return parse(io::read_file_bytes(path), path.string(), rules);
}

SafetensorsFile SafetensorsFile::parse(std::vector<std::uint8_t> bytes, std::string file_name,
                                       SafetensorsRules rules) {
  SafetensorsFile file;
  file.file_name_ = std::move(file_name);
  const std::uint64_t header_bytes = header_length(bytes, bytes.size(), file.file_name_);
  file.data_offset_ = kLengthBytes + static_cast<std::size_t>(header_bytes);
  ParsedHeader parsed = parse_header(
      std::string_view(reinterpret_cast<const char*>(bytes.data()) + kLengthBytes, header_bytes),
      bytes.size() - file.data_offset_, file.file_name_, rules);
  file.entries_ = std::move(parsed.entries);
  file.metadata_ = std::move(parsed.metadata);
  file.bytes_ = std::move(bytes);
  return file;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  return find_entry(entries_, name);
}

void SafetensorsFile::read_fp32(const SafetensorsEntry& entry, std::span<float> out) const {
  check_readable(entry, file_name_);
  const DType dtype = *entry.dtype;
  STRATA_ASSERT(out.size() * dtype_bytes(dtype) == entry.end - entry.begin, "wrong element count");
  const std::uint8_t* data = bytes_.data() + data_offset_ + entry.begin;
  if (dtype == DType::kFp32) {
    std::memcpy(out.data(), data, out.size() * sizeof(float));
    return;
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint16_t half = 0;
    std::memcpy(&half, data + 2 * i, 2);
    out[i] = dtype == DType::kBf16 ? to_float(Bf16{half}) : to_float(Fp16{half});
  }
}

SafetensorsReader SafetensorsReader::open(const std::filesystem::path& path,
                                          SafetensorsRules rules) {
  // A header larger than this is refused before it is read (the reference implementation's
  // limit): the header is all a reader holds in memory.
  constexpr std::uint64_t kHeaderBytesMax = 100'000'000;
  SafetensorsReader reader;
  reader.file_name_ = path.string();
  reader.file_ = io::FileHandle::open(
      path, {io::CreateMode::kOpenExisting, io::DirectIo::kOff, io::Access::kReadOnly});
  if (!reader.file_.is_regular_file()) {
    throw io::IoError("open (not a regular file)", reader.file_name_, 0, 0, EISDIR);
  }
  const std::uint64_t file_bytes = reader.file_.size_bytes();
  std::uint8_t prefix[kLengthBytes] = {};
  const std::size_t got = reader.file_.read_at(0, std::as_writable_bytes(std::span(prefix)));
  const std::uint64_t header_bytes =
      header_length(std::span<const std::uint8_t>(prefix, got), file_bytes, reader.file_name_);
  if (header_bytes > kHeaderBytesMax) {
    throw SafetensorsError(reader.file_name_, "",
                           "header length " + std::to_string(header_bytes) + " exceeds the " +
                               std::to_string(kHeaderBytesMax) + "-byte limit");
  }
  std::string text(header_bytes, '\0');
  if (reader.file_.read_at(kLengthBytes, std::as_writable_bytes(std::span(text))) != text.size()) {
    throw SafetensorsError(reader.file_name_, "", "file shrank while its header was read");
  }
  reader.data_offset_ = kLengthBytes + static_cast<std::size_t>(header_bytes);
  ParsedHeader parsed =
      parse_header(text, file_bytes - reader.data_offset_, reader.file_name_, rules);
  reader.entries_ = std::move(parsed.entries);
  reader.metadata_ = std::move(parsed.metadata);
  return reader;
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  return find_entry(entries_, name);
}

void SafetensorsReader::read_fp32(const SafetensorsEntry& entry, std::size_t first,
                                  std::span<float> out) const {
  check_readable(entry, file_name_);
  const std::size_t element_bytes = dtype_bytes(*entry.dtype);
  STRATA_ASSERT((first + out.size()) * element_bytes <= entry.end - entry.begin,
                "range past the tensor");
  if (out.empty()) return;
  const std::uint64_t offset = data_offset_ + entry.begin + first * element_bytes;
  const std::span<std::byte> bytes = std::as_writable_bytes(out).first(out.size() * element_bytes);
  const std::size_t got = file_.read_at(offset, bytes);
  if (got != bytes.size()) {
    throw SafetensorsError(file_name_, entry.name,
                           "the file ends at byte " + std::to_string(offset + got) +
                               " inside the tensor (cut short after it was opened)");
  }
  if (*entry.dtype != DType::kFp32) widen_in_place(*entry.dtype, out);
}

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path,
                                     const std::vector<UnitSpec>& units, DType dtype,
                                     const std::map<std::string, std::string>& metadata,
                                     bool prefix_unit_names)
    : dtype_(dtype), file_(io::AtomicFileWriter::create(path)) {
  STRATA_ASSERT(is_floating_point(dtype), "safetensors exports are fp32, bf16 or fp16");
  const std::size_t element_bytes = dtype_bytes(dtype);
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::size_t offset = 0;
  for (const UnitSpec& unit : units) {
    unit_offsets_.push_back(offset);
    unit_numels_.push_back(unit_numel(unit));
    elements_expected_ += unit_numels_.back();
    for (const TensorSpec& spec : unit.tensors) {
      const std::size_t bytes = spec.numel() * element_bytes;
      header[tensor_name(unit, spec, prefix_unit_names)] = {
          {"dtype", safetensors_dtype_name(dtype)},
          {"shape", spec.shape},
          {"data_offsets", {offset, offset + bytes}}};
      offset += bytes;
    }
  }
  std::string header_text = header.dump();
  // Pad with spaces (valid JSON whitespace) so the data starts 8-byte aligned, as the reference
  // writer does.
  header_text.append((kLengthBytes - header_text.size() % kLengthBytes) % kLengthBytes, ' ');
  const std::uint64_t header_length = header_text.size();
  file_.append(std::as_bytes(std::span(&header_length, 1)));
  file_.append(std::as_bytes(std::span(header_text)));
  data_offset_ = kLengthBytes + header_length;
}

void SafetensorsWriter::write(std::size_t unit, std::uint64_t first,
                              std::span<const float> values) {
  // Conversion to 16 bits goes through a buffer of this many elements (128 KiB).
  constexpr std::size_t kChunkElements = 64 * 1024;
  STRATA_ASSERT(unit < unit_numels_.size() && first + values.size() <= unit_numels_[unit],
                "range outside the unit");
  const std::size_t element_bytes = dtype_bytes(dtype_);
  const std::uint64_t offset = data_offset_ + unit_offsets_[unit] + first * element_bytes;
  elements_written_ += values.size();
  if (dtype_ == DType::kFp32) {
    if (!values.empty()) file_.write_at(offset, std::as_bytes(values));
    return;
  }
  for (std::size_t done = 0; done < values.size(); done += kChunkElements) {
    const std::span<const float> chunk =
        values.subspan(done, std::min(kChunkElements, values.size() - done));
    converted_.resize(chunk.size());
    for (std::size_t i = 0; i < chunk.size(); ++i) {
      converted_[i] = dtype_ == DType::kBf16 ? to_bf16(chunk[i]).bits : to_fp16(chunk[i]).bits;
    }
    file_.write_at(offset + done * element_bytes, std::as_bytes(std::span(converted_)));
  }
}

void SafetensorsWriter::commit() {
  STRATA_ASSERT(elements_written_ == elements_expected_, "not every element was written once");
  file_.commit();
}

void save_safetensors(const std::filesystem::path& path, const std::vector<UnitSpec>& units,
                      const UnitReader& read_unit, DType dtype,
                      const std::map<std::string, std::string>& metadata, bool prefix_unit_names) {
  SafetensorsWriter writer(path, units, dtype, metadata, prefix_unit_names);
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::vector<float> flat = read_unit(u);
    STRATA_ASSERT(flat.size() == unit_numel(units[u]), "unit buffer of the wrong size");
    writer.write(u, 0, flat);
  }
  writer.commit();
}

void check_model_tensors(const SafetensorsReader& file, const std::vector<UnitSpec>& units,
                         bool prefix_unit_names) {
  std::size_t expected_tensors = 0;
  for (const UnitSpec& unit : units) {
    for (const TensorSpec& spec : unit.tensors) {
      ++expected_tensors;
      const std::string name = tensor_name(unit, spec, prefix_unit_names);
      const SafetensorsEntry* entry = file.find(name);
      if (entry == nullptr) {
        throw SafetensorsError(
            file.file_name(), name,
            "missing: the model has it with shape " + shape_text(shape_of(spec)));
      }
      if (entry->shape != shape_of(spec)) {
        throw SafetensorsError(file.file_name(), name,
                               "shape " + shape_text(entry->shape) + " differs from the model's " +
                                   shape_text(shape_of(spec)));
      }
    }
  }
  if (file.entries().size() != expected_tensors) {
    for (const SafetensorsEntry& entry : file.entries()) {
      const bool known = std::any_of(units.begin(), units.end(), [&](const UnitSpec& unit) {
        return std::any_of(unit.tensors.begin(), unit.tensors.end(), [&](const TensorSpec& spec) {
          return tensor_name(unit, spec, prefix_unit_names) == entry.name;
        });
      });
      if (!known) {
        throw SafetensorsError(file.file_name(), entry.name, "not a parameter of the model");
      }
    }
  }
}

void read_unit_range(const SafetensorsReader& file, const UnitSpec& unit, std::uint64_t first,
                     std::span<float> out, bool prefix_unit_names) {
  const std::uint64_t last = first + out.size();
  std::uint64_t tensor_begin = 0;
  for (const TensorSpec& spec : unit.tensors) {
    const std::uint64_t tensor_end = tensor_begin + spec.numel();
    const std::uint64_t from = std::max(first, tensor_begin);
    const std::uint64_t to = std::min(last, tensor_end);
    if (from < to) {
      file.read_fp32(*file.find(tensor_name(unit, spec, prefix_unit_names)), from - tensor_begin,
                     out.subspan(from - first, to - from));
    }
    tensor_begin = tensor_end;
  }
  STRATA_ASSERT(last <= tensor_begin, "range past the unit");
}

void load_safetensors(const std::filesystem::path& path, const std::vector<UnitSpec>& units,
                      const UnitWriter& write_unit, bool prefix_unit_names) {
  const SafetensorsReader file = SafetensorsReader::open(path);
  check_model_tensors(file, units, prefix_unit_names);  // everything before any unit
  std::vector<float> flat;
  for (std::size_t u = 0; u < units.size(); ++u) {
    flat.resize(unit_numel(units[u]));
    read_unit_range(file, units[u], 0, flat, prefix_unit_names);
    write_unit(u, flat);
  }
}

}  // namespace strata::runtime
