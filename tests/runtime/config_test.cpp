// Proves that the config loader reads every section, keeps documented defaults, and rejects each
// kind of bad input with a message naming the file, line, column, key path and what is allowed.
#include "runtime/config/config.hpp"

#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace strata::runtime {
namespace {

using ::testing::HasSubstr;

// Parses `text` expecting a ConfigError; returns it for inspection.
ConfigError expect_error(const std::string& text) {
  try {
    parse_config(text, "run.toml");
  } catch (const ConfigError& error) {
    return error;
  }
  ADD_FAILURE() << "config was accepted:\n" << text;
  return ConfigError("", 0, 0, "", "");
}

TEST(Config, EmptyFileGivesDocumentedDefaults) {
  const Config config = parse_config("");
  EXPECT_EQ(config.zero.stage, 3u);
  EXPECT_EQ(config.zero.params, Tier::kDevice);
  EXPECT_EQ(config.zero.optimizer, Tier::kHost);
  EXPECT_EQ(config.tiers.nvme.block_size, 1u << 20);
  EXPECT_EQ(config.tiers.nvme.queue_depth, 16u);
  EXPECT_EQ(config.tiers.nvme.engine, IoEngineKind::kAuto);
  EXPECT_TRUE(config.tiers.nvme.direct);
  EXPECT_EQ(config.optimizer.type, OptimizerType::kAdamW);
  EXPECT_DOUBLE_EQ(config.optimizer.beta2, 0.999);
  EXPECT_EQ(config.precision.params, DType::kBf16);
  EXPECT_EQ(config.run.ranks, 1u);
}

// Every section of the config, with most of its keys set.
constexpr const char* kEverySection = R"(
[run]
ranks = 4
seed = 7
[tiers.device]
kind = "host"
budget = "2GiB"
[tiers.host]
budget = "512k"
pinned = false
[tiers.nvme]
paths = ["/mnt/a", "/mnt/b"]
budget = 1099511627776
block_size = "4MiB"
queue_depth = 8
rings = 2
direct = false
engine = "posix"
fsync = false
[zero]
stage = 3
params = "nvme"
grads = "host"
optimizer = "nvme"
sub_group_size = 1e9
prefetch_depth = 3
buffer_count = 5
persistence_threshold = 100000
max_inflight_bytes = "256MiB"
[optimizer]
type = "lion"
lr = 1
betas = [0.8, 0.99]
eps = 1e-6
weight_decay = 0
bias_correction = false
grad_clip = 0.5
threads = 2
[precision]
params = "fp16"
grads = "fp32"
dynamic_loss_scale = false
loss_scale = 1024
loss_scale_window = 10
min_loss_scale = 2
[checkpoint]
dir = "ckpt"
interval_steps = 100
keep = 3
[trace]
path = "trace.json"
[model]
layers = 2
d_model = 64
heads = 4
seq_len = 32
vocab = 256
tied_head = false
micro_batch = 2
grad_accumulation = 4
)";

