// Proves that render_config_toml writes a TOML the config reader reads back to the same Config
// (every key, awkward strings, sizes that are and are not whole units, floats, schedules), with
// the header and per-key comments in place.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "runtime/tune/tuned_toml.hpp"

namespace strata::runtime::tune {
namespace {

using ::testing::HasSubstr;

Config reread(const Config& config, const TomlComments& comments = {}) {
  Config back = parse_config(render_config_toml(config, comments), config.source);
  return back;
}

TEST(TunedToml, DefaultsRoundTrip) {
  const Config defaults = parse_config("", "x.toml");
  EXPECT_EQ(reread(defaults), defaults);
}

// Sets every [run], [tiers] and [comm] key.
void change_run_tiers_and_comm(Config& c) {
  c.run.ranks = 3;
  c.run.seed = 99;
  c.tiers.device.kind = DeviceKind::kHost;
  c.tiers.device.index = 2;
  c.tiers.device.budget_bytes = 3 * (1ull << 30) + 12345;  // not a whole unit: bytes
  c.tiers.host.budget_bytes = 768ull << 20;
  c.tiers.host.pinned = false;
  c.tiers.nvme.paths = {"/mnt/a \"quoted\"", "C:\\back\\slash", "tab\there"};
  c.tiers.nvme.budget_bytes = 2ull << 40;
  c.tiers.nvme.block_size = 256 << 10;
  c.tiers.nvme.queue_depth = 64;
  c.tiers.nvme.rings = 2;
  c.tiers.nvme.direct = false;
  c.tiers.nvme.engine = IoEngineKind::kPosix;
  c.tiers.nvme.fsync = false;
  c.tiers.nvme.on_existing = OnExistingStore::kResume;
  c.comm.backend = CommBackend::kMpi;
}

// Sets every [zero] key, and [tiers.host] nvme_read_cache.
void change_zero(Config& c) {
  c.zero.stage = 3;
  c.zero.params = Tier::kNvme;
  c.zero.grads = Tier::kHost;
  c.zero.optimizer = Tier::kNvme;
  c.zero.sub_group_size = 524288;
  c.zero.optimizer_host_fraction = 0.375;
  c.zero.params_host_fraction = 0.625;  // params on NVMe; grads on the host keep theirs at 0
  c.tiers.host.nvme_read_cache = true;
  c.zero.prefetch_depth = 1;
  c.zero.buffer_count = 3;
  c.zero.persistence_threshold = 12;
  c.zero.max_inflight_bytes = 4097;
  c.zero.overlap_optimizer = false;
  c.zero.defer_update = true;
}

// Sets every [optimizer] key.
void change_optimizer(Config& c) {
  c.optimizer.type = OptimizerType::kLion;
  c.optimizer.lr = 3e-4;
  c.optimizer.beta1 = 0.95;
  c.optimizer.beta2 = 0.98;
  c.optimizer.eps = 1e-6;
  c.optimizer.weight_decay = 0.1;
  c.optimizer.bias_correction = false;
  c.optimizer.grad_clip = 0;
  c.optimizer.threads = 7;
  c.optimizer.warmup_steps = 10;
  c.optimizer.schedule = LrScheduleKind::kCosine;
  c.optimizer.lr_decay_steps = 1000;
  c.optimizer.min_lr = 1.0 / 3.0 * 1e-5;
  c.optimizer.state_dtype = cpu_adam::StateDType::kInt8;
  c.optimizer.master_dtype = cpu_adam::StateDType::kBf16;
  c.optimizer.master_rounding = MasterRounding::kKahan;
}

// Sets every [precision], [checkpoint], [trace] and [model] key.
void change_precision_checkpoint_trace_and_model(Config& c) {
  c.precision.params = DType::kFp16;
  c.precision.grads = DType::kFp32;
  c.precision.reduce_dtype = DType::kBf16;
  c.precision.dynamic_loss_scale = false;
  c.precision.loss_scale = 1024;
  c.precision.loss_scale_window = 50;
  c.precision.min_loss_scale = 2;
  c.checkpoint.dir = "ckpt";
  c.checkpoint.interval_steps = 5;
  c.checkpoint.keep = 4;
  c.trace.path = "trace.json";
  c.model.params = 7'500'000'000;
  c.model.layers = 3;
  c.model.d_model = 96;
  c.model.heads = 6;
  c.model.seq_len = 64;
  c.model.vocab = 1000;
  c.model.tied_head = false;
  c.model.micro_batch = 2;
  c.model.grad_accumulation = 4;
}

TEST(TunedToml, EveryChangedKeyRoundTrips) {
  Config c = parse_config("", "x.toml");
  change_run_tiers_and_comm(c);
  change_zero(c);
  change_optimizer(c);
  change_precision_checkpoint_trace_and_model(c);
  EXPECT_EQ(reread(c), c);
}

TEST(TunedToml, HostFractionOnlyWithItsKindOnNvme) {
  Config c = parse_config("", "x.toml");
  const std::string text = render_config_toml(c);
  EXPECT_THAT(text, HasSubstr("# optimizer_host_fraction = 0.0"));
  EXPECT_THAT(text, HasSubstr("# params_host_fraction = 0.0"));
  EXPECT_THAT(text, HasSubstr("# grads_host_fraction = 0.0"));
  EXPECT_EQ(reread(c), c);
  EXPECT_THROW(parse_config("[zero]\noptimizer_host_fraction = 0.5\n"), ConfigError);
  c.tiers.nvme.paths = {"/x"};
  c.zero.grads = Tier::kNvme;
  c.zero.grads_host_fraction = 0.5;
  EXPECT_THAT(render_config_toml(c), HasSubstr("\ngrads_host_fraction = 0.5"));
  EXPECT_EQ(reread(c), c);
}

TEST(TunedToml, WritesTheHeaderAndTheReasons) {
  Config c = parse_config("", "x.toml");
  TomlComments comments;
  comments.header = {"tuned by a test"};
  comments.keys = {{"tiers.nvme.queue_depth", "measured 1234 MB/s"}};
  const std::string text = render_config_toml(c, comments);
  EXPECT_THAT(text, HasSubstr("# tuned by a test\n"));
  EXPECT_THAT(text, HasSubstr("queue_depth = 16"));
  EXPECT_THAT(text, HasSubstr("# measured 1234 MB/s\n"));
  EXPECT_EQ(reread(c, comments), c);
}

}  // namespace
}  // namespace strata::runtime::tune
