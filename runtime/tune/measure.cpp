#include "runtime/tune/measure.hpp"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include "base/float16.hpp"
#include "base/units.hpp"
#include "cpu_adam/compressed_step.hpp"
#include "cpu_adam/optimizer.hpp"
#include "runtime/plan/buffer_plan.hpp"
#include "runtime/tune/cost_model.hpp"
#include "runtime/tune/io_probe.hpp"
#include "tiers/checksum.hpp"
#include "tiers/device/device.hpp"
#include "tiers/pinned_pool.hpp"

namespace strata::runtime::tune {
namespace {

using Clock = std::chrono::steady_clock;

// Shares of the budget: the drives first (the grid has the most points), then Adam.
constexpr double kIoShare = 0.6;
constexpr double kAdamShare = 0.25;
constexpr double kMemoryShare = 0.05;
// The rest (0.1) is for the GPU copies and the slack of a point that runs past its deadline.

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void say(const MeasureOptions& options, const std::string& line) {
  if (options.log != nullptr) *options.log << line << "\n" << std::flush;
}

struct GridPoint {
  std::uint64_t block_bytes;
  std::uint32_t queue_depth;
  std::uint32_t rings;
};

// The grids, largest first; the first whose smallest honest run fits the share is measured.
std::vector<std::vector<GridPoint>> io_grids() {
  std::vector<GridPoint> full, medium;
  for (std::uint64_t block : {256 * kKiB, kMiB, 4 * kMiB}) {
    for (std::uint32_t depth : {4u, 16u, 64u}) {
      for (std::uint32_t rings : {1u, 2u}) full.push_back({block, depth, rings});
    }
  }
  for (std::uint64_t block : {kMiB, 4 * kMiB}) {
    for (std::uint32_t depth : {16u, 64u}) {
      for (std::uint32_t rings : {1u, 2u}) medium.push_back({block, depth, rings});
    }
  }
  const std::vector<GridPoint> small = {{kMiB, 4, 1}, {kMiB, 16, 1}, {kMiB, 64, 1}};
  return {full, medium, small, {{kMiB, 16, 1}}};
}

// Bytes a point moves per pattern at the least: two rounds of its buffers, and 4 MiB.
std::uint64_t min_point_bytes(const GridPoint& point) {
  return std::max(4 * kMiB, 2 * 2 * point.block_bytes * point.queue_depth * point.rings);
}

IoPointSpec spec_for(const NvmeTierConfig& nvme, const std::vector<std::filesystem::path>& dirs,
                     const GridPoint& point, std::uint64_t size) {
  IoPointSpec spec;
  spec.dirs = dirs;
  spec.size_bytes = size;
  spec.block_bytes = point.block_bytes;
  spec.queue_depth = point.queue_depth;
  spec.rings = point.rings;
  spec.direct = nvme.direct ? io::DirectIo::kOn : io::DirectIo::kOff;
  spec.engine = nvme.engine;
  return spec;
}

void measure_io(const MeasureOptions& options, MachineProfile& profile) {
  const NvmeTierConfig& nvme = options.nvme;
  if (nvme.paths.empty()) {
    say(options, "nvme: no [tiers.nvme] paths: nothing to measure (NVMe placements left out)");
    return;
  }
  const Clock::time_point start = Clock::now();
  const double share = kIoShare * options.budget_s;
  std::vector<std::filesystem::path> dirs(nvme.paths.begin(), nvme.paths.end());
  // No point may take more of the drives than the NVMe budget allows (both slots of a step).
  const std::uint64_t cap = std::max(4 * kMiB, std::min<std::uint64_t>(kGiB, nvme.budget_bytes / 2));

  // Calibrate: the rate of a small middle point says how many bytes the share can move.
  const GridPoint middle{kMiB, 16, 1};
  const std::uint64_t calibration_bytes = std::min(cap, 16 * kMiB);
  const IoPointResult calibration = measure_io_point(spec_for(nvme, dirs, middle, calibration_bytes));
  const double calibration_s = seconds_since(start);
  const double bytes_per_s = 3.0 * static_cast<double>(calibration_bytes) / calibration_s;
  const double left_s = share - calibration_s;

  std::vector<GridPoint> grid;
  for (const std::vector<GridPoint>& candidate : io_grids()) {
    double need_s = 0;
    for (const GridPoint& point : candidate) {
      need_s += 3.0 * static_cast<double>(std::min(cap, min_point_bytes(point))) / bytes_per_s;
    }
    if (need_s <= left_s) {
      grid = candidate;
      break;
    }
  }
  if (grid.empty()) {
    profile.io.push_back({middle.block_bytes, middle.queue_depth, middle.rings,
                          calibration.read_mb_per_s, calibration.write_mb_per_s,
                          calibration.mixed_mb_per_s, calibration.flush_mb_per_s});
    say(options, fmt::format("nvme: budget allows only the calibration point ({} engine)",
                             calibration.engine_name));
  } else {
    const double per_point_s = left_s / static_cast<double>(grid.size());
    const Clock::time_point grid_start = Clock::now();
    for (std::size_t i = 0; i < grid.size(); ++i) {
      const GridPoint& point = grid[i];
      if (seconds_since(start) > share && !profile.io.empty()) {
        say(options, fmt::format("nvme: time budget reached: {} of {} grid points measured", i,
                                 grid.size()));
        break;
      }
      const auto scaled = static_cast<std::uint64_t>(per_point_s * bytes_per_s / 3.0);
      const std::uint64_t size = std::min(cap, std::max(min_point_bytes(point), scaled));
      const IoPointResult r = measure_io_point(spec_for(nvme, dirs, point, size));
      profile.io.push_back({point.block_bytes, point.queue_depth, point.rings, r.read_mb_per_s,
                            r.write_mb_per_s, r.mixed_mb_per_s, r.flush_mb_per_s});
    }
    say(options, fmt::format("nvme: {} grid points over {} path(s) in {:.1f} s ({} engine)",
                             profile.io.size(), dirs.size(), seconds_since(grid_start),
                             calibration.engine_name));
  }
  if (dirs.size() > 1) {
    for (const std::filesystem::path& dir : dirs) {
      const IoPointResult r = measure_io_point(spec_for(nvme, {dir}, middle, calibration_bytes));
      profile.paths.push_back({dir.string(), r.read_mb_per_s, r.write_mb_per_s});
    }
  }
}

void measure_memory(const MeasureOptions& options, MachineProfile& profile) {
  const std::size_t bytes = 64 * kMiB;
  std::vector<std::byte> a(bytes, std::byte{1}), b(bytes);
  tbb::task_arena arena;
  auto copy = [&] {
    arena.execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, bytes, kMiB), [&](const auto& range) {
        std::memcpy(b.data() + range.begin(), a.data() + range.begin(), range.size());
      });
    });
  };
  copy();  // first touch
  const Clock::time_point start = Clock::now();
  double best_s = 1e300;
  int runs = 0;
  do {
    const Clock::time_point run = Clock::now();
    copy();
    best_s = std::min(best_s, seconds_since(run));
    ++runs;
  } while (runs < 3 || (runs < 20 && seconds_since(start) < kMemoryShare * options.budget_s));
  profile.host_memory_gb_per_s = static_cast<double>(bytes) / best_s / 1e9;
  say(options, fmt::format("memory: parallel memcpy {:.1f} GB/s (best of {})",
                           profile.host_memory_gb_per_s, runs));
}

