// Proves the GPT's CUDA backend: on the same parameters and batch it gives the host model's loss
// and gradients (within fp32 rounding), two runs are bitwise equal, backward overwrites its
// gradient buffers, and asynchronous calls give the synchronous bits. Skips, saying why, where CUDA cannot be used.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "models/gpt/gpt_model.hpp"
#include "models/gpt/parameter_store.hpp"
#include "tiers/device/compute_fence.hpp"
#include "tiers/device/device.hpp"

namespace strata::gpt {
namespace {

constexpr std::uint64_t kSeed = 20261129;

runtime::ModelConfig cuda_config(bool tied_head) {
  runtime::ModelConfig config;
  config.layers = 2;
  config.d_model = 64;
  config.heads = 4;
  config.seq_len = 32;
  config.vocab = 256;
  config.micro_batch = 4;
  config.tied_head = tied_head;
  return config;
}

std::unique_ptr<tiers::Device> cuda_device() {
  tiers::DeviceOptions options;
  options.kind = tiers::DeviceKind::kCuda;
  options.budget_bytes = 1ull << 30;
  return tiers::make_device(options);
}

// GPT-2's initialisation moved by up to ±0.05 everywhere, so biases and LayerNorm parameters
// carry gradients of their own.
ParameterStore perturbed_parameters(const std::vector<UnitSpec>& units, std::uint64_t seed) {
  ParameterStore store = ParameterStore::initialized(units, seed);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-0.05f, 0.05f);
  for (std::size_t u = 0; u < units.size(); ++u) {
    for (float& value : store.unit(u)) value += uniform(rng);
  }
  return store;
}

std::vector<std::int32_t> random_tokens(std::size_t count, std::uint32_t vocab,
                                        std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::int32_t> tokens(count);
  for (std::int32_t& token : tokens) token = static_cast<std::int32_t>(rng() % vocab);
  return tokens;
}

// ParameterStore's training loop with every unit's parameters and gradients in device memory.
class DeviceRun {
 public:
  DeviceRun(tiers::Device& device, const ParameterStore& params)
      : stream_(device.create_stream()), units_(params.units()) {
    for (std::size_t u = 0; u < units_.size(); ++u) {
      const std::uint64_t bytes = units_[u].numel * sizeof(float);
      params_.push_back(device.allocate(bytes));
      grads_.push_back(device.allocate(bytes));
      stream_.copy_to_device(params_[u].span(), params.unit(u).data());
    }
    stream_.synchronize();
  }

  // Fills every gradient buffer with NaN bytes: backward must overwrite all of it.
  void poison_gradients() {
    for (tiers::DeviceBuffer& grad : grads_) stream_.fill_bytes(grad.span(), 0xff);
    stream_.synchronize();
  }

  double forward_backward(GptModel& model, std::span<const std::int32_t> tokens) {
    model.set_batch(tokens);
    for (std::size_t u = 0; u < units_.size(); ++u) {
      model.forward_unit(u, views(u), shared(u));
    }
    const double loss = model.loss();
    for (std::size_t u = units_.size(); u-- > 0;) {
      model.backward_unit(u, views(u), split_unit(units_[u], device_floats(grads_[u])), shared(u));
    }
    return loss;
  }

  ParameterStore gradients() {
    ParameterStore host(units_);
    for (std::size_t u = 0; u < units_.size(); ++u) {
      stream_.copy_to_host(host.unit(u).data(), grads_[u].span());
    }
    stream_.synchronize();
    return host;
  }

 private:
  std::span<float> device_floats(const tiers::DeviceBuffer& buffer) const {
    return {buffer.span().as<float>(), buffer.bytes() / sizeof(float)};
  }
  std::vector<std::span<const float>> views(std::size_t u) const {
    return split_unit(units_[u], std::span<const float>(device_floats(params_[u])));
  }
  std::vector<std::span<const float>> shared(std::size_t u) const {
    if (!units_[u].reads_embedding) return {};
    return views(0);
  }

  tiers::Stream stream_;
  std::vector<UnitSpec> units_;
  std::vector<tiers::DeviceBuffer> params_, grads_;
};

class GptCuda : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    const std::string reason = tiers::cuda_unavailable_reason();
    if (!reason.empty()) GTEST_SKIP() << "no usable CUDA device: " << reason;
  }
};

