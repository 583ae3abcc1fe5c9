// The header of a safetensors file read without reading its data: 8 bytes of little-endian header
// length, the JSON header, then the tensors. Each tensor's byte range is validated against its
// dtype, shape and the file's size, so a reader can then pread any element range of any tensor.
// Tensors of dtypes strata does not convert (I64, BOOL, ...) are listed (a checkpoint may hold
// such buffers, which the loader skips) but reading them is an error.
// Errors are runtime::SafetensorsError naming the file, the tensor and what was wrong.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "models/checkpoint/file_io.hpp"
#include "runtime/config/config.hpp"

namespace strata::llm {

struct StoredTensor {
  std::string name;
  std::string dtype_name;               // as in the header: "F32", "BF16", "I64", ...
  std::optional<DType> dtype;  // F32, BF16, F16: what strata converts to fp32
  std::vector<std::size_t> shape;
  std::uint64_t offset_bytes = 0;  // from the start of the file
  std::uint64_t size_bytes = 0;

  std::size_t numel() const;
};

struct SafetensorsHeader {
  std::vector<StoredTensor> tensors;  // in data order
  std::map<std::string, std::string> metadata;

  const StoredTensor* find(const std::string& name) const;
};

// Largest header accepted: real checkpoints' headers are a few hundred KiB.
inline constexpr std::uint64_t kMaxHeaderBytes = 100ull << 20;

SafetensorsHeader read_safetensors_header(const ReadOnlyFile& file);

// Elements [first, first + out.size()) of `tensor`, converted to fp32 (one pread of their bytes).
void read_tensor_elements(const ReadOnlyFile& file, const StoredTensor& tensor, std::size_t first,
                          std::span<float> out);

// "F32", "BF16", "F16".
const char* safetensors_dtype_name(DType dtype);
std::string shape_text(std::span<const std::size_t> shape);

}  // namespace strata::llm
