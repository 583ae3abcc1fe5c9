// Proves save / load / export / import stream a sub-group at a time: with optimizer state homed on
// NVMe at over 4x the host budget, each leaves the host pool's high-water mark where it was, holds
// at most (ranks + 1) sub-groups of staging, grows peak RSS by far less than the state, and gives
// bitwise the values the engine holds (checkpoint state, exported and imported weights).
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "runtime/plan/partition.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "tests/io/io_test_support.hpp"
#include "tests/runtime/checkpoint_test_support.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;
using testing::engine_test_config;
using testing::expect_same_state;
using testing::TrainedModel;

// About 1.05 M parameters in three units: 12.6 MB of fp32 master and moments per rank.
const std::vector<std::uint32_t> kWide = {512, 1024, 512, 8};
constexpr std::uint64_t kHostBudgetBytes = 3ull << 20;

Config streaming_config(const ScratchDir& nvme) {
  Config config = engine_test_config(nvme.path().string());
  config.zero.params = Tier::kNvme;
  config.zero.grads = Tier::kNvme;
  config.zero.optimizer = Tier::kNvme;
  config.tiers.host.budget_bytes = kHostBudgetBytes;
  config.zero.sub_group_size = 8192;  // fewer, larger extents: the test stays fast
  config.tiers.nvme.fsync = false;     // durability is not what this test proves
  return config;
}

std::uint64_t parameter_count(Engine& engine) {
  std::uint64_t count = 0;
  for (UnitId u = 0; u < engine.unit_count(); ++u) count += engine.unit_numel(u);
  return count;
}

// The most any operation may stage outside the host budget: a sub-group per rank plus its own.
std::uint64_t staging_bound(const Config& config, std::uint32_t ranks) {
  return (ranks + 1) * sub_group_elements(config.zero.sub_group_size) * sizeof(float);
}

// Peak resident set since the last reset, from /proc/self/status (kB -> bytes); nullopt when the
// kernel does not let this process reset it (writing 5 to clear_refs, Linux 4.0+).
class PeakRss {
 public:
  static std::optional<PeakRss> start() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    return std::nullopt;  // shadow memory and quarantines make RSS meaningless
#else
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";
    clear.flush();
    if (!clear) return std::nullopt;
    PeakRss peak;
    peak.baseline_ = status_bytes("VmRSS:");
    return peak;
#endif
  }
  // How far the peak rose above the resident set at start().
  std::uint64_t growth_bytes() const {
    const std::uint64_t high = status_bytes("VmHWM:");
    return high > baseline_ ? high - baseline_ : 0;
  }

 private:
  static std::uint64_t status_bytes(const std::string& key) {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind(key, 0) == 0) return std::stoull(line.substr(key.size())) * 1024;
    }
    return 0;
  }
  std::uint64_t baseline_ = 0;
};

// Runs `operation` and checks what it held: the host pool's high-water mark unchanged, the
// staging within the bound (and used), peak RSS well below the state's size.
template <typename Operation>
void expect_streamed(TrainedModel& run, const Config& config, const std::string& what,
                     Operation&& operation) {
  const std::uint64_t host_before = run.engine->host_high_water_bytes();
  const std::optional<PeakRss> rss = PeakRss::start();
  operation();
  EXPECT_EQ(run.engine->host_high_water_bytes(), host_before) << what;
  EXPECT_LE(run.engine->host_high_water_bytes(), kHostBudgetBytes) << what;
  EXPECT_GT(run.engine->stream_staging_high_water_bytes(), 0u) << what;
  EXPECT_LE(run.engine->stream_staging_high_water_bytes(), staging_bound(config, 1)) << what;
  const std::uint64_t state_bytes = 12 * parameter_count(*run.engine);
  if (rss) {
    // Holding the state (or the exported weights, a third of it) would add megabytes; streaming
    // adds kilobytes. 3 MiB leaves room for the allocator and threads.
    EXPECT_LT(rss->growth_bytes(), 3u << 20) << what << ": peak RSS grew by "
                                             << rss->growth_bytes() << " bytes; the state is "
                                             << state_bytes;
    std::cout << what << ": peak RSS +" << rss->growth_bytes() << " B, staging high water "
              << run.engine->stream_staging_high_water_bytes() << " B (bound "
              << staging_bound(config, 1) << "), host high water "
              << run.engine->host_high_water_bytes() << " B (budget " << kHostBudgetBytes
              << "), state " << state_bytes << " B\n";
  }
}

std::vector<char> file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

// The RSS meter sees growth of a few MiB (else the bound below would prove nothing).
TEST(CheckpointStreaming, PeakRssMeterSeesAllocations) {
  std::optional<PeakRss> rss = PeakRss::start();
  if (!rss) GTEST_SKIP() << "peak RSS cannot be reset here (sanitizer build or no clear_refs)";
  std::vector<char> touched(6u << 20);
  for (std::size_t i = 0; i < touched.size(); i += 4096) touched[i] = static_cast<char>(i);
  EXPECT_GE(rss->growth_bytes() + touched[4096], 5u << 20);
}

