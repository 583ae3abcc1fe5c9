// Proves the GPU profile names kernels' kinds from their names (cuBLAS, CUTLASS, NCCL, strata's
// own) and, on a GPU, counts a kernel and a copy it ran in the window, with busy time within it.
#include "tiers/device/gpu_profile.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/units.hpp"
#include "tiers/device/device.hpp"

namespace strata::tiers {
namespace {

TEST(GpuProfile, KernelsAreClassifiedByName) {
  EXPECT_EQ(classify_kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"),
            GpuWork::kGemm);
  EXPECT_EQ(classify_kernel("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NTN"), GpuWork::kGemm);
  EXPECT_EQ(classify_kernel("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>"),
            GpuWork::kGemm);
  EXPECT_EQ(classify_kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096>)"),
            GpuWork::kCollective);
  EXPECT_EQ(classify_kernel("_ZN6strata3llm4cuda12_GLOBAL__N_122flash_attention_forwardEv"),
            GpuWork::kAttention);
  EXPECT_EQ(classify_kernel("_ZN6strata3llm4cuda28weighted_cross_entropy_kernelEv"),
            GpuWork::kLoss);
  EXPECT_EQ(classify_kernel("_ZN6strata5tiers6detail16fused_adam_kernelEv"), GpuWork::kOptimizer);
  EXPECT_EQ(classify_kernel("_ZN6strata3llm4cuda19rms_norm_forward_kernelEv"),
            GpuWork::kElementwise);
}

TEST(GpuProfile, KernelNamesAreShortenedToTheFunction) {
  EXPECT_EQ(short_kernel_name("_ZN6strata3llm4cuda12_GLOBAL__N_119rms_norm_fwd_kernelEPKfPf"),
            "strata::llm::cuda::{anon}::rms_norm_fwd_kernel");
  EXPECT_EQ(short_kernel_name("void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm>(Params)"),
            "cutlass::Kernel2");
  EXPECT_EQ(short_kernel_name("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NTN"),
            "nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NTN");
}

TEST(GpuProfile, TopKernelsAreListedMostTimeFirst) {
  GpuProfile profile;
  profile.kernels = {{"gemm_a", 0.0123, 48}, {"norm", 0.002, 96}, {"tiny", 0.0001, 1}};
  EXPECT_EQ(describe_top_kernels(profile, 2), "gemm_a 12.3 ms x48; norm 2.0 ms x96");
}

TEST(GpuProfile, DescriptionListsKindsThatRanAndTheIdleTime) {
  GpuProfile profile;
  profile.busy_s[static_cast<std::size_t>(GpuWork::kGemm)] = 0.120;
  profile.busy_s[static_cast<std::size_t>(GpuWork::kCopy)] = 0.005;
  profile.busy_s_total = 0.122;
  profile.window_s = 0.200;
  const std::string text = describe(profile);
  EXPECT_NE(text.find("gemm 120.0 ms"), std::string::npos) << text;
  EXPECT_NE(text.find("copies 5.0 ms"), std::string::npos) << text;
  EXPECT_EQ(text.find("attention"), std::string::npos) << text;
  EXPECT_NE(text.find("busy 122.0 of 200.0 ms, idle 78.0 ms"), std::string::npos) << text;
}

TEST(GpuProfileCuda, CountsTheKernelsAndCopiesOfItsWindow) {
  if (const std::string reason = cuda_unavailable_reason(); !reason.empty()) {
    GTEST_SKIP() << "no usable CUDA device: " << reason;
  }
  DeviceOptions options;
  options.kind = DeviceKind::kCuda;
  options.budget_bytes = 1ull << 30;
  std::unique_ptr<Device> device = make_device(options);
  const std::unique_ptr<GpuProfiler> profiler = start_gpu_profiler();
  DeviceBuffer buffer = device->allocate(256 * kMiB);
  std::vector<float> host(buffer.bytes() / sizeof(float));
  Stream stream = device->create_stream();
  for (int i = 0; i < 4; ++i) stream.fill(buffer.span(), 1.5f);
  stream.copy_to_host(host.data(), buffer.span());
  stream.synchronize();
  const GpuProfile profile = profiler->collect();
  EXPECT_GT(profile.busy(GpuWork::kElementwise), 0.0) << describe(profile);
  EXPECT_GT(profile.busy(GpuWork::kCopy), 0.0) << describe(profile);
  EXPECT_GE(profile.records, 5u) << describe(profile);
  ASSERT_FALSE(profile.kernels.empty());
  EXPECT_GE(profile.kernels.front().busy_s, profile.kernels.back().busy_s);
  EXPECT_LE(profile.busy_s_total, profile.window_s) << describe(profile);
  EXPECT_EQ(host.back(), 1.5f);
  const GpuProfile empty = profiler->collect();  // a new window: nothing ran in it
  EXPECT_EQ(empty.records, 0u) << describe(empty);
}

}  // namespace
}  // namespace strata::tiers
