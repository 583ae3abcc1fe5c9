// The crash harness's training child: TinyMlp on the Engine with every state kind homed on the
// NVMe store (fsync on), deterministic data. Usage: strata_crash_child <dir> <steps> <out>.
// Resumes from the store when its initialisation finished before (the "initialized" marker),
// prints "resumed <step>" and "committed <step>" after each step, and at the end writes every
// unit's fp32 master weights to <out> (atomically) for the harness to compare bitwise.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "runtime/comm/local_comm.hpp"
#include "runtime/engine/engine.hpp"
#include "io/whole_file.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "tests/runtime/engine_test_config.hpp"
#include "tests/runtime/engine_test_model.hpp"
#include "tiers/device/device.hpp"

int main(int argc, char** argv) {
  using namespace strata;
  using namespace strata::runtime;
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <dir> <steps> <out>\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  const std::uint64_t steps = std::stoull(argv[2]);
  const std::filesystem::path out = argv[3];
  const std::filesystem::path marker = dir / "initialized";
  try {
    Config config = parse_config(std::string(R"(
[tiers.device]
kind = "host"
budget = "64MiB"
[tiers.host]
budget = "64MiB"
[tiers.nvme]
fsync = true
paths = [")") + dir.string() + R"("]
[zero]
stage = 3
sub_group_size = 2048
buffer_count = 3
params = "nvme"
grads = "nvme"
optimizer = "nvme"
[optimizer]
lr = 1e-2
weight_decay = 0.01
grad_clip = 0.5
)");
    auto device = testing::host_device(config);
    comm::LocalComm local;
    const bool resume = std::filesystem::exists(marker);
    Engine engine(config, *device, local, EngineOptions{.resume = resume});
    testing::TinyMlp model(testing::kEngineTestWidths, 16, 7);
    model.add_units(engine);
    engine.finalize();
    if (resume) {
      std::printf("resumed %llu\n", static_cast<unsigned long long>(engine.step_count()));
    } else {
      // The store's step 0 is committed: from now on a restart resumes.
      io::write_file_atomically(marker, std::string_view("\x01", 1));
      std::printf("started\n");
    }
    std::fflush(stdout);
    while (engine.step_count() < steps) {
      model.train_step(engine);
      const StepStats stats = engine.step();
      std::printf("committed %llu\n", static_cast<unsigned long long>(stats.step));
      std::fflush(stdout);
    }
    std::string bytes;
    for (UnitId unit : model.units()) {
      const std::vector<float> master = engine.gather_master(unit);
      bytes.append(reinterpret_cast<const char*>(master.data()), master.size() * sizeof(float));
    }
    io::write_file_atomically(out, bytes);
    std::printf("done\n");
    return 0;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "crash child: %s\n", error.what());
    return 1;
  }
}