TEST(CheckpointStreaming, StateFourTimesTheHostBudgetSavesLoadsExportsAndImportsWithinIt) {
  ScratchDir dir, nvme;
  const Config config = streaming_config(nvme);
  TrainedModel original(config, {}, kWide);
  ASSERT_GE(12 * parameter_count(*original.engine), 4 * kHostBudgetBytes)
      << "the model must hold at least 4x the host budget of optimizer state";
  original.train(2);
  const auto state = original.state();
  std::vector<std::vector<float>> masters;
  for (UnitId unit : original.model->units()) masters.push_back(original.engine->gather_master(unit));

  const std::filesystem::path checkpoint = dir.path() / "ckpt";
  const std::filesystem::path exported = dir.path() / "model.safetensors";
  expect_streamed(original, config, "save", [&] { original.engine->save(checkpoint); });
  expect_streamed(original, config, "export",
                  [&] { original.engine->export_safetensors(exported); });

  // The export is bitwise what the whole-unit writer makes of the gathered masters.
  std::vector<UnitSpec> specs;
  for (UnitId unit : original.model->units()) specs.push_back(original.engine->unit_spec(unit));
  const std::filesystem::path reference = dir.path() / "reference.safetensors";
  save_safetensors(
      reference, specs, [&](std::size_t u) { return masters[u]; }, DType::kFp32,
      {{"format", "pt"}, {"producer", "strata"}, {"step", "2"}}, /*prefix_unit_names=*/true);
  EXPECT_TRUE(file_bytes(exported) == file_bytes(reference)) << "streamed export differs";
  const SafetensorsFile file = SafetensorsFile::read(exported);  // the whole-file parser
  std::vector<float> values(static_cast<std::size_t>(kWide[1]) * kWide[2]);
  file.read_fp32(*file.find("layer1.w"), values);
  EXPECT_EQ(std::memcmp(values.data(), masters[1].data(), values.size() * 4), 0);

  ScratchDir loaded_nvme;
  const Config loaded_config = streaming_config(loaded_nvme);
  TrainedModel loaded(loaded_config, {}, kWide);
  expect_streamed(loaded, loaded_config, "load", [&] { loaded.engine->load(checkpoint); });
  EXPECT_EQ(loaded.engine->step_count(), 2u);
  expect_same_state(loaded.state(), state, "loaded");
  original.train(1);
  loaded.train(1);
  expect_same_state(loaded.state(), original.state(), "loaded, then one more step");

  ScratchDir imported_nvme;
  const Config imported_config = streaming_config(imported_nvme);
  TrainedModel imported(imported_config, {}, kWide);
  expect_streamed(imported, imported_config, "import",
                  [&] { imported.engine->import_safetensors(exported); });
  for (std::size_t u = 0; u < masters.size(); ++u) {
    const std::vector<float> got = imported.engine->gather_master(imported.model->units()[u]);
    ASSERT_EQ(got.size(), masters[u].size());
    EXPECT_EQ(std::memcmp(got.data(), masters[u].data(), got.size() * 4), 0) << "unit " << u;
    for (float m : imported.engine->state_shard(u, OptimizerState::kExpAvgSq)) ASSERT_EQ(m, 0.0f);
  }
}

// A bf16 export streams through the writer's conversion buffer and matches the whole-unit writer.
TEST(CheckpointStreaming, Bf16ExportIsBitwiseTheWholeUnitWriters) {
  ScratchDir dir, nvme;
  TrainedModel run(streaming_config(nvme), {}, kWide);
  run.train(1);
  std::vector<UnitSpec> specs;
  for (UnitId unit : run.model->units()) specs.push_back(run.engine->unit_spec(unit));
  run.engine->export_safetensors(dir.path() / "bf16.safetensors", DType::kBf16);
  save_safetensors(
      dir.path() / "reference.safetensors", specs,
      [&](std::size_t u) { return run.engine->gather_master(run.model->units()[u]); },
      DType::kBf16, {{"format", "pt"}, {"producer", "strata"}, {"step", "1"}},
      /*prefix_unit_names=*/true);
  EXPECT_TRUE(file_bytes(dir.path() / "bf16.safetensors") ==
              file_bytes(dir.path() / "reference.safetensors"));
  // And the streaming reader widens bf16 in place to what the whole-file reader gives.
  const SafetensorsFile whole = SafetensorsFile::read(dir.path() / "bf16.safetensors");
  const SafetensorsReader streamed = SafetensorsReader::open(dir.path() / "bf16.safetensors");
  const SafetensorsEntry& entry = *whole.find("layer0.w");
  std::vector<float> want(512 * 1024), got(1000);
  whole.read_fp32(entry, want);
  streamed.read_fp32(*streamed.find("layer0.w"), 12345, got);
  EXPECT_EQ(std::memcmp(got.data(), want.data() + 12345, got.size() * 4), 0);
}

}  // namespace
}  // namespace strata::runtime
