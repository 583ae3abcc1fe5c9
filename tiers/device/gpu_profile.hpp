// GPU time by kind of work over a window of the run, from CUPTI's activity records (every kernel,
// copy and memset the GPU ran, with its start and end: what Nsight Systems reads), so one run on
// a lent GPU says where a step's time goes without instrumenting the code. A kernel's kind comes
// from its name (classify_kernel); copies and memsets are kCopy. CUDA-free: without CUDA (or
// without CUPTI at run time) start_gpu_profiler throws GpuProfilerUnavailable saying why.
//
// Threading: one profiler per process (CUPTI's activity API is process-wide); collect() from the
// thread that started it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tiers {

enum class GpuWork { kGemm, kAttention, kElementwise, kLoss, kOptimizer, kCopy, kCollective,
                     kOther };
inline constexpr std::size_t kGpuWorkKinds = 8;
std::string_view gpu_work_name(GpuWork kind);

// The kind of a kernel from its (mangled or plain) name: library GEMMs (cuBLAS, cuBLASLt,
// CUTLASS), attention, the loss, optimizers, NCCL's collectives, the rest elementwise.
GpuWork classify_kernel(std::string_view name);

// One kernel (or copy kind) of a window: its name, demangled and cut to the function's, its
// records' summed time and how many ran.
struct GpuKernelTime {
  std::string name;
  double busy_s = 0;
  std::uint64_t count = 0;
};

struct GpuProfile {
  std::array<double, kGpuWorkKinds> busy_s{};  // per kind: the sum of its records' durations
  double window_s = 0;       // wall time from the window's start to its end
  double busy_s_total = 0;   // time at least one record ran (overlaps counted once)
  std::uint64_t records = 0;
  std::uint64_t dropped = 0;  // records CUPTI had to drop (buffers full): the figures are low
  std::vector<GpuKernelTime> kernels;  // every kernel and copy kind, most time first
  double idle_s() const { return window_s > busy_s_total ? window_s - busy_s_total : 0.0; }
  double busy(GpuWork kind) const { return busy_s[static_cast<std::size_t>(kind)]; }
};

// "gemm 120.1 ms, attention 40.2 ms, ... ; busy 208.3 of 250.0 ms, idle 41.7 ms".
std::string describe(const GpuProfile& profile);
// The `count` kernels with the most time: "name 12.3 ms x48; ...".
std::string describe_top_kernels(const GpuProfile& profile, std::size_t count);
// "void ns::f<T>(int)" -> "ns::f": what a reader needs of a kernel's (demangled) name.
std::string short_kernel_name(std::string_view name);

class GpuProfilerUnavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class GpuProfiler {
 public:
  virtual ~GpuProfiler() = default;
  // The GPU work of the window since the last collect() (or the start): waits for the device,
  // flushes CUPTI's buffers, starts the next window.
  virtual GpuProfile collect() = 0;
};

std::unique_ptr<GpuProfiler> start_gpu_profiler();

}  // namespace strata::tiers
