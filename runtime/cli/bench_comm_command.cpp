// `strata bench comm`: collective throughput of the communicator make_communicator() picks (run it
// under mpirun for MpiComm), next to its bounds from the same run: one-core memcpy of the payload
// and Open MPI's own blocking MPI_Allgather/MPI_Allreduce on the same buffers.
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "runtime/config/byte_size.hpp"
#include "runtime/cli/commands.hpp"
#include "runtime/comm/communicator.hpp"

namespace strata::cli {
namespace {

using namespace strata::runtime::comm;
using Clock = std::chrono::steady_clock;

struct BenchCommOptions {
  std::vector<std::string> shard_sizes = {"64KiB", "1MiB", "16MiB"};
  std::string dtype = "fp32";
  int iterations = 20;
};

// Runs `operation` `iterations` times between barriers; returns the slowest rank's seconds per
// call.
template <typename Operation>
double time_per_call(Communicator& comm, int iterations, Operation&& operation,
                     CommStats* timed_stats = nullptr) {
  operation();  // warm-up: buffers faulted in, connections set up
  comm.barrier();
  comm.reset_stats();
  const auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) operation();
  const float seconds = std::chrono::duration<float>(Clock::now() - start).count();
  if (timed_stats != nullptr) *timed_stats = comm.stats();  // the timed calls alone
  return comm.all_reduce_f32(seconds, ReduceOp::kMax) / iterations;
}

// What every shard size is timed with.
struct CommBench {
  Communicator& comm;
  int iterations;
  DType dtype;
  std::size_t ranks;
  std::size_t element;  // bytes of one element
  bool mpi;             // MPI's own collectives are timed too
  bool print;           // rank 0 prints
};

// The buffers of one shard size: the rank's shard and the gathered buffer of ranks x shard.
struct ShardBuffers {
  ShardBuffers(const CommBench& bench, std::size_t count)
      : shard_count(count),
        shard_bytes(count * bench.element),
        shard(shard_bytes, std::byte{1}),
        full(bench.ranks * shard_bytes, std::byte{1}),
        shard_in{shard.data(), shard_count, bench.dtype},
        shard_out{shard.data(), shard_count, bench.dtype},
        full_out{full.data(), bench.ranks * shard_count, bench.dtype} {}

