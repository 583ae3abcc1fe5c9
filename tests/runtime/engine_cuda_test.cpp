// Proves the Engine trains on a real CudaDevice (parameters and gradients in GPU memory, the
// optimizer on the host or NVMe through pinned staging, or on the device, updated in place by the
// fused CUDA optimizer, in fp32 and compressed formats) and gives bitwise the parameters of the
// host device's CPU optimizer; skips, saying why, where no GPU is usable.
#include <cstring>
#include <utility>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "runtime/comm/local_comm.hpp"
#include "runtime/engine/engine.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/engine_test_config.hpp"
#include "tests/runtime/engine_test_model.hpp"
#include "tiers/device/device.hpp"
#if defined(STRATA_HAVE_NCCL)
#include "runtime/comm/nccl_comm.hpp"
#endif

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using testing::TinyMlp;

constexpr int kSteps = 4;

// The Engine tests' config with a 256 MiB device budget (train_on picks the device kind).
Config cuda_config(const ScratchDir& dir, Tier params, Tier grads, Tier optimizer) {
  Config config = testing::engine_test_config(dir.path().string());
  config.tiers.device.budget_bytes = 256ull << 20;
  config.zero.params = params;
  config.zero.grads = grads;
  config.zero.optimizer = optimizer;
  return config;
}

// Trains kSteps on `kind` with `comm` (nullptr: LocalComm); returns every unit's master shard.
std::vector<std::vector<float>> train_on(tiers::DeviceKind kind, const Config& config,
                                         comm::Communicator* comm = nullptr) {
  tiers::DeviceOptions options;
  options.kind = kind;
  options.budget_bytes = config.tiers.device.budget_bytes;
  auto device = tiers::make_device(options);
  comm::LocalComm local;
  Engine engine(config, *device, comm != nullptr ? *comm : local);
  TinyMlp model(testing::kEngineTestWidths, 16, /*data_seed=*/7);
  if (kind == tiers::DeviceKind::kCuda) model.set_device(*device);
  model.add_units(engine);
  engine.finalize();
  for (int step = 0; step < kSteps; ++step) {
    model.train_step(engine);
    EXPECT_FALSE(engine.step().skipped);
  }
  std::vector<std::vector<float>> masters;
  for (UnitId unit : model.units()) masters.push_back(engine.master_shard(unit));
  return masters;
}

void expect_same(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t u = 0; u < a.size(); ++u) {
    ASSERT_EQ(a[u].size(), b[u].size());
    EXPECT_EQ(std::memcmp(a[u].data(), b[u].data(), a[u].size() * sizeof(float)), 0)
        << what << ": unit " << u << " differs from the host device";
  }
}

// The config `configure(dir)` makes, trained on the host device and on CUDA: the same masters.
template <typename Configure>
void expect_cuda_like_host(const Configure& configure, const std::string& what) {
  ScratchDir host_dir;
  const auto host = train_on(tiers::DeviceKind::kHost, configure(host_dir));
  ScratchDir cuda_dir;
  const auto cuda = train_on(tiers::DeviceKind::kCuda, configure(cuda_dir));
  expect_same(host, cuda, what);
}

class EngineCuda : public ::testing::TestWithParam<std::tuple<Tier, Tier, Tier>> {
 protected:
  void SetUp() override {
    const std::string reason = tiers::cuda_unavailable_reason();
    if (!reason.empty()) GTEST_SKIP() << "no usable CUDA device: " << reason;
  }
};

// One rank: the same casts (round to nearest even), fp32 accumulation and CPU optimizer (or the
// CUDA optimizer, bitwise cpu_adam's) as the host device, so bitwise the same parameters.
TEST_P(EngineCuda, TrainsBitwiseLikeTheHostDevice) {
  const auto [params, grads, optimizer] = GetParam();
  ScratchDir host_dir;
  const auto host =
      train_on(tiers::DeviceKind::kHost, cuda_config(host_dir, params, grads, optimizer));
  ScratchDir cuda_dir;
  const auto cuda =
      train_on(tiers::DeviceKind::kCuda, cuda_config(cuda_dir, params, grads, optimizer));
  expect_same(host, cuda,
              fmt::format("params {}, grads {}, optimizer {}", to_string(params), to_string(grads),
                          to_string(optimizer)));
}

