#include "models/gpt/safetensors.hpp"

#include <algorithm>

namespace strata::gpt {
namespace {

// The runtime's view of the GPT's units: the same names, shapes and order.
std::vector<runtime::UnitSpec> runtime_units(const std::vector<UnitSpec>& units) {
  std::vector<runtime::UnitSpec> out;
  out.reserve(units.size());
  for (const UnitSpec& unit : units) {
    runtime::UnitSpec spec;
    spec.name = unit.name;
    for (const TensorSpec& tensor : unit.tensors) {
      spec.tensors.push_back({tensor.name, {tensor.shape.begin(), tensor.shape.end()}, {}});
    }
    out.push_back(std::move(spec));
  }
  return out;
}

}  // namespace

void save_safetensors(const std::filesystem::path& path, const std::vector<UnitSpec>& units,
                      const UnitReader& read_unit, DType dtype,
                      const std::map<std::string, std::string>& metadata) {
  runtime::save_safetensors(
      path, runtime_units(units),
      [&read_unit](std::size_t index) {
        const std::span<const float> flat = read_unit(index);
        return std::vector<float>(flat.begin(), flat.end());
      },
      dtype, metadata);
}

void save_safetensors(const std::filesystem::path& path, const ParameterStore& params,
                      DType dtype, const std::map<std::string, std::string>& metadata) {
  save_safetensors(
      path, params.units(), [&](std::size_t index) { return params.unit(index); }, dtype, metadata);
}

void load_safetensors(const std::filesystem::path& path, const std::vector<UnitSpec>& units,
                      const UnitWriter& write_unit) {
  runtime::load_safetensors(path, runtime_units(units), write_unit);
}

void load_safetensors(const std::filesystem::path& path, ParameterStore& params) {
  load_safetensors(path, params.units(), [&](std::size_t index, std::span<const float> values) {
    std::copy(values.begin(), values.end(), params.unit(index).begin());
  });
}

}  // namespace strata::gpt