// The store's XXH3 (tiers::xxh3: its AVX2 path where the CPU has one) over 64 MiB in memory on
// this thread, best of a few runs within the memory share: the store's checksum thread is one.
void measure_checksum(const MeasureOptions& options, MachineProfile& profile) {
  const std::size_t bytes = 64 * kMiB;
  std::vector<std::byte> data(bytes, std::byte{0x5a});
  volatile std::uint64_t sink = tiers::xxh3(data);  // first touch
  const Clock::time_point start = Clock::now();
  double best_s = 1e300;
  int runs = 0;
  do {
    const Clock::time_point run = Clock::now();
    sink = sink ^ tiers::xxh3(data);
    best_s = std::min(best_s, seconds_since(run));
    ++runs;
  } while (runs < 3 || (runs < 10 && seconds_since(start) < kMemoryShare * options.budget_s));
  profile.checksum_gb_per_s = static_cast<double>(bytes) / best_s / 1e9;
  say(options, fmt::format("checksum: XXH3 ({} path) {:.1f} GB/s on one thread (best of {})",
                           tiers::xxh3_path(), profile.checksum_gb_per_s, runs));
}

// Adam over `count` elements held in memory, as a training step: the fp32 update with bf16
// gradients and copy-out, or the compressed one in the config's formats. Best of three timed runs.
double adam_seconds(const MeasureOptions& options, std::size_t count, std::uint32_t threads) {
  cpu_adam::Hyperparams hyper;
  hyper.step = 1;
  tbb::task_arena arena(static_cast<int>(threads));
  auto best_of_three = [](auto run) {
    run();  // warm the pages
    double best_s = 1e300;
    for (int timed = 0; timed < 3; ++timed) {
      const Clock::time_point start = Clock::now();
      run();
      best_s = std::min(best_s, seconds_since(start));
    }
    return best_s;
  };
  if (options.adam_update.compressed()) {
    SyntheticCompressedAdamState state(options.adam_update, options.compressed_param_out, count);
    const cpu_adam::CompressedSpans spans = state.spans(count);
    return best_of_three([&] {
      cpu_adam::step_compressed(hyper, spans, {}, cpu_adam::StochasticRounding{}, {}, arena);
    });
  }
  const SyntheticAdamState state(count);
  const cpu_adam::ParamSpans spans = state.spans(count);
  return best_of_three([&] { cpu_adam::step(hyper, spans, {}, arena); });
}

