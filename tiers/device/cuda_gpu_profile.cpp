// start_gpu_profiler on CUDA: CUPTI's activity API (kernels, copies, memsets), its buffers handed
// to CUPTI from a free list and read back at collect(). Records arrive in buffer order, not time
// order: collect() sorts their intervals to count the time at least one ran.
#include <cuda_runtime.h>
#include <cupti.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <unordered_map>
#include <string>
#include <string_view>
#include <mutex>
#include <utility>
#include <vector>

#include "base/assert.hpp"
#include "tiers/device/gpu_profile.hpp"

namespace strata::tiers {
namespace {

constexpr std::size_t kBufferBytes = 8u << 20;
constexpr std::size_t kRecordAlignment = 8;

struct Interval {
  std::uint64_t start_ns, end_ns;
  GpuWork kind;
  std::string name;  // the kernel's short name, or the copy's kind
};

const char* copy_name(std::uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "copy host->device";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "copy device->host";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "copy device->device";
    default:
      return "copy (other)";
  }
}

// What CUPTI's callbacks (on CUPTI's own thread) hand over: the records' intervals.
struct Sink {
  std::mutex mutex;
  std::vector<Interval> intervals;
  std::uint64_t dropped = 0;
};
Sink* g_sink = nullptr;  // the one profiler's, while it lives

void check(CUptiResult result, const char* call) {
  if (result == CUPTI_SUCCESS) return;
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  throw GpuProfilerUnavailable(fmt::format("{} failed: {}", call, text ? text : "unknown error"));
}

// A kernel's kind and short name, worked out once per kernel: CUPTI's records of one kernel share
// one name pointer.
struct NamedKind {
  GpuWork kind;
  std::string name;
};
const NamedKind& named_kind(const char* name) {
  static std::mutex mutex;
  static std::unordered_map<const char*, NamedKind> known;
  std::lock_guard lock(mutex);
  auto [at, inserted] = known.try_emplace(name);
  if (inserted) {
    const std::string_view text = name != nullptr ? name : "";
    at->second = {classify_kernel(text), short_kernel_name(text)};
  }
  return at->second;
}

void CUPTIAPI buffer_requested(std::uint8_t** buffer, std::size_t* size,
                               std::size_t* max_records) {
  *buffer = static_cast<std::uint8_t*>(std::aligned_alloc(kRecordAlignment, kBufferBytes));
  *size = *buffer == nullptr ? 0 : kBufferBytes;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext /*context*/, std::uint32_t stream_id,
                               std::uint8_t* buffer, std::size_t /*size*/, std::size_t valid) {
  std::vector<Interval> intervals;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        const NamedKind& named = named_kind(kernel->name);
        intervals.push_back({kernel->start, kernel->end, named.kind, named.name});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        intervals.push_back({copy->start, copy->end, GpuWork::kCopy, copy_name(copy->copyKind)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* set = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        intervals.push_back({set->start, set->end, GpuWork::kCopy, "memset"});
        break;
      }
      default:
        break;
    }
  }
  std::size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, stream_id, &dropped);
  std::free(buffer);
  if (g_sink == nullptr) return;
  std::lock_guard lock(g_sink->mutex);
  g_sink->intervals.insert(g_sink->intervals.end(), intervals.begin(), intervals.end());
  g_sink->dropped += dropped;
}

class CuptiProfiler final : public GpuProfiler {
 public:
  CuptiProfiler() {
    STRATA_ASSERT(g_sink == nullptr, "one GPU profiler per process");
    g_sink = &sink_;
    try {
      check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed),
            "cuptiActivityRegisterCallbacks");
      for (const CUpti_ActivityKind kind :
           {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
            CUPTI_ACTIVITY_KIND_MEMSET}) {
        check(cuptiActivityEnable(kind), "cuptiActivityEnable");
      }
      check(cuptiGetTimestamp(&window_start_ns_), "cuptiGetTimestamp");
    } catch (...) {
      g_sink = nullptr;
      throw;
    }
  }

  ~CuptiProfiler() override {
    for (const CUpti_ActivityKind kind :
         {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
          CUPTI_ACTIVITY_KIND_MEMSET}) {
      cuptiActivityDisable(kind);
    }
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    g_sink = nullptr;
  }

  GpuProfile collect() override {
    cudaDeviceSynchronize();
    check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
    std::uint64_t now_ns = 0;
    check(cuptiGetTimestamp(&now_ns), "cuptiGetTimestamp");
    std::vector<Interval> intervals;
    GpuProfile profile;
    {
      std::lock_guard lock(sink_.mutex);
      intervals.swap(sink_.intervals);
      profile.dropped = std::exchange(sink_.dropped, 0);
    }
    profile.window_s = 1e-9 * static_cast<double>(now_ns - window_start_ns_);
    profile.records = intervals.size();
    std::sort(intervals.begin(), intervals.end(),
              [](const Interval& a, const Interval& b) { return a.start_ns < b.start_ns; });
    std::uint64_t covered_ns = 0, reach_ns = 0;
    for (const Interval& interval : intervals) {
      if (interval.end_ns <= interval.start_ns) continue;
      profile.busy_s[static_cast<std::size_t>(interval.kind)] +=
          1e-9 * static_cast<double>(interval.end_ns - interval.start_ns);
      // The union of the intervals, swept in start order.
      const std::uint64_t from = std::max(interval.start_ns, reach_ns);
      if (interval.end_ns > from) covered_ns += interval.end_ns - from;
      reach_ns = std::max(reach_ns, interval.end_ns);
    }
    profile.busy_s_total = 1e-9 * static_cast<double>(covered_ns);
    std::map<std::string, GpuKernelTime> by_name;
    for (const Interval& interval : intervals) {
      if (interval.end_ns <= interval.start_ns) continue;
      GpuKernelTime& kernel = by_name[interval.name];
      kernel.name = interval.name;
      kernel.busy_s += 1e-9 * static_cast<double>(interval.end_ns - interval.start_ns);
      ++kernel.count;
    }
    for (auto& [name, kernel] : by_name) profile.kernels.push_back(std::move(kernel));
    std::sort(profile.kernels.begin(), profile.kernels.end(),
              [](const GpuKernelTime& a, const GpuKernelTime& b) { return a.busy_s > b.busy_s; });
    window_start_ns_ = now_ns;
    return profile;
  }

 private:
  Sink sink_;
  std::uint64_t window_start_ns_ = 0;
};

}  // namespace

std::unique_ptr<GpuProfiler> start_gpu_profiler() { return std::make_unique<CuptiProfiler>(); }

}  // namespace strata::tiers
