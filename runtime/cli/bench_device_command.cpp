// `strata bench device`: throughput of the device copies and kernels, next to the bound a copy on
// this machine reaches (one-thread memcpy for HostDevice, whose streams are one thread each), and
// the fused optimizer step on the device next to the device-to-device copy of the same run.
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "runtime/cli/bench_device_optimizer.hpp"
#include "runtime/cli/commands.hpp"
#include "tiers/device/device.hpp"
#include "tiers/pinned_pool.hpp"

namespace strata::cli {

namespace {

struct BenchDeviceOptions {
  std::string kind = "auto";
  std::uint64_t mebibytes = 64;
  int iterations = 10;
  std::string optimizer_params = "1e7";  // "0": no optimizer rows
};

template <typename Body>
double seconds_per_iteration(int iterations, Body body) {
  body();  // warm-up: first touch, page faults, kernel JIT
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) {
    body();
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / iterations;
}

void run_bench_device(const BenchDeviceOptions& options) {
  tiers::DeviceOptions device_options;
  device_options.kind = options.kind == "host"   ? tiers::DeviceKind::kHost
                        : options.kind == "cuda" ? tiers::DeviceKind::kCuda
                                                 : tiers::DeviceKind::kAuto;
  const std::uint64_t bytes = options.mebibytes << 20;
  std::uint64_t optimizer_params = 0;
  if (options.optimizer_params != "0") {
    const std::optional<std::uint64_t> count = parse_whole_count(options.optimizer_params, 1e11);
    if (!count) {
      throw CLI::ValidationError(
          "--optimizer-params",
          "a whole count between 1 and 1e11 (or 0), got \"" + options.optimizer_params + "\"");
    }
    optimizer_params = *count;
  }
  device_options.budget_bytes =
      4 * bytes + (optimizer_params > 0 ? device_optimizer_bytes(optimizer_params) : 0);
  auto device = tiers::make_device(device_options);
  tiers::PinnedPool pool(device->pinned_allocator(), 2 * bytes);
  tiers::PinnedBuffer host_a = pool.allocate(bytes);
  tiers::PinnedBuffer host_b = pool.allocate(bytes);
  std::memset(host_a.data(), 0x3c, bytes);  // 0x3c3c3c3c: a normal float, halves are normal too
  tiers::DeviceBuffer wide = device->allocate(bytes);
  tiers::DeviceBuffer wide2 = device->allocate(bytes);
  tiers::DeviceBuffer narrow = device->allocate(bytes / 2);
  tiers::Stream stream = device->create_stream();
  stream.copy_to_device(wide.span(), host_a.data());
  stream.synchronize();

  struct Row {
    std::string name;
    double touched_bytes;
    double seconds;
  };
  std::vector<Row> rows;
  const auto measure = [&](std::string name, double touched, auto enqueue) {
    rows.push_back({std::move(name), touched, seconds_per_iteration(options.iterations, [&] {
                      enqueue();
                      stream.synchronize();
                    })});
  };
  const double b = static_cast<double>(bytes);
  measure("copy host->device", 2 * b, [&] { stream.copy_to_device(wide2.span(), host_a.data()); });
  measure("copy device->host", 2 * b, [&] { stream.copy_to_host(host_b.data(), wide.span()); });
  measure("copy device->device", 2 * b, [&] { stream.copy_on_device(wide2.span(), wide.span()); });
  const double copy_gbps = rows.back().touched_bytes / rows.back().seconds / 1e9;
  measure("cast fp32->bf16", 1.5 * b, [&] {
    stream.cast(narrow.span(), DType::kBf16, wide.span(), DType::kFp32);
  });
  measure("cast fp32->fp16", 1.5 * b, [&] {
    stream.cast(narrow.span(), DType::kFp16, wide.span(), DType::kFp32);
  });
  measure("cast bf16->fp32", 1.5 * b, [&] {
    stream.cast(wide2.span(), DType::kFp32, narrow.span(), DType::kBf16);
  });
  measure("accumulate bf16 into fp32", 2.5 * b,
          [&] { stream.accumulate(wide2.span(), narrow.span(), DType::kBf16); });
  measure("scale fp32", 2 * b, [&] { stream.scale(wide2.span(), 0.5f); });

  DeviceOptimizerFigures optimizer;
  if (optimizer_params > 0) {
    optimizer = measure_device_optimizer(*device, optimizer_params, options.iterations);
    rows.push_back({"optimizer step (AdamW)", optimizer.update_bytes, optimizer.update_s});
    rows.push_back(
        {"sum of squares bf16", optimizer.sum_of_squares_bytes, optimizer.sum_of_squares_s});
  }

  const double memcpy_seconds = seconds_per_iteration(
      options.iterations, [&] { std::memcpy(host_b.data(), host_a.data(), bytes); });
  const double bound_gbps = 2 * b / memcpy_seconds / 1e9;

  fmt::print("strata bench device: {} ({}), {} MiB per op, {} iterations, pinned host: {}\n",
             device->name(), tiers::device_kind_name(device->kind()), options.mebibytes,
             options.iterations, pool.allocator_name());
  fmt::print("GB/s counts bytes read + written; bound: one-thread memcpy on this host, same run\n");
  fmt::print("{:<28} {:>10} {:>10}\n", "op", "GB/s", "ms/op");
  for (const Row& row : rows) {
    fmt::print("{:<28} {:>10.2f} {:>10.3f}\n", row.name, row.touched_bytes / row.seconds / 1e9,
               row.seconds * 1e3);
  }
  fmt::print("{:<28} {:>10.2f} {:>10.3f}\n", "bound: memcpy (1 thread)", bound_gbps,
             memcpy_seconds * 1e3);
  if (optimizer_params == 0) return;
  // The optimizer's bound is the device's own memory: the device-to-device copy measured above.
  const double optimizer_gbps = optimizer.update_bytes / optimizer.update_s / 1e9;
  fmt::print(
      "optimizer step: {} params, AdamW, fp32 master and moments, bf16 grads, bf16 params out: "
      "{:.3f} ms, {:.0f} bytes moved ({} B/param: 3 x 4 B state read and written, 2 B grad read, "
      "2 B params written), {:.2f} GB/s = {:.1f}% of the device->device copy's {:.2f} GB/s\n",
      optimizer.params, optimizer.update_s * 1e3, optimizer.update_bytes,
      optimizer.update_bytes / static_cast<double>(optimizer.params), optimizer_gbps,
      100 * optimizer_gbps / copy_gbps, copy_gbps);
}

}  // namespace

void add_bench_device_command(CLI::App& bench) {
  auto options = std::make_shared<BenchDeviceOptions>();
  CLI::App* command =
      bench.add_subcommand("device", "device copies and kernels (HostDevice or CUDA) vs memcpy");
  command->add_option("--device", options->kind, "host, cuda or auto")
      ->check(CLI::IsMember({"host", "cuda", "auto"}))
      ->capture_default_str();
  command->add_option("--mib", options->mebibytes, "bytes per op, in MiB")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  command->add_option("--iterations", options->iterations, "timed iterations per op")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  command
      ->add_option("--optimizer-params", options->optimizer_params,
                   "parameters of the fused optimizer step timed on the device (0: none)")
      ->capture_default_str();
  command->callback([options] { run_bench_device(*options); });
}

}  // namespace strata::cli
