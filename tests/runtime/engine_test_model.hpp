// A small model for the Engine's tests: an MLP (linear layers with tanh between them, one unit per
// layer) regressing fixed random targets with a mean-squared-error loss, forward and backward in
// plain fp32 loops over the Engine's gathered views. On a device whose memory the CPU does not
// address (CUDA), set_device() makes it copy the views to the host and the gradients to the device.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "runtime/engine/engine.hpp"
#include "tiers/device/device.hpp"

namespace strata::runtime::testing {

class TinyMlp {
 public:
  // widths: {in, hidden..., out}; one unit per layer with tensors "w" (in x out) and "b" (out).
  TinyMlp(std::vector<std::uint32_t> widths, std::uint32_t batch, std::uint32_t data_seed)
      : widths_(std::move(widths)), batch_(batch) {
    std::mt19937 random(data_seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    inputs_.resize(static_cast<std::size_t>(batch_) * widths_.front());
    targets_.resize(static_cast<std::size_t>(batch_) * widths_.back());
    for (float& x : inputs_) x = normal(random);
    for (float& y : targets_) y = 0.5f * normal(random);
  }

  // Registers each matrix "w" without an fp32 view (TensorSpec::fp32_view = false) and reads it
  // from its bf16 view, widened here (the same values): for bf16 parameters only.
  void read_matrices_in_bf16() { matrices_in_bf16_ = true; }

  // Gathered views and gradients live in `device`'s memory, reached through its streams.
  void set_device(tiers::Device& device) {
    device_ = &device;
    stream_.emplace(device.create_stream());
  }

  void add_units(Engine& engine) {
    for (std::size_t layer = 0; layer + 1 < widths_.size(); ++layer) {
      UnitSpec unit;
      unit.name = "layer" + std::to_string(layer);
      const float std = 1.0f / std::sqrt(static_cast<float>(widths_[layer]));
      unit.tensors.push_back({"w", {widths_[layer], widths_[layer + 1]}, TensorInit::normal(std)});
      unit.tensors.back().fp32_view = !matrices_in_bf16_;
      unit.tensors.push_back({"b", {widths_[layer + 1]}, TensorInit::zeros()});
      units_.push_back(engine.add_unit(unit));
    }
  }

  // One forward + backward pass; hands each layer's gradient to reduce_grads. Returns the loss.
  // `loss_scale` multiplies the loss (fp16 training); `grad_sink`, when set, sees every gradient.
  // `before_reduce`, when set, may change each gradient before it reaches reduce_grads (plain
  // data parallelism averages it over the ranks there).
  float train_step(Engine& engine, double loss_scale = 1.0,
                   std::vector<std::vector<float>>* grad_sink = nullptr,
                   const std::function<void(std::vector<float>&)>& before_reduce = {}) {
    const std::size_t layers = units_.size();
    std::vector<std::vector<float>> activations;
    activations.reserve(layers + 1);
    activations.push_back(inputs_);
    for (std::size_t l = 0; l < layers; ++l) {
      GatheredUnit unit = engine.gather(units_[l]);
      std::vector<float> w_storage, b_storage;
      activations.push_back(linear(view(unit, "w", w_storage), view(unit, "b", b_storage),
                                   activations[l], widths_[l], widths_[l + 1], l + 1 < layers));
    }
    const std::vector<float>& out = activations[layers];
    float loss = 0;
    std::vector<float> grad_out(out.size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      const float diff = out[i] - targets_[i];
      loss += diff * diff;
      grad_out[i] = static_cast<float>(2.0 * diff / out.size() * loss_scale);
    }
    loss /= static_cast<float>(out.size());
    if (grad_sink) grad_sink->assign(layers, {});
    for (std::size_t l = layers; l-- > 0;) {
      GatheredUnit unit = engine.gather(units_[l]);
      const std::uint32_t in = widths_[l];
      const std::uint32_t outw = widths_[l + 1];
      // Through tanh (all layers but the last).
      if (l + 1 < layers) {
        for (std::size_t i = 0; i < grad_out.size(); ++i) {
          const float y = activations[l + 1][i];
          grad_out[i] *= 1.0f - y * y;
        }
      }
      std::vector<float> grads(static_cast<std::size_t>(in) * outw + outw, 0.0f);
      std::vector<float> grad_in(static_cast<std::size_t>(batch_) * in, 0.0f);
      std::vector<float> w_storage;
      const std::span<const float> w = view(unit, "w", w_storage);
      for (std::uint32_t n = 0; n < batch_; ++n) {
        for (std::uint32_t o = 0; o < outw; ++o) {
          const float g = grad_out[n * outw + o];
          grads[static_cast<std::size_t>(in) * outw + o] += g;
          for (std::uint32_t i = 0; i < in; ++i) {
            grads[static_cast<std::size_t>(i) * outw + o] += activations[l][n * in + i] * g;
            grad_in[n * in + i] += w[static_cast<std::size_t>(i) * outw + o] * g;
          }
        }
      }
      if (before_reduce) before_reduce(grads);
      reduce(engine, units_[l], grads);
      if (grad_sink) (*grad_sink)[l] = grads;
      grad_out = std::move(grad_in);
    }
    return loss;
  }

  const std::vector<UnitId>& units() const { return units_; }

 private:
  std::span<const float> view(const GatheredUnit& unit, std::string_view name,
                              std::vector<float>& storage) {
    const std::span<const float> tensor = unit.tensor(name);
    if (tensor.empty() && matrices_in_bf16_) return widened_bf16(unit, name, storage);
    if (device_ == nullptr) return tensor;
    storage.resize(tensor.size());
    stream_->copy_to_host(
        storage.data(),
        {reinterpret_cast<std::byte*>(const_cast<float*>(tensor.data())), tensor.size_bytes()});
    stream_->synchronize();
    return storage;
  }

  std::span<const float> widened_bf16(const GatheredUnit& unit, std::string_view name,
                                      std::vector<float>& storage) {
    const std::span<const std::uint16_t> bf16 = unit.tensor_bf16(name == "w" ? 0 : 1);
    std::vector<std::uint16_t> bits(bf16.size());
    if (device_ == nullptr) {
      std::copy(bf16.begin(), bf16.end(), bits.begin());
    } else {
      stream_->copy_to_host(bits.data(), {reinterpret_cast<std::byte*>(
                                              const_cast<std::uint16_t*>(bf16.data())),
                                          bf16.size_bytes()});
      stream_->synchronize();
    }
    storage.clear();
    for (const std::uint16_t b : bits) {
      const std::uint32_t widened = std::uint32_t{b} << 16;
      float value = 0.0f;
      std::memcpy(&value, &widened, sizeof(float));
      storage.push_back(value);
    }
    return storage;
  }

  void reduce(Engine& engine, UnitId unit, const std::vector<float>& grads) {
    if (device_ == nullptr) {
      engine.reduce_grads(unit, grads);
      return;
    }
    const std::uint64_t bytes = grads.size() * sizeof(float);
    tiers::DeviceBuffer buffer = device_->allocate(bytes);
    stream_->copy_to_device(buffer.span(), grads.data());
    stream_->synchronize();
    engine.reduce_grads(unit, std::span<const float>(buffer.span().as<float>(), grads.size()));
  }

  std::vector<float> linear(std::span<const float> w, std::span<const float> b,
                            const std::vector<float>& x, std::uint32_t in, std::uint32_t out,
                            bool activation) const {
    std::vector<float> y(static_cast<std::size_t>(batch_) * out);
    for (std::uint32_t n = 0; n < batch_; ++n) {
      for (std::uint32_t o = 0; o < out; ++o) {
        float sum = b[o];
        for (std::uint32_t i = 0; i < in; ++i)
          sum += x[n * in + i] * w[static_cast<std::size_t>(i) * out + o];
        y[n * out + o] = activation ? std::tanh(sum) : sum;
      }
    }
    return y;
  }

  std::vector<std::uint32_t> widths_;
  std::uint32_t batch_;
  std::vector<float> inputs_;
  std::vector<float> targets_;
  std::vector<UnitId> units_;
  bool matrices_in_bf16_ = false;
  tiers::Device* device_ = nullptr;
  std::optional<tiers::Stream> stream_;
};

}  // namespace strata::runtime::testing
