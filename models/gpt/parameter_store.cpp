#include "models/gpt/parameter_store.hpp"

#include <algorithm>

#include "base/assert.hpp"

namespace strata::gpt {

ParameterStore::ParameterStore(std::vector<UnitSpec> units) : units_(std::move(units)) {
  values_.reserve(units_.size());
  for (const UnitSpec& unit : units_) {
    values_.emplace_back(unit.numel, 0.0f);
  }
}

ParameterStore ParameterStore::initialized(std::vector<UnitSpec> units, std::uint64_t seed) {
  ParameterStore store(std::move(units));
  for (std::size_t u = 0; u < store.units_.size(); ++u) {
    initialize_unit_range(store.units_[u], seed, store.values_[u], 0);
  }
  return store;
}

std::size_t ParameterStore::parameter_count() const {
  std::size_t count = 0;
  for (const UnitSpec& unit : units_) {
    count += unit.numel;
  }
  return count;
}

std::vector<std::span<const float>> ParameterStore::views(std::size_t index) const {
  return split_unit(units_[index], std::span<const float>(values_[index]));
}

std::vector<std::span<float>> ParameterStore::mutable_views(std::size_t index) {
  return split_unit(units_[index], std::span<float>(values_[index]));
}

const TensorSpec* ParameterStore::find_spec(std::string_view name) const {
  for (const UnitSpec& unit : units_) {
    for (const TensorSpec& tensor : unit.tensors) {
      if (tensor.name == name) {
        return &tensor;
      }
    }
  }
  return nullptr;
}

std::span<float> ParameterStore::find(std::string_view name) {
  for (std::size_t u = 0; u < units_.size(); ++u) {
    for (const TensorSpec& tensor : units_[u].tensors) {
      if (tensor.name == name) {
        return std::span<float>(values_[u]).subspan(tensor.offset, tensor.numel());
      }
    }
  }
  return {};
}

std::span<const float> ParameterStore::find(std::string_view name) const {
  return const_cast<ParameterStore*>(this)->find(name);
}

void ParameterStore::fill(float value) {
  for (std::vector<float>& unit : values_) {
    std::fill(unit.begin(), unit.end(), value);
  }
}

namespace {

void forward_all(GptModel& model, const ParameterStore& params,
                 std::span<const std::int32_t> tokens) {
  STRATA_ASSERT(params.units().size() == model.unit_count());
  const std::vector<std::span<const float>> embedding = params.views(0);
  model.set_batch(tokens);
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    const std::vector<std::span<const float>> views = params.views(u);
    const UnitParams shared =
        model.units()[u].reads_embedding ? UnitParams(embedding) : UnitParams();
    model.forward_unit(u, views, shared);
  }
}

}  // namespace

double forward_backward(GptModel& model, const ParameterStore& params, ParameterStore& grads,
                        std::span<const std::int32_t> tokens) {
  STRATA_ASSERT(grads.units().size() == model.unit_count());
  forward_all(model, params, tokens);
  const double loss = model.loss();
  const std::vector<std::span<const float>> embedding = params.views(0);
  for (std::size_t u = model.unit_count(); u-- > 0;) {
    const std::vector<std::span<const float>> views = params.views(u);
    const std::vector<std::span<float>> grad_views = grads.mutable_views(u);
    const UnitParams shared =
        model.units()[u].reads_embedding ? UnitParams(embedding) : UnitParams();
    model.backward_unit(u, views, grad_views, shared);
  }
  return loss;
}

double forward_loss(GptModel& model, const ParameterStore& params,
                    std::span<const std::int32_t> tokens) {
  forward_all(model, params, tokens);
  return model.loss();
}

}  // namespace strata::gpt
