// Helpers of the strata_llm tests: tiny model folders (models/checkpoint/tiny_model.hpp), safetensors
// files rewritten tensor by tensor (to break a checkpoint on purpose), and an independent reader
// of a folder's tensors in Python (plain struct/json, no strata code).
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/checkpoint/tiny_model.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "tests/io/io_test_support.hpp"

namespace strata::llm::testing {

using io::testing::ScratchDir;

struct FloatTensor {
  std::string name;
  std::vector<std::size_t> shape;
  std::vector<float> values;
};

// Every tensor of one safetensors file, as fp32, in data order.
inline std::vector<FloatTensor> read_float_tensors(const std::filesystem::path& file) {
  const runtime::SafetensorsReader reader =
      runtime::SafetensorsReader::open(file, runtime::SafetensorsRules::kAnyCheckpoint);
  std::vector<FloatTensor> tensors;
  for (const runtime::SafetensorsEntry& stored : reader.entries()) {
    FloatTensor tensor{stored.name, stored.shape, std::vector<float>(stored.numel())};
    reader.read_fp32(stored, 0, tensor.values);
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

// An F32 safetensors file of `tensors`, in the given order.
inline void write_float_tensors(const std::filesystem::path& file,
                                const std::vector<FloatTensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::uint64_t offset = 0;
  for (const FloatTensor& tensor : tensors) {
    const std::uint64_t bytes = tensor.values.size() * sizeof(float);
    header[tensor.name] = {{"dtype", "F32"}, {"shape", tensor.shape},
                           {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  const std::string text = header.dump();
  const std::uint64_t length = text.size();
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&length), sizeof(length));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const FloatTensor& tensor : tensors) {
    out.write(reinterpret_cast<const char*>(tensor.values.data()),
              static_cast<std::streamsize>(tensor.values.size() * sizeof(float)));
  }
  ASSERT_TRUE(out.good()) << file;
}

inline std::string run_command(const std::string& command) {
  std::string output;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return output;
  char buffer[4096];
  std::size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, got);
  ::pclose(pipe);
  return output;
}

// Python's reading of every tensor of a model folder (single file or index + shards): name ->
// {"shape", "sum" (float64 sum of the values), "first", "last"}. An independent parser of the
// format (json + struct), bf16/f16 widened by bit shifts / struct's 'e'.
inline nlohmann::json python_tensor_summary(const std::filesystem::path& dir) {
  const std::string script = R"PY(
import json, os, struct, sys
d = sys.argv[1]
index = os.path.join(d, 'model.safetensors.index.json')
files = sorted(set(json.load(open(index))['weight_map'].values())) if os.path.exists(index) else ['model.safetensors']
out = {}
for name in files:
    data = open(os.path.join(d, name), 'rb').read()
    n = struct.unpack('<Q', data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    for key, entry in header.items():
        if key == '__metadata__':
            continue
        begin, end = entry['data_offsets']
        raw = data[base + begin: base + end]
        if entry['dtype'] == 'F32':
            values = struct.unpack('<%df' % (len(raw) // 4), raw)
        elif entry['dtype'] == 'F16':
            values = struct.unpack('<%de' % (len(raw) // 2), raw)
        else:
            halves = struct.unpack('<%dH' % (len(raw) // 2), raw)
            values = [struct.unpack('<f', struct.pack('<I', h << 16))[0] for h in halves]
        out[key] = {'shape': entry['shape'], 'dtype': entry['dtype'], 'file': name,
                    'sum': float(sum(values)), 'first': values[0], 'last': values[-1]}
print(json.dumps(out))
)PY";
  const std::filesystem::path script_path = dir.parent_path() / "summary.py";
  std::ofstream(script_path) << script;
  const std::string output =
      run_command("/usr/bin/python3 " + script_path.string() + " " + dir.string());
  return nlohmann::json::parse(output);
}

}  // namespace strata::llm::testing
