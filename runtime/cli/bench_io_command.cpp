// `strata bench io`: sequential read or write throughput of the io/ engine, with fio's options, so
// scripts/bench-io-vs-fio.sh can run both on the same file system and compare.
#include <fcntl.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/buffer_pool.hpp"
#include "io/io_error.hpp"
#include "io/make_engine.hpp"
#include "io/striped_file.hpp"
#include "runtime/config/byte_size.hpp"
#include "runtime/cli/commands.hpp"
#include "runtime/tune/io_probe.hpp"

namespace strata::cli {

namespace {

struct BenchIoOptions {
  std::vector<std::string> dirs;
  std::string size = "4GiB";
  std::string block_size = "1MiB";
  std::uint32_t queue_depth = 16;
  std::uint32_t rings = 1;
  std::string rw = "read";
  std::string engine = "io_uring";
  bool direct = true;
  bool fixed_buffers = true;
  bool json = false;
};

struct BenchIoResult {
  double seconds = 0;
  std::uint64_t bytes = 0;
  std::uint64_t operations = 0;
};

// CLI11 does not print a RuntimeError's text, so say what was wrong here.
[[noreturn]] void bad_input(const std::string& message) {
  std::cerr << "strata bench io: " << message << "\n";
  throw CLI::RuntimeError(kExitBadInput);
}

std::uint64_t parse_size_option(const std::string& name, const std::string& text) {
  const std::optional<std::uint64_t> bytes = runtime::parse_byte_size(text);
  if (!bytes || *bytes == 0) {
    bad_input(fmt::format("{} '{}' is not a byte size (e.g. 4GiB, 1MiB, 4096)", name, text));
  }
  return *bytes;
}

// Sequential I/O over the striped file: the loop `strata tune` runs too (runtime/tune/io_probe).
BenchIoResult run_sequential(io::StripedFile& striped, io::BufferPool& pool, bool use_fixed_buffers,
                             io::IoOp op, std::uint64_t size_bytes, std::uint64_t block_bytes) {
  const runtime::tune::IoRunResult run = runtime::tune::run_io_pattern(
      striped, pool, use_fixed_buffers,
      op == io::IoOp::kRead ? runtime::tune::IoPattern::kRead : runtime::tune::IoPattern::kWrite,
      size_bytes, block_bytes);
  return {run.seconds, run.bytes, run.operations};
}

// A read run reads what a write run with the same options left; the marker says one did.
std::string marker_text(std::uint64_t size_bytes, std::uint64_t block_bytes, std::size_t files) {
  return fmt::format("size={} block={} files={}\n", size_bytes, block_bytes, files);
}

std::string read_marker(const std::filesystem::path& path) {
  std::string text;
  if (std::FILE* file = std::fopen(path.c_str(), "r")) {
    std::array<char, 256> line{};
    if (std::fgets(line.data(), static_cast<int>(line.size()), file) != nullptr) {
      text = line.data();
    }
    std::fclose(file);
  }
  return text;
}

// The options checked.
struct IoSetup {
  std::uint64_t block_bytes = 0;
  std::uint64_t size_bytes = 0;  // a whole number of blocks
  io::IoEngineKind kind = io::IoEngineKind::kAuto;
  io::IoOp op = io::IoOp::kRead;
};

IoSetup check_options(const BenchIoOptions& options) {
  if (options.dirs.empty()) {
    bad_input("give at least one --dir");
  }
  IoSetup setup;
  setup.block_bytes = parse_size_option("--block-size", options.block_size);
  if (setup.block_bytes % kDirectIoAlignment != 0 || setup.block_bytes > kGiB) {
    bad_input("--block-size must be a multiple of 4 KiB, at most 1 GiB");
  }
  setup.size_bytes = round_up(parse_size_option("--size", options.size), setup.block_bytes);
  const std::optional<io::IoEngineKind> kind = io::parse_io_engine_kind(options.engine);
  if (!kind) {
    bad_input(fmt::format("--engine '{}' is not one of io_uring, posix, auto", options.engine));
  }
  setup.kind = *kind;
  if (options.rw != "read" && options.rw != "write") {
    bad_input(fmt::format("--rw '{}' is not read or write", options.rw));
  }
  if (options.queue_depth == 0 || options.rings == 0) {
    bad_input("--queue-depth and --rings must be at least 1");
  }
  setup.op = options.rw == "read" ? io::IoOp::kRead : io::IoOp::kWrite;
  return setup;
}

std::unique_ptr<io::IoEngine> make_engine(const BenchIoOptions& options, const IoSetup& setup,
                                          io::BufferPool& pool) {
  io::IoEngineOptions engine_options;
  engine_options.kind = setup.kind;
  engine_options.block_size_bytes = setup.block_bytes;
  engine_options.queue_depth = options.queue_depth;
  engine_options.rings = options.rings;
  engine_options.direct = options.direct ? io::DirectIo::kOn : io::DirectIo::kOff;
  if (options.fixed_buffers) {
    engine_options.fixed_buffers = pool.buffers();
  }
  return io::make_io_engine(engine_options);
}

// One file per --dir (the directories created).
std::vector<std::filesystem::path> file_paths(const std::vector<std::string>& dirs) {
  std::vector<std::filesystem::path> paths;
  for (std::size_t i = 0; i < dirs.size(); ++i) {
    std::filesystem::create_directories(dirs[i]);
    paths.push_back(std::filesystem::path(dirs[i]) /
                    (dirs.size() == 1 ? std::string("strata-bench-io.dat")
                                      : fmt::format("strata-bench-io-{}.dat", i)));
  }
  return paths;
}

// Write buffers carry random bytes (no file system or device may shortcut zeros).
void fill_random(io::BufferPool& pool) {
  std::mt19937_64 random(1);
  for (std::uint32_t i = 0; i < pool.buffer_count(); ++i) {
    for (std::byte& b : pool.buffer(i)) {
      b = static_cast<std::byte>(random());
    }
  }
}

// What one run works on: the striped file over the engine, the buffers, and the marker that
// says a write run left the file a read run with these options reads.
struct IoRun {
  const BenchIoOptions& options;
  const IoSetup& setup;
  io::BufferPool& pool;
  io::IoEngine& engine;
  io::StripedFile& striped;
  std::filesystem::path marker;
  std::string expected_marker;