// Tolerances. Host and GPU run the same arithmetic in fp32 but sum in different orders (cuBLAS's
// blocked products against OpenBLAS's, 32-lane butterflies against sequential rows), the GPU
// fuses multiply-adds, and expf/tanhf/logf differ in their last bit or two. Each of these is a
// relative change of a few 2⁻²⁴ (≈ 6e-8) times √k for sums of k ≤ 256 terms, i.e. ~1e-6 of an
// intermediate's magnitude; through two blocks forward and back that stays of order 1e-6–1e-5
// of a tensor's largest gradient. The bounds (loss 1e-5 relative, every gradient element within
// 1e-4 of its tensor's largest gradient) leave ~10× headroom over that, while an indexing,
// reduction or missing-term bug moves gradients by O(1) of that scale.
TEST_P(GptCuda, MatchesTheHostModelOnTheSameParametersAndBatch) {
  const runtime::ModelConfig config = cuda_config(GetParam());
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  auto device = cuda_device();
  GptModel host_model(config);
  GptModel cuda_model(config, device.get());
  ASSERT_TRUE(cuda_model.on_cuda());
  const ParameterStore params = perturbed_parameters(host_model.units(), kSeed);
  // Three of the four sequences: a short batch uses only part of the activations.
  const std::vector<std::int32_t> tokens =
      random_tokens(3 * (config.seq_len + 1), config.vocab, kSeed + 1);

  ParameterStore host_grads(host_model.units());
  const double host_loss = forward_backward(host_model, params, host_grads, tokens);
  DeviceRun run(*device, params);
  run.poison_gradients();
  const double cuda_loss = run.forward_backward(cuda_model, tokens);
  EXPECT_NEAR(cuda_loss, host_loss, 1e-5 * host_loss);

  const ParameterStore cuda_grads = run.gradients();
  for (std::size_t u = 0; u < host_model.units().size(); ++u) {
    const UnitSpec& unit = host_model.units()[u];
    for (const TensorSpec& tensor : unit.tensors) {
      const std::span<const float> expected = host_grads.find(tensor.name);
      const std::span<const float> actual = cuda_grads.find(tensor.name);
      float scale = 0.0f;
      for (const float g : expected) scale = std::max(scale, std::abs(g));
      ASSERT_GT(scale, 0.0f) << tensor.name;
      std::size_t bad = 0;
      for (std::size_t i = 0; i < expected.size(); ++i) {
        if (!(std::abs(actual[i] - expected[i]) <= 1e-4f * scale)) {
          if (++bad <= 3) {
            ADD_FAILURE() << tensor.name << "[" << i << "]: CUDA " << actual[i] << ", host "
                          << expected[i] << " (largest |gradient| " << scale << ")";
          }
        }
      }
      EXPECT_EQ(bad, 0u) << tensor.name;
    }
  }
}

TEST_P(GptCuda, TwoRunsAreBitwiseEqual) {
  const runtime::ModelConfig config = cuda_config(GetParam());
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  auto device = cuda_device();
  GptModel first_model(config, device.get());
  GptModel second_model(config, device.get());
  const ParameterStore params = perturbed_parameters(first_model.units(), kSeed);
  const std::vector<std::int32_t> tokens =
      random_tokens(config.micro_batch * (config.seq_len + 1), config.vocab, kSeed + 2);
  DeviceRun run(*device, params);

  const double first_loss = run.forward_backward(first_model, tokens);
  const ParameterStore first = run.gradients();
  run.poison_gradients();
  const double again_loss = run.forward_backward(first_model, tokens);  // same model, reused
  const ParameterStore again = run.gradients();
  run.poison_gradients();
  const double second_loss = run.forward_backward(second_model, tokens);  // a fresh model
  const ParameterStore second = run.gradients();

  EXPECT_EQ(std::memcmp(&first_loss, &again_loss, sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(&first_loss, &second_loss, sizeof(double)), 0);
  for (std::size_t u = 0; u < first.units().size(); ++u) {
    const std::size_t bytes = first.unit(u).size_bytes();
    EXPECT_EQ(std::memcmp(first.unit(u).data(), again.unit(u).data(), bytes), 0)
        << first.units()[u].name;
    EXPECT_EQ(std::memcmp(first.unit(u).data(), second.unit(u).data(), bytes), 0)
        << first.units()[u].name;
    for (const float g : first.unit(u)) ASSERT_TRUE(std::isfinite(g)) << first.units()[u].name;
  }
}

// [Note: asynchronous unit calls]: after enable_asynchronous_calls() each call returns with its
// work queued and records its end on the fence; waited for through it, the loss and gradients
// are the synchronous model's, bit for bit, and every forward and backward call left a ticket.
TEST_P(GptCuda, AsynchronousCallsGiveTheSynchronousBits) {
  const runtime::ModelConfig config = cuda_config(GetParam());
  auto device = cuda_device();
  GptModel synchronous(config, device.get());
  GptModel asynchronous(config, device.get());
  tiers::ComputeFence* fence = asynchronous.enable_asynchronous_calls();
  ASSERT_NE(fence, nullptr);
  const ParameterStore params = perturbed_parameters(synchronous.units(), kSeed);
  const std::vector<std::int32_t> tokens =
      random_tokens(config.micro_batch * (config.seq_len + 1), config.vocab, kSeed + 4);
  DeviceRun run(*device, params);

  const double sync_loss = run.forward_backward(synchronous, tokens);
  const ParameterStore sync_grads = run.gradients();
  run.poison_gradients();
  const std::uint64_t before = fence->mark();
  const double async_loss = run.forward_backward(asynchronous, tokens);
  EXPECT_EQ(fence->mark() - before, 2 * asynchronous.units().size());
  fence->wait(fence->mark());
  const ParameterStore async_grads = run.gradients();

  EXPECT_EQ(std::memcmp(&sync_loss, &async_loss, sizeof(double)), 0);
  for (std::size_t u = 0; u < sync_grads.units().size(); ++u) {
    EXPECT_EQ(std::memcmp(sync_grads.unit(u).data(), async_grads.unit(u).data(),
                          sync_grads.unit(u).size_bytes()),
              0)
        << sync_grads.units()[u].name;
  }
}

INSTANTIATE_TEST_SUITE_P(Head, GptCuda, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? "Tied" : "Untied";
                         });

}  // namespace
}  // namespace strata::gpt