void measure_adam(const MeasureOptions& options, MachineProfile& profile) {
  const std::uint32_t hardware = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::uint32_t> counts;
  for (std::uint32_t t = 1; t < hardware; t *= 2) counts.push_back(t);
  counts.push_back(hardware);
  // Calibrate with every thread, then size the state so all points fit the share (each point
  // costs about eight steps: allocation and first touch, warm-up, three timed), between 1 Mi and
  // 4 Mi elements (64 MiB of fp32 state: past the caches, as the real state is).
  const Clock::time_point start = Clock::now();
  const std::size_t probe = std::size_t{1} << 20;
  const double probe_rate = static_cast<double>(probe) / adam_seconds(options, probe, hardware);
  const double left_s = kAdamShare * options.budget_s - seconds_since(start);
  // One thread runs about `hardware` times slower: weigh each point by hardware / threads.
  double weight = 0;
  for (std::uint32_t t : counts) weight += 8.0 * hardware / t;
  const double fit = std::max(0.0, left_s) * probe_rate / weight;
  const std::size_t count =
      std::clamp<std::size_t>(static_cast<std::size_t>(fit), probe, std::size_t{1} << 22);
  for (std::uint32_t threads : counts) {
    profile.adam.push_back({threads,
                            static_cast<double>(count) / adam_seconds(options, count, threads),
                            options.adam_update});
  }
  say(options, fmt::format("adam: {}, {} thread counts over {} elements in {:.1f} s",
                           describe_adam_update(options.adam_update), counts.size(), count,
                           seconds_since(start)));
}

void measure_gpu(const MeasureOptions& options, MachineProfile& profile) {
  if (options.device == DeviceKind::kHost) {
    profile.gpu_note = "skipped: [tiers.device] kind = \"host\"";
    return;
  }
  const std::string why = tiers::cuda_unavailable_reason();
  if (!why.empty()) {
    profile.gpu_note = "skipped: " + why;
    return;
  }
  const std::uint64_t bytes = 64 * kMiB;
  tiers::DeviceOptions device_options;
  device_options.kind = tiers::DeviceKind::kCuda;
  device_options.budget_bytes = 2 * bytes;
  std::unique_ptr<tiers::Device> device = tiers::make_device(device_options);
  tiers::PinnedPool pool(device->pinned_allocator(), bytes);
  tiers::PinnedBuffer host = pool.allocate(bytes);
  std::memset(host.data(), 0x3c, bytes);
  tiers::DeviceBuffer on_device = device->allocate(bytes);
  tiers::Stream stream = device->create_stream();
  auto rate = [&](auto enqueue) {
    enqueue();
    stream.synchronize();
    double best_s = 1e300;
    for (int run = 0; run < 5; ++run) {
      const Clock::time_point start = Clock::now();
      enqueue();
      stream.synchronize();
      best_s = std::min(best_s, seconds_since(start));
    }
    return static_cast<double>(bytes) / best_s / 1e9;
  };
  profile.h2d_gb_per_s = rate([&] { stream.copy_to_device(on_device.span(), host.data()); });
  profile.d2h_gb_per_s = rate([&] { stream.copy_to_host(host.data(), on_device.span()); });
  profile.gpu_note = device->name();
}

}  // namespace

SyntheticAdamState::SyntheticAdamState(std::size_t count)
    : master_(count, 0.1f),
      exp_avg_(count),
      exp_avg_sq_(count),
      grad_(count, to_bf16(1e-3f)),
      param_out_(count) {}