  BenchIoResult sequential(io::IoOp op) {
    return run_sequential(striped, pool, options.fixed_buffers, op, setup.size_bytes,
                          setup.block_bytes);
  }
};

// Before a read, the file written (untimed) unless the marker says it is, and out of the page
// cache when buffered; before a write, the marker removed.
void prepare_file(IoRun& run) {
  if (run.setup.op != io::IoOp::kRead) {
    std::filesystem::remove(run.marker);
    return;
  }
  const std::string found = read_marker(run.marker);
  if (found != run.expected_marker) {
    if (!run.options.json) {
      std::cout << "strata bench io: writing the file to read first (untimed)\n";
    }
    std::filesystem::remove(run.marker);
    run.sequential(io::IoOp::kWrite);
    run.striped.sync().get();
    std::ofstream(run.marker) << run.expected_marker;
  }
  if (!run.options.direct) {
    // Buffered reads would otherwise measure the page cache.
    run.striped.sync().get();
    for (io::FileId file : run.striped.files()) {
      ::posix_fadvise(run.engine.file(file).fd(), 0, 0, POSIX_FADV_DONTNEED);
    }
  }
}

void print_result(const BenchIoOptions& options, const IoSetup& setup, const io::IoEngine& engine,
                  std::size_t files, const BenchIoResult& result) {
  const double mb_per_s = static_cast<double>(result.bytes) / result.seconds / 1e6;
  const double iops = static_cast<double>(result.operations) / result.seconds;
  if (options.json) {
    const nlohmann::json out = {{"rw", options.rw},
                                {"engine", std::string(engine.name())},
                                {"direct", options.direct},
                                {"size_bytes", setup.size_bytes},
                                {"block_size_bytes", setup.block_bytes},
                                {"queue_depth", options.queue_depth},
                                {"rings", options.rings},
                                {"files", files},
                                {"seconds", result.seconds},
                                {"mb_per_s", mb_per_s},
                                {"iops", iops}};
    std::cout << out.dump() << "\n";
    return;
  }
  std::cout << fmt::format(
      "strata bench io: {} {} over {} file(s), block {}, queue depth {} x {} ring(s), engine {}, "
      "direct {}\n  {:.1f} MB/s, {:.0f} IOPS, {:.2f} s\n",
      options.rw, runtime::format_binary_bytes(setup.size_bytes), files,
      runtime::format_binary_bytes(setup.block_bytes), options.queue_depth, options.rings,
      engine.name(), options.direct ? "true" : "false", mb_per_s, iops, result.seconds);
}

void run_bench_io(const BenchIoOptions& options) {
  const IoSetup setup = check_options(options);
  // The engine keeps at most queue_depth pieces in the kernel per ring, as fio's iodepth; the
  // benchmark keeps twice that many requests submitted, so a ring never waits for this thread to
  // notice a completion and submit the next block.
  io::BufferPool pool(2 * std::size_t{options.queue_depth} * options.rings, setup.block_bytes);
  std::unique_ptr<io::IoEngine> engine = make_engine(options, setup, pool);
  const std::vector<std::filesystem::path> paths = file_paths(options.dirs);
  io::StripedFile striped =
      io::StripedFile::create(*engine, paths, setup.size_bytes, setup.block_bytes);
  IoRun run{options,
            setup,
            pool,
            *engine,
            striped,
            std::filesystem::path(options.dirs[0]) / "strata-bench-io.written",
            marker_text(setup.size_bytes, setup.block_bytes, paths.size())};
  fill_random(pool);
  prepare_file(run);

  const BenchIoResult result = run.sequential(setup.op);
  if (setup.op == io::IoOp::kWrite) {
    striped.sync().get();  // untimed, as fio's default end_fsync=0; makes the marker honest
    std::ofstream(run.marker) << run.expected_marker;
  }
  print_result(options, setup, *engine, paths.size(), result);
}

}  // namespace

void add_bench_io_command(CLI::App& bench) {
  auto options = std::make_shared<BenchIoOptions>();
  CLI::App* command = bench.add_subcommand(
      "io", "sequential read/write MB/s and IOPS of the io_uring engine (compare with fio)");
  command
      ->add_option("--dir", options->dirs, "directory for the file; repeat to stripe over several")
      ->required();
  command->add_option("--size", options->size, "bytes to move (4GiB, 512MiB, ...)")
      ->capture_default_str();
  command->add_option("--block-size", options->block_size, "bytes per request")
      ->capture_default_str();
  command->add_option("--queue-depth", options->queue_depth, "requests in flight per ring")
      ->capture_default_str();
  command->add_option("--rings", options->rings, "io_uring rings, one I/O thread each")
      ->capture_default_str();
  command->add_option("--rw", options->rw, "read or write")->capture_default_str();
  command->add_option("--engine", options->engine, "io_uring, posix or auto")
      ->capture_default_str();
  command->add_option("--direct", options->direct, "O_DIRECT (true) or buffered (false)")
      ->capture_default_str();
  command
      ->add_option("--fixed-buffers", options->fixed_buffers,
                   "register the buffers with the rings (io_uring fixed buffers)")
      ->capture_default_str();
  command->add_flag("--json", options->json, "print one JSON object");
  command->callback([options] {
    try {
      run_bench_io(*options);
    } catch (const io::IoError& error) {
      std::cerr << "strata bench io: " << error.what() << "\n";
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace strata::cli
