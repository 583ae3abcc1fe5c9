// `strata bench device`: throughput of the device copies and kernels, next to the bound a copy on
// this machine reaches (one-thread memcpy for HostDevice, whose streams are one thread each), and
// the fused optimizer step on the device next to the device-to-device copy of the same run.
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <memory>
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

// --optimizer-params: 0 (no optimizer rows) or a whole count.
std::uint64_t parse_optimizer_params(const std::string& text) {
  if (text == "0") return 0;
  const std::optional<std::uint64_t> count = parse_whole_count(text, 1e11);
  if (!count) {
    throw CLI::ValidationError("--optimizer-params",
                               "a whole count between 1 and 1e11 (or 0), got \"" + text + "\"");
  }
  return *count;
}

// The device and the buffers every case works on: two pinned host buffers, two wide (fp32) and
// one narrow (16-bit) device buffers of `bytes`, and the stream the cases run on.
struct DeviceBench {
  DeviceBench(const tiers::DeviceOptions& device_options, std::uint64_t op_bytes)
      : bytes(op_bytes),
        device(tiers::make_device(device_options)),
        pool(device->pinned_allocator(), 2 * bytes),
        host_a(pool.allocate(bytes)),
        host_b(pool.allocate(bytes)),
        wide(device->allocate(bytes)),
        wide2(device->allocate(bytes)),
        narrow(device->allocate(bytes / 2)),
        stream(device->create_stream()) {
    std::memset(host_a.data(), 0x3c, bytes);  // 0x3c3c3c3c: a normal float, halves are normal too
    stream.copy_to_device(wide.span(), host_a.data());
    stream.synchronize();
  }

  std::uint64_t bytes;
  std::unique_ptr<tiers::Device> device;
  tiers::PinnedPool pool;
  tiers::PinnedBuffer host_a, host_b;
  tiers::DeviceBuffer wide, wide2, narrow;
  tiers::Stream stream;
};

// One timed op: its name, the bytes it reads and writes per byte of the op, and what it enqueues.
struct DeviceCase {
  const char* name;
  double touched_per_byte;
  void (*enqueue)(DeviceBench&);
};

const DeviceCase kDeviceCases[] = {
    {"copy host->device", 2,
     [](DeviceBench& b) { b.stream.copy_to_device(b.wide2.span(), b.host_a.data()); }},
    {"copy device->host", 2,
     [](DeviceBench& b) { b.stream.copy_to_host(b.host_b.data(), b.wide.span()); }},
    {"copy device->device", 2,
     [](DeviceBench& b) { b.stream.copy_on_device(b.wide2.span(), b.wide.span()); }},
    {"cast fp32->bf16", 1.5,
     [](DeviceBench& b) {
       b.stream.cast(b.narrow.span(), DType::kBf16, b.wide.span(), DType::kFp32);
     }},
    {"cast fp32->fp16", 1.5,
     [](DeviceBench& b) {
       b.stream.cast(b.narrow.span(), DType::kFp16, b.wide.span(), DType::kFp32);
     }},
    {"cast bf16->fp32", 1.5,
     [](DeviceBench& b) {
       b.stream.cast(b.wide2.span(), DType::kFp32, b.narrow.span(), DType::kBf16);
     }},
    {"accumulate bf16 into fp32", 2.5,
     [](DeviceBench& b) { b.stream.accumulate(b.wide2.span(), b.narrow.span(), DType::kBf16); }},
    {"scale fp32", 2, [](DeviceBench& b) { b.stream.scale(b.wide2.span(), 0.5f); }},
};
// The device->device copy: the bound of the optimizer step, which works in the device's memory.
constexpr std::size_t kDeviceCopyCase = 2;

struct Row {
  std::string name;
  double touched_bytes;
  double seconds;
};

double gb_per_s(const Row& row) {
  return row.touched_bytes / row.seconds / 1e9;
}