cpu_adam::ParamSpans SyntheticAdamState::spans(std::size_t count) const {
  cpu_adam::ParamSpans spans;
  spans.master = std::span(master_).first(count);
  spans.exp_avg = std::span(exp_avg_).first(count);
  spans.exp_avg_sq = std::span(exp_avg_sq_).first(count);
  spans.grad = cpu_adam::ConstTypedSpan(grad_.data(), count, DType::kBf16);
  spans.param_out = cpu_adam::TypedSpan(param_out_.data(), count, DType::kBf16);
  return spans;
}

std::optional<DType> compressed_param_out(const Config& config) {
  const KindPlacement params =
      place_kinds(config, 1)[static_cast<std::size_t>(ShardKind::kParam)];
  if (params.in_master || config.precision.params == DType::kFp32) return std::nullopt;
  return config.precision.params;
}

SyntheticCompressedAdamState::SyntheticCompressedAdamState(const AdamUpdate& update,
                                                           std::optional<DType> param_out,
                                                           std::uint64_t count)
    : update_(update),
      param_dtype_(param_out),
      master_(cpu_adam::state_bytes(update.master_dtype, count)),
      compensation_(update.kahan ? count * sizeof(Bf16) : 0),
      exp_avg_(cpu_adam::state_bytes(update.state_dtype, count)),
      exp_avg_sq_(cpu_adam::state_bytes(update.state_dtype, count)),
      grad_(count, to_bf16(1e-3f)),
      param_out_(param_out ? count * dtype_bytes(*param_out) : 0) {}

cpu_adam::CompressedSpans SyntheticCompressedAdamState::spans(std::uint64_t count) {
  cpu_adam::CompressedSpans spans;
  spans.numel = count;
  spans.master_dtype = update_.master_dtype;
  spans.moment_dtype = update_.state_dtype;
  spans.master = master_.data();
  if (!compensation_.empty()) spans.compensation = compensation_.data();
  spans.exp_avg = exp_avg_.data();
  spans.exp_avg_sq = exp_avg_sq_.data();
  spans.grad = cpu_adam::ConstTypedSpan(grad_.data(), count, DType::kBf16);
  if (param_dtype_) spans.param_out = cpu_adam::TypedSpan(param_out_.data(), count, *param_dtype_);
  return spans;
}

void confirm_io_point(const MeasureOptions& options, MachineProfile& profile, std::size_t index) {
  IoPoint& point = profile.io.at(index);
  const NvmeTierConfig& nvme = options.nvme;
  const std::uint64_t cap = std::max(4 * kMiB, std::min<std::uint64_t>(kGiB, nvme.budget_bytes / 2));
  const GridPoint grid_point{point.block_bytes, point.queue_depth, point.rings};
  const std::uint64_t size = std::min(cap, std::max(min_point_bytes(grid_point), 64 * kMiB));
  const std::vector<std::filesystem::path> dirs(nvme.paths.begin(), nvme.paths.end());
  const IoPointResult again = measure_io_point(spec_for(nvme, dirs, grid_point, size));
  say(options, fmt::format("nvme: confirmed {} x {} x {} ring(s): mixed {:.0f} MB/s (grid {:.0f}), "
                           "flush {:.0f} MB/s (grid {:.0f})",
                           point.block_bytes, point.queue_depth, point.rings, again.mixed_mb_per_s,
                           point.mixed_mb_per_s, again.flush_mb_per_s, point.flush_mb_per_s));
  const double larger = std::max(point.mixed_mb_per_s, again.mixed_mb_per_s);
  if (larger > 0) {
    profile.io_noise =
        std::max(profile.io_noise, std::fabs(point.mixed_mb_per_s - again.mixed_mb_per_s) / larger);
  }
  // The grid's figures chose this point, so they are its luckiest draw: only the re-measurement,
  // taken after the choice, is an unbiased estimate of it.
  point.read_mb_per_s = again.read_mb_per_s;
  point.write_mb_per_s = again.write_mb_per_s;
  point.mixed_mb_per_s = again.mixed_mb_per_s;
  point.flush_mb_per_s = again.flush_mb_per_s;
  ++point.runs;
}

MachineProfile measure_machine(const MeasureOptions& options) {
  MachineProfile profile;
  measure_io(options, profile);
  measure_memory(options, profile);
  measure_checksum(options, profile);
  measure_adam(options, profile);
  measure_gpu(options, profile);
  if (profile.h2d_gb_per_s) {
    say(options, fmt::format("gpu: pinned h2d {:.1f} GB/s, d2h {:.1f} GB/s ({})",
                             *profile.h2d_gb_per_s, *profile.d2h_gb_per_s, profile.gpu_note));
  } else {
    say(options, "gpu: " + profile.gpu_note);
  }
  return profile;
}

}  // namespace strata::runtime::tune
