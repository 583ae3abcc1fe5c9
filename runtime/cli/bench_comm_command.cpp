// `strata bench comm`: collective throughput of the communicator make_communicator() picks (run it
// under mpirun for MpiComm), next to its bounds from the same run: one-core memcpy of the payload
// and Open MPI's own blocking MPI_Allgather/MPI_Allreduce on the same buffers.
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
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

int run_bench_comm(const BenchCommOptions& options) {
  const DType dtype = options.dtype == "bf16"   ? DType::kBf16
                         : options.dtype == "fp16" ? DType::kFp16
                                                   : DType::kFp32;
  auto comm = make_communicator(CommOptions{std::chrono::seconds(120)});
  const auto ranks = static_cast<std::size_t>(comm->size());
  const std::size_t element = dtype_bytes(dtype);
  const bool mpi = comm->backend_name() == "mpi";
  const bool print = comm->rank() == 0;
  if (print) {
    fmt::print("strata bench comm: backend {}, {} rank(s), {}, {} iterations per size\n",
               comm->backend_name(), ranks, dtype_name(dtype), options.iterations);
    fmt::print("{:<26} {:>10} {:>10} {:>12} {:>12} {:>12}\n", "collective", "shard", "payload",
               "time/call", "algbw GB/s", "busbw GB/s");
  }
  for (const std::string& text : options.shard_sizes) {
    const auto parsed = runtime::parse_byte_size(text);
    if (!parsed || *parsed < element) {
      std::cerr << "strata bench comm: bad shard size '" << text << "'\n";
      return kExitBadInput;
    }
    const std::size_t shard_count = *parsed / element;
    const std::size_t shard_bytes = shard_count * element;
    std::vector<std::byte> shard(shard_bytes, std::byte{1});
    std::vector<std::byte> full(ranks * shard_bytes, std::byte{1});
    const ConstBuffer shard_in{shard.data(), shard_count, dtype};
    const MutableBuffer shard_out{shard.data(), shard_count, dtype};
    const MutableBuffer full_out{full.data(), ranks * shard_count, dtype};

    auto report = [&](std::string_view name, std::size_t payload_bytes, std::uint64_t sent_bytes,
                      double seconds) {
      if (!print) return;
      fmt::print("{:<26} {:>10} {:>10} {:>9.1f} us {:>12.2f} {:>12.2f}\n", name,
                 runtime::format_binary_bytes(shard_bytes),
                 runtime::format_binary_bytes(payload_bytes), seconds * 1e6,
                 static_cast<double>(payload_bytes) / seconds / 1e9,
                 static_cast<double>(sent_bytes) / seconds / 1e9);
    };
    auto measure = [&](std::string_view name, Collective kind, auto&& operation) {
      CommStats timed;
      const double seconds = time_per_call(*comm, options.iterations, operation, &timed);
      const CollectiveStats& stats = timed[kind];
      report(name, stats.payload_bytes / stats.calls, stats.sent_bytes / stats.calls, seconds);
    };
    measure("all_gather", Collective::kAllGather, [&] { comm->all_gather(shard_in, full_out); });
    measure("reduce_scatter (sum)", Collective::kReduceScatter,
            [&] { comm->reduce_scatter(full_out.as_const(), shard_out, ReduceOp::kSum); });
    measure("all_reduce (sum)", Collective::kAllReduce,
            [&] { comm->all_reduce(full_out, ReduceOp::kSum); });

    // Bounds from the same run.
    std::vector<std::byte> copy(full.size());
    const double memcpy_seconds = time_per_call(
        *comm, options.iterations, [&] { std::memcpy(copy.data(), full.data(), full.size()); });
    report("bound: memcpy payload", full.size(), full.size(), memcpy_seconds);
    if (mpi) {
      const auto bytes = static_cast<int>(shard_bytes);
      const double gather_seconds = time_per_call(*comm, options.iterations, [&] {
        MPI_Allgather(shard.data(), bytes, MPI_BYTE, full.data(), bytes, MPI_BYTE, MPI_COMM_WORLD);
      });
      report("bound: MPI_Allgather", full.size(), (ranks - 1) * shard_bytes, gather_seconds);
      if (dtype == DType::kFp32) {
        const double reduce_seconds = time_per_call(*comm, options.iterations, [&] {
          MPI_Allreduce(MPI_IN_PLACE, full.data(), static_cast<int>(ranks * shard_count), MPI_FLOAT,
                        MPI_SUM, MPI_COMM_WORLD);
        });
        const runtime::comm::Chunk own = chunk_of(ranks * shard_count, comm->size(), comm->rank());
        report("bound: MPI_Allreduce", full.size(),
               ranks == 1 ? 0 : 2 * (ranks * shard_count - own.count) * element, reduce_seconds);
      }
    }
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