std::vector<Row> measure_cases(DeviceBench& bench, int iterations) {
  const double b = static_cast<double>(bench.bytes);
  std::vector<Row> rows;
  for (const DeviceCase& c : kDeviceCases) {
    rows.push_back({c.name, c.touched_per_byte * b, seconds_per_iteration(iterations, [&] {
                      c.enqueue(bench);
                      bench.stream.synchronize();
                    })});
  }
  return rows;
}

void print_rows(const BenchDeviceOptions& options, const DeviceBench& bench,
                const std::vector<Row>& rows, double memcpy_seconds) {
  const double bound_gbps = 2 * static_cast<double>(bench.bytes) / memcpy_seconds / 1e9;
  fmt::print("strata bench device: {} ({}), {} MiB per op, {} iterations, pinned host: {}\n",
             bench.device->name(), tiers::device_kind_name(bench.device->kind()), options.mebibytes,
             options.iterations, bench.pool.allocator_name());
  fmt::print("GB/s counts bytes read + written; bound: one-thread memcpy on this host, same run\n");
  fmt::print("{:<28} {:>10} {:>10}\n", "op", "GB/s", "ms/op");
  for (const Row& row : rows) {
    fmt::print("{:<28} {:>10.2f} {:>10.3f}\n", row.name, gb_per_s(row), row.seconds * 1e3);
  }
  fmt::print("{:<28} {:>10.2f} {:>10.3f}\n", "bound: memcpy (1 thread)", bound_gbps,
             memcpy_seconds * 1e3);
}

// The optimizer's bound is the device's own memory: the device-to-device copy measured.
void print_optimizer(const DeviceOptimizerFigures& optimizer, double copy_gbps) {
  const double optimizer_gbps = optimizer.update_bytes / optimizer.update_s / 1e9;
  fmt::print(
      "optimizer step: {} params, AdamW, fp32 master and moments, bf16 grads, bf16 params out: "
      "{:.3f} ms, {:.0f} bytes moved ({} B/param: 3 x 4 B state read and written, 2 B grad read, "
      "2 B params written), {:.2f} GB/s = {:.1f}% of the device->device copy's {:.2f} GB/s\n",
      optimizer.params, optimizer.update_s * 1e3, optimizer.update_bytes,
      optimizer.update_bytes / static_cast<double>(optimizer.params), optimizer_gbps,
      100 * optimizer_gbps / copy_gbps, copy_gbps);
}

void run_bench_device(const BenchDeviceOptions& options) {
  tiers::DeviceOptions device_options;
  device_options.kind = options.kind == "host"   ? tiers::DeviceKind::kHost
                        : options.kind == "cuda" ? tiers::DeviceKind::kCuda
                                                 : tiers::DeviceKind::kAuto;
  const std::uint64_t bytes = options.mebibytes << 20;
  const std::uint64_t optimizer_params = parse_optimizer_params(options.optimizer_params);
  device_options.budget_bytes =
      4 * bytes + (optimizer_params > 0 ? device_optimizer_bytes(optimizer_params) : 0);
  DeviceBench bench(device_options, bytes);
  std::vector<Row> rows = measure_cases(bench, options.iterations);
  const double copy_gbps = gb_per_s(rows[kDeviceCopyCase]);

  DeviceOptimizerFigures optimizer;
  if (optimizer_params > 0) {
    optimizer = measure_device_optimizer(*bench.device, optimizer_params, options.iterations);
    rows.push_back({"optimizer step (AdamW)", optimizer.update_bytes, optimizer.update_s});
    rows.push_back(
        {"sum of squares bf16", optimizer.sum_of_squares_bytes, optimizer.sum_of_squares_s});
  }
  const double memcpy_seconds = seconds_per_iteration(
      options.iterations, [&] { std::memcpy(bench.host_b.data(), bench.host_a.data(), bytes); });
  print_rows(options, bench, rows, memcpy_seconds);
  if (optimizer_params > 0) print_optimizer(optimizer, copy_gbps);
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
