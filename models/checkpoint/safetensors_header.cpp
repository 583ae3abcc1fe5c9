#include "models/checkpoint/safetensors_header.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/assert.hpp"
#include "base/float16.hpp"
#include "runtime/checkpoint/safetensors.hpp"

namespace strata::llm {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies it as is");

using runtime::SafetensorsError;

// Bytes per element of every dtype the format defines (0: unknown).
std::uint32_t element_bytes(const std::string& dtype) {
  static const std::map<std::string, std::uint32_t> kSizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"U64", 8}, {"I32", 4},
      {"U32", 4}, {"I16", 2}, {"U16", 2}, {"I8", 1},   {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1},
      {"F8_E5M2", 1}};
  const auto found = kSizes.find(dtype);
  return found == kSizes.end() ? 0 : found->second;
}

std::optional<DType> convertible(const std::string& dtype) {
  if (dtype == "F32") return DType::kFp32;
  if (dtype == "BF16") return DType::kBf16;
  if (dtype == "F16") return DType::kFp16;
  return std::nullopt;
}

std::uint64_t read_count(const nlohmann::json& value, const std::string& file,
                         const std::string& tensor, const char* what) {
  if (!value.is_number_unsigned()) {
    throw SafetensorsError(file, tensor,
                           std::string(what) + " must be a non-negative integer, got " +
                               value.dump());
  }
  return value.get<std::uint64_t>();
}

StoredTensor parse_entry(const std::string& name, const nlohmann::json& value,
                         const std::string& file, std::uint64_t data_offset) {
  if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
      !value.contains("data_offsets")) {
    throw SafetensorsError(file, name,
                           "entry must be an object with dtype, shape and data_offsets, got " +
                               value.dump());
  }
  StoredTensor tensor;
  tensor.name = name;
  const nlohmann::json& dtype = value["dtype"];
  if (!dtype.is_string() || element_bytes(dtype.get<std::string>()) == 0) {
    throw SafetensorsError(file, name, "unknown dtype " + dtype.dump());
  }
  tensor.dtype_name = dtype.get<std::string>();
  tensor.dtype = convertible(tensor.dtype_name);
  const nlohmann::json& shape = value["shape"];
  if (!shape.is_array()) {
    throw SafetensorsError(file, name, "shape must be an array, got " + shape.dump());
  }
  std::uint64_t elements = 1;
  for (const nlohmann::json& dim : shape) {
    const std::uint64_t extent = read_count(dim, file, name, "shape dimension");
    if (extent != 0 && elements > (std::uint64_t{1} << 56) / extent) {
      throw SafetensorsError(file, name, "shape " + shape.dump() + " overflows");
    }
    elements *= extent;
    tensor.shape.push_back(static_cast<std::size_t>(extent));
  }
  const nlohmann::json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    throw SafetensorsError(file, name, "data_offsets must be [begin, end], got " + offsets.dump());
  }
  const std::uint64_t begin = read_count(offsets[0], file, name, "data_offsets begin");
  const std::uint64_t end = read_count(offsets[1], file, name, "data_offsets end");
  const std::uint64_t expected = elements * element_bytes(tensor.dtype_name);
  if (end < begin || end - begin != expected) {
    throw SafetensorsError(file, name,
                           "shape " + shape.dump() + " of " + tensor.dtype_name + " needs " +
                               std::to_string(expected) + " bytes, data_offsets " +
                               offsets.dump() + " hold " +
                               (end < begin ? std::string("a negative range")
                                            : std::to_string(end - begin)));
  }
  tensor.offset_bytes = data_offset + begin;
  tensor.size_bytes = expected;
  return tensor;
}

}  // namespace

std::size_t StoredTensor::numel() const {
  std::size_t count = 1;
  for (std::size_t extent : shape) count *= extent;
  return count;
}

const StoredTensor* SafetensorsHeader::find(const std::string& name) const {
  for (const StoredTensor& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

SafetensorsHeader read_safetensors_header(const ReadOnlyFile& file) {
  const std::string name = file.path().string();
  if (file.size_bytes() < 8) {
    throw SafetensorsError(name, "", "file of " + std::to_string(file.size_bytes()) +
                                         " bytes is shorter than the 8-byte header length");
  }
  std::uint64_t header_bytes = 0;
  file.read_exact(0, std::as_writable_bytes(std::span<std::uint64_t>(&header_bytes, 1)));
  if (header_bytes > kMaxHeaderBytes || header_bytes > file.size_bytes() - 8) {
    throw SafetensorsError(name, "",
                           "header length " + std::to_string(header_bytes) +
                               " exceeds the file (" + std::to_string(file.size_bytes()) +
                               " bytes) or the " + std::to_string(kMaxHeaderBytes) +
                               "-byte limit");
  }
  std::string text(header_bytes, '\0');
  file.read_exact(8, std::as_writable_bytes(std::span<char>(text)));
  nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    throw SafetensorsError(name, "", "the header is not a JSON object");
  }
  const std::uint64_t data_offset = 8 + header_bytes;
  SafetensorsHeader header;
  for (const auto& [key, value] : json.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) throw SafetensorsError(name, "", "__metadata__ is not an object");
      for (const auto& [meta_key, meta_value] : value.items()) {
        if (!meta_value.is_string()) {
          throw SafetensorsError(name, "", "__metadata__ value of '" + meta_key +
                                               "' is not a string");
        }
        header.metadata[meta_key] = meta_value.get<std::string>();
      }
      continue;
    }
    header.tensors.push_back(parse_entry(key, value, name, data_offset));
  }
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const StoredTensor& a, const StoredTensor& b) {
              return a.offset_bytes < b.offset_bytes;
            });
  std::uint64_t expected_offset = data_offset;
  for (const StoredTensor& tensor : header.tensors) {
    if (tensor.offset_bytes != expected_offset) {
      throw SafetensorsError(name, tensor.name,
                             "data begins at byte " + std::to_string(tensor.offset_bytes) +
                                 ", expected " + std::to_string(expected_offset) +
                                 " (tensors must tile the data without gaps or overlaps)");
    }
    expected_offset += tensor.size_bytes;
  }
  if (expected_offset != file.size_bytes()) {
    throw SafetensorsError(name, "",
                           "tensors end at byte " + std::to_string(expected_offset) +
                               " but the file has " + std::to_string(file.size_bytes()));
  }
  return header;
}

void read_tensor_elements(const ReadOnlyFile& file, const StoredTensor& tensor, std::size_t first,
                          std::span<float> out) {
  if (!tensor.dtype) {
    throw SafetensorsError(file.path().string(), tensor.name,
                           "dtype " + tensor.dtype_name +
                               " cannot be read as parameters (supported: F32, BF16, F16)");
  }
  STRATA_ASSERT(first + out.size() <= tensor.numel());
  const std::uint32_t width = dtype_bytes(*tensor.dtype);
  const std::uint64_t offset = tensor.offset_bytes + std::uint64_t{first} * width;
  if (*tensor.dtype == DType::kFp32) {
    file.read_exact(offset, std::as_writable_bytes(out));
    return;
  }
  std::vector<std::uint16_t> halves(out.size());
  file.read_exact(offset, std::as_writable_bytes(std::span<std::uint16_t>(halves)));
  const bool bf16 = *tensor.dtype == DType::kBf16;
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = bf16 ? to_float(Bf16{halves[i]}) : to_float(Fp16{halves[i]});
  }
}

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
      break;  // never a tensor of a model checkpoint (convertible() accepts only the floats)
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

}  // namespace strata::llm
