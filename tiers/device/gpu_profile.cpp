// The CUDA-free part of gpu_profile.hpp: kinds, names, the description; and, in a build without
// CUDA, the refusal (cuda_gpu_profile.cpp replaces it in CUDA builds).
#include "tiers/device/gpu_profile.hpp"

#include <cxxabi.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <memory>
#include <string>

namespace strata::tiers {
namespace {

bool contains(std::string_view haystack, std::string_view needle) {
  return std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end(),
                     [](char a, char b) {
                       return std::tolower(static_cast<unsigned char>(a)) ==
                              std::tolower(static_cast<unsigned char>(b));
                     }) != haystack.end();
}

}  // namespace

std::string_view gpu_work_name(GpuWork kind) {
  switch (kind) {
    case GpuWork::kGemm:
      return "gemm";
    case GpuWork::kAttention:
      return "attention";
    case GpuWork::kElementwise:
      return "norms/elementwise";
    case GpuWork::kLoss:
      return "loss";
    case GpuWork::kOptimizer:
      return "optimizer";
    case GpuWork::kCopy:
      return "copies";
    case GpuWork::kCollective:
      return "collectives";
    case GpuWork::kOther:
      return "other";
  }
  return "?";
}

GpuWork classify_kernel(std::string_view name) {
  // NCCL first: its kernels' names hold "reduce" and "gather" words too.
  if (contains(name, "nccl")) return GpuWork::kCollective;
  for (const std::string_view gemm : {"gemm", "cutlass", "xmma", "cublas", "gemv", "nvjet", "splitkreduce", "sm90_", "sm80_"}) {
    if (contains(name, gemm)) return GpuWork::kGemm;
  }
  for (const std::string_view attention : {"attention", "flash", "sdpa", "fmha"}) {
    if (contains(name, attention)) return GpuWork::kAttention;
  }
  for (const std::string_view loss : {"cross_entropy", "crossentropy", "loss", "softmax_xent"}) {
    if (contains(name, loss)) return GpuWork::kLoss;
  }
  for (const std::string_view optimizer : {"adam", "lion", "adagrad", "optimizer", "grad_norm"}) {
    if (contains(name, optimizer)) return GpuWork::kOptimizer;
  }
  return GpuWork::kElementwise;
}

std::string describe(const GpuProfile& profile) {
  std::string text;
  for (std::size_t k = 0; k < kGpuWorkKinds; ++k) {
    if (profile.busy_s[k] == 0) continue;
    text += fmt::format("{}{} {:.1f} ms", text.empty() ? "" : ", ",
                        gpu_work_name(static_cast<GpuWork>(k)), 1e3 * profile.busy_s[k]);
  }
  text += fmt::format("; busy {:.1f} of {:.1f} ms, idle {:.1f} ms", 1e3 * profile.busy_s_total,
                      1e3 * profile.window_s, 1e3 * profile.idle_s());
  if (profile.dropped > 0) text += fmt::format(" ({} records dropped: low)", profile.dropped);
  return text;
}

std::string short_kernel_name(std::string_view name) {
  std::string text(name);
  int status = 0;
  const std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(text.c_str(), nullptr, nullptr, &status), std::free);
  if (status == 0 && demangled) text = demangled.get();
  // "(anonymous namespace)" holds the two characters the cuts below look for.
  for (std::size_t at = text.find("(anonymous namespace)"); at != std::string::npos;
       at = text.find("(anonymous namespace)", at)) {
    text.replace(at, 21, "{anon}");
  }
  // Drop the parameters, then the template arguments, then a leading return type.
  if (const std::size_t paren = text.find('('); paren != std::string::npos) text.resize(paren);
  std::string plain;
  int depth = 0;
  for (const char c : text) {
    if (c == '<') ++depth;
    if (depth == 0) plain += c;
    if (c == '>' && depth > 0) --depth;
  }
  if (const std::size_t space = plain.rfind(' '); space != std::string::npos) {
    plain = plain.substr(space + 1);
  }
  return plain.empty() ? text : plain;
}

std::string describe_top_kernels(const GpuProfile& profile, std::size_t count) {
  std::string text;
  for (std::size_t i = 0; i < std::min(count, profile.kernels.size()); ++i) {
    const GpuKernelTime& kernel = profile.kernels[i];
    text += fmt::format("{}{} {:.1f} ms x{}", text.empty() ? "" : "; ", kernel.name,
                        1e3 * kernel.busy_s, kernel.count);
  }
  return text;
}

#if !defined(STRATA_HAVE_CUDA)
std::unique_ptr<GpuProfiler> start_gpu_profiler() {
  throw GpuProfilerUnavailable("GPU profiling needs a build with CUDA (this one has none)");
}
#endif

}  // namespace strata::tiers
