#include "runtime/config/config.hpp"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "base/units.hpp"
#include "runtime/config/byte_size.hpp"
#include "runtime/config/config_reader.hpp"

namespace strata::runtime {
namespace {

using detail::TableReader;

constexpr std::uint64_t kMaxElements = 1ull << 48;

void read_tiers(TableReader& root, TiersConfig& tiers) {
  std::optional<TableReader> section = root.table("tiers");
  if (!section) return;
  if (std::optional<TableReader> device = section->table("device")) {
    device->read_enum(
        "kind", tiers.device.kind,
        {{"auto", DeviceKind::kAuto}, {"host", DeviceKind::kHost}, {"cuda", DeviceKind::kCuda}});
    device->read_int32("index", tiers.device.index, kLocalRankDevice, 1023);
    device->read_size("budget", tiers.device.budget_bytes, 1);
    device->finish();
  }
  if (std::optional<TableReader> host = section->table("host")) {
    host->read_size("budget", tiers.host.budget_bytes, 1);
    host->read_bool("pinned", tiers.host.pinned);
    host->read_bool("nvme_read_cache", tiers.host.nvme_read_cache);
    host->finish();
  }
  if (std::optional<TableReader> nvme = section->table("nvme")) {
    NvmeTierConfig& config = tiers.nvme;
    nvme->read_string_list("paths", config.paths);
    nvme->read_size("budget", config.budget_bytes, 1);
    nvme->read_size("block_size", config.block_size, kDirectIoAlignment);
    nvme->read_uint32("queue_depth", config.queue_depth, 1, 4096);
    nvme->read_uint32("rings", config.rings, 1, 64);
    nvme->read_bool("direct", config.direct);
    nvme->read_enum("engine", config.engine,
                    {{"auto", IoEngineKind::kAuto},
                     {"io_uring", IoEngineKind::kIoUring},
                     {"posix", IoEngineKind::kPosix}});
    nvme->read_bool("fsync", config.fsync);
    nvme->read_enum("on_existing", config.on_existing,
                    {{"refuse", OnExistingStore::kRefuse},
                     {"overwrite", OnExistingStore::kOverwrite},
                     {"resume", OnExistingStore::kResume}});
    if (config.direct && !is_aligned(config.block_size, kDirectIoAlignment)) {
      nvme->fail("block_size",
                 fmt::format("block_size {} is not a multiple of 4 KiB, which direct = true "
                             "(O_DIRECT) needs",
                             format_binary_bytes(config.block_size)));
    }
    if (config.block_size > (1ull << 30)) {
      nvme->fail("block_size", "block_size must be at most 1 GiB");
    }
    nvme->finish();
  }
  section->finish();
}

void read_zero(TableReader& root, ZeroConfig& zero) {
  std::optional<TableReader> section = root.table("zero");
  if (!section) return;
  const std::initializer_list<std::pair<std::string_view, Tier>> tiers = {
      {"device", Tier::kDevice}, {"host", Tier::kHost}, {"nvme", Tier::kNvme}};
  section->read_uint32("stage", zero.stage, 0, 3);
  section->read_enum("params", zero.params, tiers);
  section->read_enum("grads", zero.grads, tiers);
  section->read_enum("optimizer", zero.optimizer, tiers);
  section->read_count("sub_group_size", zero.sub_group_size, 1024, kMaxElements);
  section->read_double("optimizer_host_fraction", zero.optimizer_host_fraction, 0.0, 1.0);
  section->read_double("optimizer_device_fraction", zero.optimizer_device_fraction, 0.0, 1.0);
  section->read_bool("overlap_optimizer", zero.overlap_optimizer);
  section->read_bool("defer_update", zero.defer_update);
  section->read_double("params_host_fraction", zero.params_host_fraction, 0.0, 1.0);
  section->read_double("grads_host_fraction", zero.grads_host_fraction, 0.0, 1.0);
  section->read_uint32("prefetch_depth", zero.prefetch_depth, 0, 64);
  section->read_uint32("buffer_count", zero.buffer_count, 2, 64);
  section->read_count("persistence_threshold", zero.persistence_threshold, 0, kMaxElements);
  section->read_size("max_inflight_bytes", zero.max_inflight_bytes, 1);
  section->finish();
}

// betas = [beta1, beta2], each in [0, 1).
void read_betas(TableReader& section, OptimizerConfig& optimizer) {
  const toml::node* node = section.node("betas");
  if (node == nullptr) return;
  const toml::array* array = node->as_array();
  if (array == nullptr || array->size() != 2 || !(*array)[0].is_number() ||
      !(*array)[1].is_number()) {
    section.fail("betas", "expected two numbers, e.g. betas = [0.9, 0.999]");
  }
  const double beta1 = *(*array)[0].value<double>();
  const double beta2 = *(*array)[1].value<double>();
  for (const double beta : {beta1, beta2}) {
    if (!(beta >= 0.0 && beta < 1.0)) {
      section.fail("betas",
                   fmt::format("beta {} is out of range: each beta must be in [0, 1)", beta));
    }
  }
  optimizer.beta1 = beta1;
  optimizer.beta2 = beta2;
}

// schedule, lr_decay_steps and min_lr, checked against lr and warmup_steps (read before).
void read_lr_schedule(TableReader& section, OptimizerConfig& optimizer) {
  section.read_enum("schedule", optimizer.schedule,
                    {{"constant", LrScheduleKind::kConstant},
                     {"linear", LrScheduleKind::kLinear},
                     {"cosine", LrScheduleKind::kCosine}});
  section.read_uint64("lr_decay_steps", optimizer.lr_decay_steps, 0, 1ull << 40);
  section.read_double("min_lr", optimizer.min_lr, 0.0, 10.0);
  if (optimizer.schedule == LrScheduleKind::kConstant) {
    for (const auto& [key, is_set] : {std::pair{"lr_decay_steps", optimizer.lr_decay_steps != 0},
                                      std::pair{"min_lr", optimizer.min_lr != 0.0}}) {
      if (is_set) {
        section.fail(key,
                     fmt::format("{} has no effect with schedule = \"constant\" (the default): "
                                 "set schedule = \"linear\" or \"cosine\" to decay the "
                                 "learning rate",
                                 key));
      }
    }
    return;
  }
  const std::string_view name = to_string(optimizer.schedule);
  if (optimizer.lr_decay_steps == 0) {
    section.fail("schedule",
                 fmt::format("schedule = \"{}\" needs lr_decay_steps: the step at which the "
                             "learning rate reaches min_lr (counted from the first step, warm-up "
                             "included), e.g. lr_decay_steps = 1000",
                             name));
  }
  if (optimizer.lr_decay_steps <= optimizer.warmup_steps) {
    section.fail("lr_decay_steps",
                 fmt::format("lr_decay_steps ({}) must be greater than warmup_steps ({}): the "
                             "decay starts where the warm-up ends",
                             optimizer.lr_decay_steps, optimizer.warmup_steps));
  }
  if (optimizer.min_lr > optimizer.lr) {
    section.fail("min_lr", fmt::format("min_lr ({}) must not exceed lr ({}): schedule = \"{}\" "
                                       "decays from lr down to min_lr",
                                       optimizer.min_lr, optimizer.lr, name));
  }
}

void read_optimizer(TableReader& root, OptimizerConfig& optimizer) {
  std::optional<TableReader> section = root.table("optimizer");
  if (!section) return;
  section->read_enum("type", optimizer.type,
                     {{"adamw", OptimizerType::kAdamW},
                      {"adam", OptimizerType::kAdam},
                      {"adagrad", OptimizerType::kAdagrad},
                      {"lion", OptimizerType::kLion}});
  section->read_double("lr", optimizer.lr, 0.0, 10.0);
  read_betas(*section, optimizer);
  section->read_double("weight_decay", optimizer.weight_decay, 0.0, 10.0);
  section->read_positive_double("eps", optimizer.eps, 1.0);
  section->read_bool("bias_correction", optimizer.bias_correction);
  section->read_double("grad_clip", optimizer.grad_clip, 0.0, 1e12);
  section->read_uint32("threads", optimizer.threads, 0, 4096);
  section->read_uint64("warmup_steps", optimizer.warmup_steps, 0, 1ull << 40);
  read_lr_schedule(*section, optimizer);
  using cpu_adam::StateDType;
  section->read_enum("state_dtype", optimizer.state_dtype,
                     {{"fp32", StateDType::kFp32},
                      {"bf16", StateDType::kBf16},
                      {"int8", StateDType::kInt8}});
  section->read_enum("master_dtype", optimizer.master_dtype,
                     {{"fp32", StateDType::kFp32}, {"bf16", StateDType::kBf16}});
  section->read_enum("master_rounding", optimizer.master_rounding,
                     {{"stochastic", MasterRounding::kStochastic},
                      {"kahan", MasterRounding::kKahan}});
  if (optimizer.master_rounding == MasterRounding::kKahan &&
      optimizer.master_dtype != StateDType::kBf16) {
    section->fail("master_rounding",
                  "master_rounding = \"kahan\" compensates a bf16 master's rounding: it needs "
                  "master_dtype = \"bf16\" (an fp32 master rounds to nearest and keeps no "
                  "compensation)");
  }
  section->finish();
}

void read_precision(TableReader& root, PrecisionConfig& precision) {
  std::optional<TableReader> section = root.table("precision");
  if (!section) return;
  const std::initializer_list<std::pair<std::string_view, DType>> dtypes = {
      {"fp32", DType::kFp32}, {"bf16", DType::kBf16}, {"fp16", DType::kFp16}};
  section->read_enum("params", precision.params, dtypes);
  section->read_enum("grads", precision.grads, dtypes);
  section->read_enum("reduce_dtype", precision.reduce_dtype,
                     {{"auto", std::optional<DType>()},
                      {"fp32", std::optional<DType>(DType::kFp32)},
                      {"bf16", std::optional<DType>(DType::kBf16)},
                      {"fp16", std::optional<DType>(DType::kFp16)}});
  section->read_bool("dynamic_loss_scale", precision.dynamic_loss_scale);
  section->read_positive_double("loss_scale", precision.loss_scale, 1e38);
  section->read_uint32("loss_scale_window", precision.loss_scale_window, 1, 1'000'000);
  section->read_positive_double("min_loss_scale", precision.min_loss_scale, 1e38);
  if (precision.min_loss_scale > precision.loss_scale) {
    section->fail("min_loss_scale", fmt::format("min_loss_scale {} is above loss_scale {}",
                                                precision.min_loss_scale, precision.loss_scale));
  }
  section->finish();
}

void read_checkpoint(TableReader& root, CheckpointConfig& checkpoint) {
  std::optional<TableReader> section = root.table("checkpoint");
  if (!section) return;
  section->read_string("dir", checkpoint.dir);
  section->read_uint64("interval_steps", checkpoint.interval_steps, 0, 1ull << 40);
  section->read_uint32("keep", checkpoint.keep, 1, 1000);
  if (checkpoint.interval_steps > 0 && checkpoint.dir.empty()) {
    section->fail("interval_steps",
                  "interval_steps is set but [checkpoint] dir is empty: "
                  "name a directory for the checkpoints");
  }
  section->finish();
}

void read_trace(TableReader& root, TraceConfig& trace) {
  std::optional<TableReader> section = root.table("trace");
  if (!section) return;
  section->read_string("path", trace.path);
  section->finish();
}

void read_model(TableReader& root, ModelConfig& model) {
  std::optional<TableReader> section = root.table("model");
  if (!section) return;
  section->read_count("params", model.params, 0, kMaxElements);
  section->read_uint32("layers", model.layers, 1, 100'000);
  section->read_uint32("d_model", model.d_model, 1, 1'000'000);
  section->read_uint32("heads", model.heads, 1, 100'000);
  section->read_uint32("seq_len", model.seq_len, 1, 10'000'000);
  section->read_uint32("vocab", model.vocab, 2, 100'000'000);
  section->read_bool("tied_head", model.tied_head);
  section->read_uint32("micro_batch", model.micro_batch, 1, 1'000'000);
  section->read_uint32("grad_accumulation", model.grad_accumulation, 1, 1'000'000);
  if (model.d_model % model.heads != 0) {
    section->fail("heads", fmt::format("d_model {} is not divisible by heads {}", model.d_model,
                                       model.heads));
  }
  section->finish();
}

void read_comm(TableReader& root, CommConfig& comm) {
  std::optional<TableReader> section = root.table("comm");
  if (!section) return;
  section->read_enum("backend", comm.backend,
                     {{"auto", CommBackend::kAuto},
                      {"mpi", CommBackend::kMpi},
                      {"nccl", CommBackend::kNccl}});
  section->finish();
}

void read_run(TableReader& root, RunConfig& run) {
  std::optional<TableReader> section = root.table("run");
  if (!section) return;
  section->read_uint32("ranks", run.ranks, 1, 1'000'000);
  section->read_uint64("seed", run.seed, 0, std::numeric_limits<std::int64_t>::max());
  section->finish();
}

// [zero] optimizer_device_fraction keeps a share of host- or NVMe-homed optimizer state on the
// device, where the device's optimizer op updates it: that op reads the gradient and writes the
// parameters in device memory, so both must be homed there.
template <typename Fail>
void check_optimizer_device_fraction(const ZeroConfig& zero, const Fail& fail_zero) {
  const double fraction = zero.optimizer_device_fraction;
  if (fraction <= 0) return;
  const std::string_view key = "optimizer_device_fraction";
  if (zero.optimizer == Tier::kDevice) {
    fail_zero(key, fmt::format("optimizer_device_fraction = {} has no effect with optimizer = "
                               "\"device\" (all of it is on the device already); it keeps a share "
                               "of host- or NVMe-homed optimizer state on the device",
                               fraction));
  }
  if (zero.params != Tier::kDevice || zero.grads != Tier::kDevice) {
    fail_zero(key, fmt::format("optimizer_device_fraction = {} needs params = \"device\" and "
                               "grads = \"device\" (the device's update reads the gradients and "
                               "writes the parameters there); params is \"{}\", grads is \"{}\"",
                               fraction, to_string(zero.params), to_string(zero.grads)));
  }
  if (zero.optimizer_host_fraction + fraction > 1.0) {
    fail_zero(key, fmt::format("optimizer_device_fraction = {} and optimizer_host_fraction = {} "
                               "add up to more than 1",
                               fraction, zero.optimizer_host_fraction));
  }
}

// Checks that need several sections at once.
void check_consistency(const Config& config, TableReader& root) {
  const ZeroConfig& zero = config.zero;
  const bool any_on_nvme =
      zero.params == Tier::kNvme || zero.grads == Tier::kNvme || zero.optimizer == Tier::kNvme;
  std::optional<TableReader> zero_table = root.table("zero");
  const auto fail_zero = [&](std::string_view key, const std::string& message) {
    if (zero_table) zero_table->fail(key, message);
    root.fail("zero", message);
  };
  if (any_on_nvme && config.tiers.nvme.paths.empty()) {
    const std::string_view kind = zero.optimizer == Tier::kNvme ? "optimizer"
                                  : zero.params == Tier::kNvme  ? "params"
                                                                : "grads";
    fail_zero(kind,
              fmt::format("[zero] {} = \"nvme\" but [tiers.nvme] paths is empty: list at "
                          "least one directory on a fast drive, e.g. paths = [\"/mnt/nvme0\"]",
                          kind));
  }
  // A host fraction splits a kind homed on NVMe; on any other home it would silently do nothing.
  for (const auto& [key, kind, what, fraction, home] :
       {std::tuple{"optimizer_host_fraction", "optimizer", "optimizer state",
                   zero.optimizer_host_fraction, zero.optimizer},
        std::tuple{"params_host_fraction", "params", "parameters", zero.params_host_fraction,
                   zero.params},
        std::tuple{"grads_host_fraction", "grads", "gradients", zero.grads_host_fraction,
                   zero.grads}}) {
    if (fraction > 0 && home != Tier::kNvme) {
      fail_zero(key, fmt::format("{} = {} has no effect unless {} = \"nvme\" (it keeps that share "
                                 "of the NVMe-homed {} in host memory); {} is \"{}\"",
                                 key, fraction, kind, what, kind, to_string(home)));
    }
  }
  check_optimizer_device_fraction(zero, fail_zero);
  if (zero.params == Tier::kNvme && zero.stage < 3) {
    fail_zero("params", fmt::format("params = \"nvme\" needs stage = 3 (parameter partitioning); "
                                    "stage is {}",
                                    zero.stage));
  }
  if (zero.grads == Tier::kNvme && zero.stage < 2) {
    fail_zero("grads", fmt::format("grads = \"nvme\" needs stage 2 or 3 (gradient partitioning); "
                                   "stage is {}",
                                   zero.stage));
  }
}

}  // namespace

std::string_view to_string(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kNvme:
      return "nvme";
  }
  return "?";
}

DType gradient_reduce_dtype(const PrecisionConfig& precision, std::uint32_t grad_accumulation) {
  if (precision.reduce_dtype) return *precision.reduce_dtype;
  return grad_accumulation == 1 ? precision.grads : DType::kFp32;
}

std::string_view to_string(DType dtype) {
  return dtype_name(dtype);
}

std::string_view to_string(CommBackend backend) {
  switch (backend) {
    case CommBackend::kAuto:
      return "auto";
    case CommBackend::kMpi:
      return "mpi";
    case CommBackend::kNccl:
      return "nccl";
  }
  return "?";
}

std::string_view to_string(OnExistingStore policy) {
  switch (policy) {
    case OnExistingStore::kRefuse:
      return "refuse";
    case OnExistingStore::kOverwrite:
      return "overwrite";
    case OnExistingStore::kResume:
      return "resume";
  }
  return "?";
}

std::string_view to_string(OptimizerType type) {
  switch (type) {
    case OptimizerType::kAdamW:
      return "adamw";
    case OptimizerType::kAdam:
      return "adam";
    case OptimizerType::kAdagrad:
      return "adagrad";
    case OptimizerType::kLion:
      return "lion";
  }
  return "?";
}

std::string_view to_string(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kConstant:
      return "constant";
    case LrScheduleKind::kLinear:
      return "linear";
    case LrScheduleKind::kCosine:
      return "cosine";
  }
  return "?";
}

std::string_view to_string(MasterRounding rounding) {
  switch (rounding) {
    case MasterRounding::kStochastic:
      return "stochastic";
    case MasterRounding::kKahan:
      return "kahan";
  }
  return "?";
}

ConfigError::ConfigError(std::string file, std::uint32_t line, std::uint32_t column,
                         std::string key_path, std::string message)
    : std::runtime_error(fmt::format("{}:{}:{}: {}{}{}", file, line, column, key_path,
                                     key_path.empty() ? "" : ": ", message)),
      file_(std::move(file)),
      line_(line),
      column_(column),
      key_path_(std::move(key_path)),
      message_(std::move(message)) {}

std::uint64_t gpt_parameter_count(const ModelConfig& model) {
  const std::uint64_t d = model.d_model;
  const std::uint64_t embeddings =
      static_cast<std::uint64_t>(model.vocab) * d + static_cast<std::uint64_t>(model.seq_len) * d;
  // Per block: qkv (3d² + 3d), attention out (d² + d), MLP (4d² + 4d, 4d² + d), 2 LayerNorms (4d).
  const std::uint64_t block = 12 * d * d + 13 * d;
  const std::uint64_t final_norm = 2 * d;
  const std::uint64_t head = model.tied_head ? 0 : static_cast<std::uint64_t>(model.vocab) * d;
  return embeddings + model.layers * block + final_norm + head;
}

std::uint64_t Config::parameter_count() const {
  return model.params != 0 ? model.params : gpt_parameter_count(model);
}

Config parse_config(std::string_view toml_text, std::string_view source_name) {
  const std::string file(source_name);
  toml::table document;
  try {
    document = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& error) {
    throw ConfigError(file, error.source().begin.line, error.source().begin.column, "",
                      fmt::format("TOML syntax error: {}", error.description()));
  }

  Config config;
  config.source = file;
  TableReader root(document, "", file);
  read_run(root, config.run);
  read_tiers(root, config.tiers);
  read_comm(root, config.comm);
  read_zero(root, config.zero);
  read_optimizer(root, config.optimizer);
  read_precision(root, config.precision);
  read_checkpoint(root, config.checkpoint);
  read_trace(root, config.trace);
  read_model(root, config.model);
  root.finish();
  check_consistency(config, root);
  return config;
}

Config load_config(const std::filesystem::path& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) {
    throw ConfigError(path.string(), 0, 0, "",
                      fmt::format("cannot open config file: {}", std::strerror(errno)));
  }
  std::ostringstream text;
  text << stream.rdbuf();
  return parse_config(text.str(), path.string());
}

}  // namespace strata::runtime