TEST(Config, ReadsEverySection) {
  const Config config = parse_config(kEverySection);
  EXPECT_EQ(config.run.ranks, 4u);
  EXPECT_EQ(config.run.seed, 7u);
  EXPECT_EQ(config.tiers.device.kind, DeviceKind::kHost);
  EXPECT_EQ(config.tiers.device.budget_bytes, 2ull << 30);
  EXPECT_EQ(config.tiers.host.budget_bytes, 512u * 1024);
  EXPECT_FALSE(config.tiers.host.pinned);
  EXPECT_EQ(config.tiers.nvme.paths, (std::vector<std::string>{"/mnt/a", "/mnt/b"}));
  EXPECT_EQ(config.tiers.nvme.budget_bytes, 1ull << 40);
  EXPECT_EQ(config.tiers.nvme.block_size, 4u << 20);
  EXPECT_EQ(config.tiers.nvme.rings, 2u);
  EXPECT_EQ(config.tiers.nvme.engine, IoEngineKind::kPosix);
  EXPECT_FALSE(config.tiers.nvme.fsync);
  EXPECT_EQ(config.zero.params, Tier::kNvme);
  EXPECT_EQ(config.zero.grads, Tier::kHost);
  EXPECT_EQ(config.zero.sub_group_size, 1'000'000'000u);
  EXPECT_EQ(config.zero.buffer_count, 5u);
  EXPECT_EQ(config.zero.max_inflight_bytes, 256u << 20);
  EXPECT_EQ(config.optimizer.type, OptimizerType::kLion);
  EXPECT_DOUBLE_EQ(config.optimizer.lr, 1.0);
  EXPECT_DOUBLE_EQ(config.optimizer.beta1, 0.8);
  EXPECT_FALSE(config.optimizer.bias_correction);
  EXPECT_EQ(config.optimizer.threads, 2u);
  EXPECT_EQ(config.precision.params, DType::kFp16);
  EXPECT_EQ(config.precision.grads, DType::kFp32);
  EXPECT_DOUBLE_EQ(config.precision.min_loss_scale, 2.0);
  EXPECT_EQ(config.checkpoint.interval_steps, 100u);
  EXPECT_EQ(config.trace.path, "trace.json");
  EXPECT_FALSE(config.model.tied_head);
  EXPECT_EQ(config.model.grad_accumulation, 4u);
}

TEST(Config, UnknownKeySuggestsNearestAndNamesLocation) {
  const ConfigError error = expect_error("[tiers.nvme]\npaths = [\"/a\"]\nqueue_dept = 8\n");
  EXPECT_EQ(error.file(), "run.toml");
  EXPECT_EQ(error.line(), 3u);
  EXPECT_EQ(error.column(), 1u);
  EXPECT_EQ(error.key_path(), "tiers.nvme.queue_dept");
  EXPECT_THAT(error.what(), HasSubstr("run.toml:3:1: tiers.nvme.queue_dept"));
  EXPECT_THAT(error.message(), HasSubstr("did you mean \"queue_depth\"?"));
  EXPECT_THAT(error.message(), HasSubstr("allowed:"));
}

TEST(Config, UnknownSectionIsRejected) {
  const ConfigError error = expect_error("[optimiser]\nlr = 0.1\n");
  EXPECT_EQ(error.line(), 1u);
  EXPECT_THAT(error.message(), HasSubstr("unknown section or key \"optimiser\""));
  EXPECT_THAT(error.message(), HasSubstr("did you mean \"optimizer\"?"));
}

TEST(Config, WrongTypeNamesExpectedType) {
  const ConfigError error = expect_error("[tiers.nvme]\nqueue_depth = \"16\"\n");
  EXPECT_EQ(error.key_path(), "tiers.nvme.queue_depth");
  EXPECT_EQ(error.line(), 2u);
  EXPECT_THAT(error.message(), HasSubstr("expected an integer, got a string"));
}

TEST(Config, OutOfRangeValueNamesAllowedRange) {
  ConfigError error = expect_error("[zero]\nstage = 4\n");
  EXPECT_EQ(error.key_path(), "zero.stage");
  EXPECT_THAT(error.message(), HasSubstr("value 4 is out of range: allowed 0 to 3"));
  error = expect_error("[tiers.nvme]\nqueue_depth = 0\n");
  EXPECT_THAT(error.message(), HasSubstr("allowed 1 to 4096"));
  error = expect_error("[optimizer]\neps = 0\n");
  EXPECT_THAT(error.message(), HasSubstr("greater than 0"));
  error = expect_error("[zero]\nsub_group_size = 2048.5\n");
  EXPECT_THAT(error.message(), HasSubstr("whole number of elements"));
}

TEST(Config, BadSizeStringExplainsTheFormat) {
  const ConfigError error = expect_error("[tiers.host]\nbudget = \"12 parsecs\"\n");
  EXPECT_EQ(error.key_path(), "tiers.host.budget");
  EXPECT_THAT(error.message(), HasSubstr("\"12 parsecs\" is not a size"));
  EXPECT_THAT(error.message(), HasSubstr("\"64GiB\""));
}

TEST(Config, ZeroOrNegativeBudgetIsRejected) {
  ConfigError error = expect_error("[tiers.device]\nbudget = 0\n");
  EXPECT_EQ(error.key_path(), "tiers.device.budget");
  EXPECT_THAT(error.message(), HasSubstr("too small"));
  error = expect_error("[tiers.host]\nbudget = -5\n");
  EXPECT_THAT(error.message(), HasSubstr("cannot be negative"));
  error = expect_error("[tiers.nvme]\nbudget = \"0GiB\"\n");
  EXPECT_THAT(error.message(), HasSubstr("too small"));
}

TEST(Config, EnumValueListsTheChoices) {
  const ConfigError error = expect_error("[tiers.nvme]\nengine = \"aio\"\n");
  EXPECT_THAT(
      error.message(),
      HasSubstr("\"aio\" is not allowed: expected one of \"auto\", \"io_uring\" or \"posix\""));
}

// DType (base/dtype.hpp) also names the communicators' integer types; a precision never takes one.
TEST(Config, PrecisionTakesOnlyTheFloatingDtypeNames) {
  for (const char* value : {"fp8", "uint8", "uint64", "FP32"}) {
    const ConfigError error =
        expect_error(std::string("[precision]\nparams = \"") + value + "\"\n");
    EXPECT_EQ(error.line(), 2u) << value;
    EXPECT_EQ(error.key_path(), "precision.params") << value;
    EXPECT_THAT(error.message(), HasSubstr(std::string("\"") + value +
                                           "\" is not allowed: expected one of \"fp32\", \"bf16\" "
                                           "or \"fp16\""));
  }
}

// [precision] reduce_dtype: "auto" (empty) by default, resolved by gradient_reduce_dtype.
TEST(Config, ReduceDtypeIsAutoOrAFloatingDtype) {
  EXPECT_EQ(parse_config("").precision.reduce_dtype, std::nullopt);
  EXPECT_EQ(parse_config("[precision]\nreduce_dtype = \"auto\"\n").precision.reduce_dtype,
            std::nullopt);
  EXPECT_EQ(parse_config("[precision]\nreduce_dtype = \"fp16\"\n").precision.reduce_dtype,
            DType::kFp16);
  const ConfigError error = expect_error("[precision]\ngrads = \"bf16\"\nreduce_dtype = \"int8\"\n");
  EXPECT_EQ(error.line(), 3u);
  EXPECT_EQ(error.key_path(), "precision.reduce_dtype");
  EXPECT_THAT(error.message(), HasSubstr("\"int8\" is not allowed: expected one of \"auto\""));

  PrecisionConfig precision;  // grads bf16, reduce_dtype auto
  EXPECT_EQ(gradient_reduce_dtype(precision, 1), DType::kBf16);
  EXPECT_EQ(gradient_reduce_dtype(precision, 2), DType::kFp32);  // the sum is kept in fp32
  precision.grads = DType::kFp32;
  EXPECT_EQ(gradient_reduce_dtype(precision, 1), DType::kFp32);
  precision.reduce_dtype = DType::kFp16;
  EXPECT_EQ(gradient_reduce_dtype(precision, 3), DType::kFp16);
}

TEST(Config, NvmeHomeNeedsPaths) {
  const ConfigError error = expect_error("[zero]\noptimizer = \"nvme\"\n");
  EXPECT_EQ(error.key_path(), "zero.optimizer");
  EXPECT_EQ(error.line(), 2u);
  EXPECT_THAT(error.message(), HasSubstr("[tiers.nvme] paths is empty"));
}

TEST(Config, ParamsOnNvmeNeedStage3) {
  const ConfigError error =
      expect_error("[tiers.nvme]\npaths = [\"/x\"]\n[zero]\nstage = 2\nparams = \"nvme\"\n");
  EXPECT_EQ(error.key_path(), "zero.params");
  EXPECT_THAT(error.message(), HasSubstr("needs stage = 3"));
}

TEST(Config, GradsOnNvmeNeedStage2) {
  const ConfigError error =
      expect_error("[tiers.nvme]\npaths = [\"/x\"]\n[zero]\nstage = 1\ngrads = \"nvme\"\n");
  EXPECT_THAT(error.message(), HasSubstr("needs stage 2 or 3"));
}

TEST(Config, OptimizerHostFractionNeedsTheOptimizerOnNvme) {
  const ConfigError error = expect_error("[zero]\noptimizer_host_fraction = 0.5\n");
  EXPECT_EQ(error.key_path(), "zero.optimizer_host_fraction");
  EXPECT_THAT(error.message(), HasSubstr("has no effect unless optimizer = \"nvme\""));
  EXPECT_THAT(expect_error("[tiers.nvme]\npaths = [\"/x\"]\n[zero]\noptimizer = \"nvme\"\n"
                           "optimizer_host_fraction = 1.5\n")
                  .key_path(),
              "zero.optimizer_host_fraction");
  EXPECT_EQ(parse_config("[tiers.nvme]\npaths = [\"/x\"]\n[zero]\noptimizer = \"nvme\"\n"
                         "optimizer_host_fraction = 0.5\n")
                .zero.optimizer_host_fraction,
            0.5);
}

// optimizer_device_fraction: a share of host- or NVMe-homed optimizer state on the device, where
// the device's update reads the gradients and writes the parameters: both must be there too.
TEST(Config, OptimizerDeviceFractionNeedsTheStateOffTheDeviceAndParamsGradsOnIt) {
  const ConfigError on_device =
      expect_error("[zero]\noptimizer = \"device\"\noptimizer_device_fraction = 0.5\n");
  EXPECT_EQ(on_device.key_path(), "zero.optimizer_device_fraction");
  EXPECT_THAT(on_device.message(), HasSubstr("has no effect with optimizer = \"device\""));
  const ConfigError params_off = expect_error(
      "[zero]\nparams = \"host\"\noptimizer_device_fraction = 0.5\n");
  EXPECT_EQ(params_off.key_path(), "zero.optimizer_device_fraction");
  EXPECT_THAT(params_off.message(), HasSubstr("params is \"host\""));
  const ConfigError too_much = expect_error(
      "[tiers.nvme]\npaths = [\"/x\"]\n[zero]\noptimizer = \"nvme\"\n"
      "optimizer_host_fraction = 0.6\noptimizer_device_fraction = 0.5\n");
  EXPECT_THAT(too_much.message(), HasSubstr("add up to more than 1"));
  EXPECT_EQ(expect_error("[zero]\noptimizer_device_fraction = -0.1\n").key_path(),
            "zero.optimizer_device_fraction");
  EXPECT_EQ(parse_config("[zero]\noptimizer = \"host\"\noptimizer_device_fraction = 0.25\n")
                .zero.optimizer_device_fraction,
            0.25);
}

// The same keys for the parameters (params = "nvme", stage 3) and the gradients (grads = "nvme").
TEST(Config, ParamsAndGradsHostFractionsNeedTheirKindOnNvme) {
  for (const std::string kind : {"params", "grads"}) {
    const std::string key = kind + "_host_fraction";
    const ConfigError error = expect_error(fmt::format("[zero]\n{} = 0.5\n", key));
    EXPECT_EQ(error.key_path(), "zero." + key);
    EXPECT_THAT(error.message(), HasSubstr(fmt::format("has no effect unless {} = \"nvme\"", kind)));
    EXPECT_THAT(error.message(), HasSubstr(fmt::format("{} is \"device\"", kind)));
    const std::string on_nvme =
        fmt::format("[tiers.nvme]\npaths = [\"/x\"]\n[zero]\n{} = \"nvme\"\n", kind);
    EXPECT_EQ(expect_error(on_nvme + key + " = 1.5\n").key_path(), "zero." + key);
    EXPECT_EQ(expect_error(on_nvme + key + " = -0.25\n").key_path(), "zero." + key);
    const Config config = parse_config(on_nvme + key + " = 0.5\n");
    EXPECT_EQ(kind == "params" ? config.zero.params_host_fraction
                               : config.zero.grads_host_fraction,
              0.5);
  }
}

TEST(Config, DirectIoNeedsAlignedBlockSize) {
  const ConfigError error = expect_error("[tiers.nvme]\nblock_size = 2000\n");
  EXPECT_THAT(error.message(), HasSubstr("is too small: it must be at least 4.00 KiB"));
  const ConfigError unaligned = expect_error("[tiers.nvme]\nblock_size = \"6k\"\n");
  EXPECT_THAT(unaligned.message(), HasSubstr("not a multiple of 4 KiB"));
  EXPECT_NO_THROW(parse_config("[tiers.nvme]\nblock_size = \"6k\"\ndirect = false\n"));
}

TEST(Config, BetasMustBeTwoNumbersBelowOne) {
  EXPECT_THAT(expect_error("[optimizer]\nbetas = 0.9\n").message(), HasSubstr("two numbers"));
  EXPECT_THAT(expect_error("[optimizer]\nbetas = [0.9, 1.0]\n").message(),
              HasSubstr("must be in [0, 1)"));
}

TEST(Config, ModelShapeIsChecked) {
  const ConfigError error = expect_error("[model]\nd_model = 100\nheads = 3\n");
  EXPECT_EQ(error.key_path(), "model.heads");
  EXPECT_THAT(error.message(), HasSubstr("not divisible"));
}

TEST(Config, TomlSyntaxErrorHasLineAndColumn) {
  const ConfigError error = expect_error("[zero]\nstage = = 3\n");
  EXPECT_EQ(error.line(), 2u);
  EXPECT_GT(error.column(), 1u);
  EXPECT_THAT(error.message(), HasSubstr("TOML syntax error"));
}

TEST(Config, SectionThatIsNotATable) {
  const ConfigError error = expect_error("zero = 3\n");
  EXPECT_THAT(error.message(), HasSubstr("expected a table ([zero]), got an integer"));
}

TEST(Config, MissingFileNamesThePath) {
  try {
    load_config("/nonexistent/strata.toml");
    FAIL() << "loaded a missing file";
  } catch (const ConfigError& error) {
    EXPECT_THAT(error.what(), HasSubstr("/nonexistent/strata.toml"));
    EXPECT_THAT(error.what(), HasSubstr("No such file or directory"));
  }
}

TEST(Config, ExampleConfigsAllLoad) {
  const std::filesystem::path dir = std::filesystem::path(STRATA_SOURCE_DIR) / "examples/configs";
  int loaded = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {  // h200/ too
    if (entry.path().extension() != ".toml") continue;
    EXPECT_NO_THROW(load_config(entry.path())) << entry.path();
    ++loaded;
  }
  EXPECT_GE(loaded, 12);
}

TEST(Config, GptParameterCountMatchesGpt2Small) {
  ModelConfig gpt2;
  gpt2.layers = 12;
  gpt2.d_model = 768;
  gpt2.heads = 12;
  gpt2.seq_len = 1024;
  gpt2.vocab = 50257;
  gpt2.tied_head = true;
  EXPECT_EQ(gpt_parameter_count(gpt2), 124'439'808u);  // the published GPT-2 small count
}

}  // namespace
}  // namespace strata::runtime