class EngineCudaCompressed : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = tiers::cuda_unavailable_reason();
    if (!reason.empty()) GTEST_SKIP() << "no usable CUDA device: " << reason;
  }
};

// The optimizer state on the GPU in compressed formats (int8 moments with a bf16 master rounded
// stochastically; bf16 moments with a Kahan-compensated master): each sub-group updated in place
// by the CUDA optimizer, bitwise the host device's cpu_adam.
TEST_F(EngineCudaCompressed, DeviceStateTrainsBitwiseLikeTheHostDevice) {
  for (const auto& [moments, rounding] :
       {std::pair{cpu_adam::StateDType::kInt8, MasterRounding::kStochastic},
        std::pair{cpu_adam::StateDType::kBf16, MasterRounding::kKahan}}) {
    const auto configure = [&](const ScratchDir& dir) {
      Config config = cuda_config(dir, Tier::kDevice, Tier::kDevice, Tier::kDevice);
      config.optimizer.state_dtype = moments;
      config.optimizer.master_dtype = cpu_adam::StateDType::kBf16;
      config.optimizer.master_rounding = rounding;
      return config;
    };
    expect_cuda_like_host(configure, fmt::format("{} moments, bf16 master ({})",
                                                 cpu_adam::state_dtype_name(moments),
                                                 to_string(rounding)));
  }
}

// [zero] optimizer_device_fraction: the first units' optimizer state in GPU memory, updated there
// by the fused CUDA optimizer, the rest on the host (or NVMe) updated by the CPU: bitwise the host
// device's parameters, the GPU's and the CPU's updates side by side in one step.
TEST_F(EngineCudaCompressed, OptimizerSplitBetweenGpuAndCpuTrainsBitwiseLikeTheHostDevice) {
  for (const auto& [home, host_fraction] : {std::pair{Tier::kHost, 0.0}, std::pair{Tier::kNvme, 0.6}}) {
    const auto configure = [&](const ScratchDir& dir) {
      Config config = cuda_config(dir, Tier::kDevice, Tier::kDevice, home);
      config.zero.optimizer_device_fraction = 0.4;  // the first unit's shard: 2048 of 8192
      config.zero.optimizer_host_fraction = host_fraction;
      return config;
    };
    expect_cuda_like_host(configure, fmt::format("optimizer {}, device fraction 0.4, host "
                                                 "fraction {}",
                                                 to_string(home), host_fraction));
  }
}

#if defined(STRATA_HAVE_NCCL)
// NcclComm takes device memory: the Engine hands it the gathered and gradient buffers directly.
TEST_P(EngineCuda, TrainsWithNcclCommLikeTheHostDevice) {
  const auto [params, grads, optimizer] = GetParam();
  ScratchDir host_dir;
  const auto host =
      train_on(tiers::DeviceKind::kHost, cuda_config(host_dir, params, grads, optimizer));
  comm::LocalComm bootstrap;
  comm::NcclComm nccl(bootstrap);
  ScratchDir cuda_dir;
  const auto cuda =
      train_on(tiers::DeviceKind::kCuda, cuda_config(cuda_dir, params, grads, optimizer), &nccl);
  expect_same(host, cuda, "NcclComm");
}
#endif

INSTANTIATE_TEST_SUITE_P(Placements, EngineCuda,
                         ::testing::Values(std::tuple{Tier::kDevice, Tier::kDevice, Tier::kHost},
                                           std::tuple{Tier::kDevice, Tier::kDevice, Tier::kDevice},
                                           std::tuple{Tier::kDevice, Tier::kHost, Tier::kNvme},
                                           std::tuple{Tier::kNvme, Tier::kDevice, Tier::kNvme}),
                         [](const auto& param_info) {
                           return fmt::format("params_{}_grads_{}_optimizer_{}",
                                              to_string(std::get<0>(param_info.param)),
                                              to_string(std::get<1>(param_info.param)),
                                              to_string(std::get<2>(param_info.param)));
                         });

}  // namespace
}  // namespace strata::runtime
