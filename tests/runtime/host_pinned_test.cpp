// Proves [tiers.host] pinned does what docs/config.md says: true takes the host pool from the
// device's page-locked allocator (the locked bytes of the process grow by the pool), false from
// plain pageable memory (no page locked); both train bitwise the same.
#include <fstream>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "tests/io/io_test_support.hpp"
#include "tests/runtime/checkpoint_test_support.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using testing::engine_test_config;
using testing::expect_same_state;
using testing::TrainedModel;

// VmLck of /proc/self/status: the bytes of this process's locked pages.
std::uint64_t locked_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  ADD_FAILURE() << "no VmLck line in /proc/self/status";
  return 0;
}

Config host_pinned(const ScratchDir& dir, bool pinned) {
  Config config = engine_test_config(dir.path().string());
  config.tiers.host.pinned = pinned;  // optimizer state homed on the host (the default)
  return config;
}

TEST(HostPinned, FalseAllocatesPageableMemory) {
  ScratchDir dir;
  const std::uint64_t before = locked_bytes();
  TrainedModel model(host_pinned(dir, false));
  EXPECT_EQ(model.engine->host_allocator_name(), "mmap (pageable)");
  EXPECT_GT(model.engine->host_high_water_bytes(), 0u);
  EXPECT_EQ(locked_bytes(), before);
}

TEST(HostPinned, TrueLocksTheHostPool) {
  ScratchDir dir;
  const std::uint64_t before = locked_bytes();
  TrainedModel model(host_pinned(dir, true));
  EXPECT_EQ(model.engine->host_allocator_name(), "mmap");
  const std::uint64_t locked = locked_bytes() - before;
  if (locked == 0) GTEST_SKIP() << "mlock refused here (ulimit -l): the pool stays pageable";
  EXPECT_GE(locked, model.engine->host_high_water_bytes());
}

TEST(HostPinned, PinnedAndPageableTrainBitwiseTheSame) {
  ScratchDir pinned_dir, pageable_dir;
  TrainedModel pinned(host_pinned(pinned_dir, true));
  TrainedModel pageable(host_pinned(pageable_dir, false));
  pinned.train(4);
  pageable.train(4);
  EXPECT_EQ(pinned.losses, pageable.losses);
  expect_same_state(pageable.state(), pinned.state(), "pinned = false vs true");
}

}  // namespace
}  // namespace strata::runtime