  std::size_t shard_count;
  std::size_t shard_bytes;
  std::vector<std::byte> shard;
  std::vector<std::byte> full;
  ConstBuffer shard_in;
  MutableBuffer shard_out;
  MutableBuffer full_out;
};

void report(const CommBench& bench, const ShardBuffers& buffers, std::string_view name,
            std::size_t payload_bytes, std::uint64_t sent_bytes, double seconds) {
  if (!bench.print) return;
  fmt::print("{:<26} {:>10} {:>10} {:>9.1f} us {:>12.2f} {:>12.2f}\n", name,
             runtime::format_binary_bytes(buffers.shard_bytes),
             runtime::format_binary_bytes(payload_bytes), seconds * 1e6,
             static_cast<double>(payload_bytes) / seconds / 1e9,
             static_cast<double>(sent_bytes) / seconds / 1e9);
}

// The communicator's collectives; payload and bytes sent per call as its stats count them.
void measure_collectives(CommBench& bench, ShardBuffers& buffers) {
  Communicator& comm = bench.comm;
  auto measure = [&](std::string_view name, Collective kind, auto&& operation) {
    CommStats timed;
    const double seconds = time_per_call(comm, bench.iterations, operation, &timed);
    const CollectiveStats& stats = timed[kind];
    report(bench, buffers, name, stats.payload_bytes / stats.calls, stats.sent_bytes / stats.calls,
           seconds);
  };
  measure("all_gather", Collective::kAllGather,
          [&] { comm.all_gather(buffers.shard_in, buffers.full_out); });
  measure("reduce_scatter (sum)", Collective::kReduceScatter, [&] {
    comm.reduce_scatter(buffers.full_out.as_const(), buffers.shard_out, ReduceOp::kSum);
  });
  measure("all_reduce (sum)", Collective::kAllReduce,
          [&] { comm.all_reduce(buffers.full_out, ReduceOp::kSum); });
}

// Bounds from the same run: memcpy of the payload, and under MPI its own blocking collectives.
void measure_bounds(CommBench& bench, ShardBuffers& buffers) {
  std::vector<std::byte>& full = buffers.full;
  std::vector<std::byte> copy(full.size());
  const double memcpy_seconds = time_per_call(
      bench.comm, bench.iterations, [&] { std::memcpy(copy.data(), full.data(), full.size()); });
  report(bench, buffers, "bound: memcpy payload", full.size(), full.size(), memcpy_seconds);
  if (!bench.mpi) return;
  const std::size_t ranks = bench.ranks;
  const auto bytes = static_cast<int>(buffers.shard_bytes);
  const double gather_seconds = time_per_call(bench.comm, bench.iterations, [&] {
    MPI_Allgather(buffers.shard.data(), bytes, MPI_BYTE, full.data(), bytes, MPI_BYTE,
                  MPI_COMM_WORLD);
  });
  report(bench, buffers, "bound: MPI_Allgather", full.size(), (ranks - 1) * buffers.shard_bytes,
         gather_seconds);
  if (bench.dtype != DType::kFp32) return;
  const std::size_t count = ranks * buffers.shard_count;
  const double reduce_seconds = time_per_call(bench.comm, bench.iterations, [&] {
    MPI_Allreduce(MPI_IN_PLACE, full.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
  });
  const runtime::comm::Chunk own = chunk_of(count, bench.comm.size(), bench.comm.rank());
  report(bench, buffers, "bound: MPI_Allreduce", full.size(),
         ranks == 1 ? 0 : 2 * (count - own.count) * bench.element, reduce_seconds);
}

int run_bench_comm(const BenchCommOptions& options) {
  const DType dtype = options.dtype == "bf16"   ? DType::kBf16
                      : options.dtype == "fp16" ? DType::kFp16
                                                : DType::kFp32;
  auto comm = make_communicator(CommOptions{std::chrono::seconds(120)});
  CommBench bench{*comm,
                  options.iterations,
                  dtype,
                  static_cast<std::size_t>(comm->size()),
                  dtype_bytes(dtype),
                  comm->backend_name() == "mpi",
                  comm->rank() == 0};
  if (bench.print) {
    fmt::print("strata bench comm: backend {}, {} rank(s), {}, {} iterations per size\n",
               comm->backend_name(), bench.ranks, dtype_name(dtype), options.iterations);
    fmt::print("{:<26} {:>10} {:>10} {:>12} {:>12} {:>12}\n", "collective", "shard", "payload",
               "time/call", "algbw GB/s", "busbw GB/s");
  }
  for (const std::string& text : options.shard_sizes) {
    const auto parsed = runtime::parse_byte_size(text);
    if (!parsed || *parsed < bench.element) {
      std::cerr << "strata bench comm: bad shard size '" << text << "'\n";
      return kExitBadInput;
    }
    ShardBuffers buffers(bench, *parsed / bench.element);
    measure_collectives(bench, buffers);
    measure_bounds(bench, buffers);
  }
  return 0;
}

}  // namespace

void add_bench_comm_command(CLI::App& bench) {
  auto options = std::make_shared<BenchCommOptions>();
  CLI::App* command = bench.add_subcommand(
      "comm", "collective throughput (all-gather, reduce-scatter, all-reduce); run under mpirun");
  command->add_option("--shard-sizes", options->shard_sizes,
                      "per-rank shard sizes (the gathered buffer is ranks x shard)");
  command->add_option("--dtype", options->dtype, "element type")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  command->add_option("--iterations", options->iterations, "timed calls per size")
      ->check(CLI::Range(1, 100000));
  command->callback([options] {
    const int code = run_bench_comm(*options);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace strata::cli
