#include "runtime/safetensors.hpp"

#include <algorithm>
#include <bit>
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

std::string shape_text(std::span<const std::size_t> shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(shape[i]);
  }
  return text + "]";
}

// The format's names of the three floating types it carries.
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
      break;  // never written: exports are floating
  }
  return "?";
}

bool parse_safetensors_dtype(const std::string& name, DType& dtype) {
  for (const DType candidate : {DType::kFp32, DType::kBf16, DType::kFp16}) {
    if (name == safetensors_dtype_name(candidate)) {
      dtype = candidate;
      return true;
    }
  }
  return false;
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
                             const std::string& file) {
  if (!value.is_object()) {
    throw SafetensorsError(file, name, "entry must be an object, got " + value.dump());
  }
  for (const auto& [key, unused] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
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
  const nlohmann::json& dtype = value["dtype"];
  if (!dtype.is_string() || !parse_safetensors_dtype(dtype.get<std::string>(), entry.dtype)) {
    throw SafetensorsError(
        file, name,
        "unknown or unsupported dtype " + dtype.dump() + " (supported: F32, BF16, F16)");
  }
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
  const std::size_t expected = elements * dtype_bytes(entry.dtype);
  if (entry.end - entry.begin != expected) {
    throw SafetensorsError(file, name,
                           "shape " + shape.dump() + " of " + safetensors_dtype_name(entry.dtype) +
                               " needs " + std::to_string(expected) + " bytes, data_offsets " +
                               offsets.dump() + " hold " +
                               std::to_string(entry.end - entry.begin));
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

}  // namespace

SafetensorsError::SafetensorsError(std::string file, std::string tensor, std::string problem)
    : std::runtime_error("safetensors '" + file + "'" +
                         (tensor.empty() ? std::string() : ", tensor '" + tensor + "'") + ": " +
                         problem),
      file_(std::move(file)),
      tensor_(std::move(tensor)),
      problem_(std::move(problem)) {}

SafetensorsFile SafetensorsFile::read(const std::filesystem::path& path) {
  return parse(io::read_file_bytes(path), path.string());
}

SafetensorsFile SafetensorsFile::parse(std::vector<std::uint8_t> bytes, std::string file_name) {
  SafetensorsFile file;
  file.file_name_ = std::move(file_name);
  const std::string& name = file.file_name_;
  if (bytes.size() < kLengthBytes) {
    throw SafetensorsError(name, "",
                           "file of " + std::to_string(bytes.size()) +
                               " bytes is shorter than the 8-byte header length");
  }
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes.data(), kLengthBytes);
  if (header_bytes > bytes.size() - kLengthBytes) {
    throw SafetensorsError(name, "",
                           "header length " + std::to_string(header_bytes) + " exceeds the " +
                               std::to_string(bytes.size() - kLengthBytes) +
                               " bytes after the length field");
  }
  const auto header_begin = reinterpret_cast<const char*>(bytes.data()) + kLengthBytes;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_begin, header_begin + header_bytes);
  } catch (const nlohmann::json::exception& error) {
    throw SafetensorsError(name, "", std::string("header is not valid JSON: ") + error.what());
  }
  if (!header.is_object()) {
    throw SafetensorsError(
        name, "", "header must be a JSON object, got a " + std::string(header.type_name()));
  }
  file.data_offset_ = kLengthBytes + static_cast<std::size_t>(header_bytes);
  const std::size_t data_bytes = bytes.size() - file.data_offset_;
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
        file.metadata_[meta_key] = meta_value.get<std::string>();
      }
      continue;
    }
    SafetensorsEntry entry = parse_entry(key, value, name);
    if (entry.end > data_bytes) {
      throw SafetensorsError(name, key,
                             "data_offsets [" + std::to_string(entry.begin) + ", " +
                                 std::to_string(entry.end) + "] run past the " +
                                 std::to_string(data_bytes) + " data bytes");
    }
    file.entries_.push_back(std::move(entry));
  }
  std::sort(file.entries_.begin(), file.entries_.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  std::size_t covered = 0;
  for (std::size_t i = 0; i < file.entries_.size(); ++i) {
    const SafetensorsEntry& entry = file.entries_[i];
    if (entry.begin < covered) {
      throw SafetensorsError(name, entry.name,
                             "data_offsets [" + std::to_string(entry.begin) + ", " +
                                 std::to_string(entry.end) + "] overlap tensor '" +
                                 file.entries_[i - 1].name + "'");
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
  file.bytes_ = std::move(bytes);
  return file;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  for (const SafetensorsEntry& entry : entries_) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

void SafetensorsFile::read_fp32(const SafetensorsEntry& entry, std::span<float> out) const {
  const std::size_t element_bytes = dtype_bytes(entry.dtype);
  STRATA_ASSERT(out.size() * element_bytes == entry.end - entry.begin, "wrong element count");
  const std::uint8_t* data = bytes_.data() + data_offset_ + entry.begin;
  if (entry.dtype == DType::kFp32) {
    std::memcpy(out.data(), data, out.size() * sizeof(float));
    return;
  }
  for (std::size_t i = 0; i < out.size(); ++i) {
    std::uint16_t half = 0;
    std::memcpy(&half, data + 2 * i, 2);
    out[i] = entry.dtype == DType::kBf16 ? to_float(Bf16{half}) : to_float(Fp16{half});
  }
}

void save_safetensors(const std::filesystem::path& path, const std::vector<UnitSpec>& units,
                      const UnitReader& read_unit, DType dtype,
                      const std::map<std::string, std::string>& metadata, bool prefix_unit_names) {
  STRATA_ASSERT(is_floating_point(dtype), "safetensors exports are fp32, bf16 or fp16");
  const std::size_t element_bytes = dtype_bytes(dtype);
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::size_t total_elements = 0;
  for (const UnitSpec& unit : units) total_elements += unit_numel(unit);
  std::vector<std::uint8_t> data(total_elements * element_bytes);
  std::size_t offset = 0;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const std::vector<float> flat = read_unit(u);
    STRATA_ASSERT(flat.size() == unit_numel(units[u]), "unit buffer of the wrong size");
    std::size_t tensor_offset = 0;
    for (const TensorSpec& spec : units[u].tensors) {
      const std::span<const float> values =
          std::span<const float>(flat).subspan(tensor_offset, spec.numel());
      tensor_offset += spec.numel();
      const std::size_t bytes = values.size() * element_bytes;
      header[tensor_name(units[u], spec, prefix_unit_names)] = {
          {"dtype", safetensors_dtype_name(dtype)},
          {"shape", spec.shape},
          {"data_offsets", {offset, offset + bytes}}};
      std::uint8_t* out = data.data() + offset;
      if (dtype == DType::kFp32) {
        if (bytes != 0) std::memcpy(out, values.data(), bytes);
      } else {
        for (std::size_t i = 0; i < values.size(); ++i) {
          const std::uint16_t half =
              dtype == DType::kBf16 ? to_bf16(values[i]).bits : to_fp16(values[i]).bits;
          std::memcpy(out + 2 * i, &half, 2);
        }
      }
      offset += bytes;
    }
  }
  std::string header_text = header.dump();
  // Pad with spaces (valid JSON whitespace) so the data starts 8-byte aligned, as the reference
  // writer does.
  header_text.append((kLengthBytes - header_text.size() % kLengthBytes) % kLengthBytes, ' ');
  std::uint8_t length[kLengthBytes];
  const std::uint64_t header_length = header_text.size();
  std::memcpy(length, &header_length, kLengthBytes);
  const std::span<const std::uint8_t> chunks[] = {
      std::span<const std::uint8_t>(length, kLengthBytes),
      std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(header_text.data()),
                                    header_text.size()),
      std::span<const std::uint8_t>(data)};
  io::write_file_atomically(path, chunks);
}

void load_safetensors(const std::filesystem::path& path, const std::vector<UnitSpec>& units,
                      const UnitWriter& write_unit, bool prefix_unit_names) {
  const SafetensorsFile file = SafetensorsFile::read(path);
  // Check everything before handing out any unit.
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
  std::vector<float> flat;
  for (std::size_t u = 0; u < units.size(); ++u) {
    flat.resize(unit_numel(units[u]));
    std::size_t offset = 0;
    for (const TensorSpec& spec : units[u].tensors) {
      file.read_fp32(*file.find(tensor_name(units[u], spec, prefix_unit_names)),
                     std::span<float>(flat).subspan(offset, spec.numel()));
      offset += spec.numel();
    }
    write_unit(u, flat);
  }
}

}  // namespace strata::runtime
