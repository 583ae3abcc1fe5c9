// Config: one TOML file describes a run (tiers, placement, ZeRO, optimizer, precision, checkpoints,
// trace, model). Every key, its type and default are documented in docs/config.md.
//
// load_config() is strict: an unknown key, a wrong type, a value out of range or an inconsistent
// combination throws ConfigError naming the file, line, column and the key's full path, what was
// wrong and what is allowed. Nothing is ever silently defaulted for a misspelt key.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "base/dtype.hpp"
#include "cpu_adam/state_dtype.hpp"
#include "io/engine_options.hpp"
#include "tiers/device/device_kind.hpp"

namespace strata::runtime {

enum class Tier { kDevice, kHost, kNvme };
// [tiers.device] kind and [tiers.nvme] engine are the tiers' and io's own enums, handed on as they
// are; their names are tiers::device_kind_name() and io::to_string().
using tiers::DeviceKind;
using io::IoEngineKind;
// Which Communicator carries the collectives: kMpi (LocalComm for one rank, MpiComm under mpirun),
// kNccl (NcclComm on device memory, bootstrapped over MPI), kAuto (NCCL when the build has it, the
// device is CUDA and there is more than one rank).
enum class CommBackend { kAuto, kMpi, kNccl };
// What a run that was not told to resume does when the NVMe store holds a committed step:
// refuse (naming the store, the model and the step), overwrite it, or resume from it.
enum class OnExistingStore { kRefuse, kOverwrite, kResume };
enum class OptimizerType { kAdamW, kAdam, kAdagrad, kLion };
// The learning rate after warm-up: held, or decayed (linearly or along a half cosine) to min_lr.
enum class LrScheduleKind { kConstant, kLinear, kCosine };
// How a bf16 master keeps what the update's rounding loses: stochastic rounding (unbiased, no
// extra state), or a Kahan compensation term (a second bf16 per element, deterministic).
enum class MasterRounding { kStochastic, kKahan };

std::string_view to_string(Tier tier);
// The config name of a precision: dtype_name() (base/dtype.hpp).
std::string_view to_string(DType dtype);
std::string_view to_string(CommBackend backend);
std::string_view to_string(OnExistingStore policy);
std::string_view to_string(OptimizerType type);
std::string_view to_string(LrScheduleKind kind);
std::string_view to_string(MasterRounding rounding);

inline constexpr std::int32_t kLocalRankDevice = -1;

struct DeviceTierConfig {
  DeviceKind kind = DeviceKind::kAuto;
  // CUDA device ordinal on every rank; kLocalRankDevice: each rank takes its local rank's GPU
  // (OMPI_COMM_WORLD_LOCAL_RANK, 0 without mpirun). runtime/plan/rank_placement.hpp decides.
  std::int32_t index = kLocalRankDevice;
  std::uint64_t budget_bytes = 16ull << 30;

  bool operator==(const DeviceTierConfig&) const = default;
};

struct HostTierConfig {
  std::uint64_t budget_bytes = 16ull << 30;
  bool pinned = true;
  // Host memory the plan leaves spare caches copies of NVMe-homed extents: reads are served from
  // them, writes still go to the drives (tiers::NvmeStoreOptions::read_cache_bytes).
  bool nvme_read_cache = false;

  bool operator==(const HostTierConfig&) const = default;
};

struct NvmeTierConfig {
  std::vector<std::string> paths;  // one swap file per path and rank; several paths are striped
  std::uint64_t budget_bytes = 256ull << 30;
  std::uint64_t block_size = 1ull << 20;
  std::uint32_t queue_depth = 16;
  std::uint32_t rings = 1;
  bool direct = true;
  IoEngineKind engine = IoEngineKind::kAuto;
  bool fsync = true;  // durability: fsync data before the manifest names it committed
  OnExistingStore on_existing = OnExistingStore::kRefuse;

  bool operator==(const NvmeTierConfig&) const = default;
};

struct TiersConfig {
  DeviceTierConfig device;
  HostTierConfig host;
  NvmeTierConfig nvme;

  bool operator==(const TiersConfig&) const = default;
};

struct ZeroConfig {
  std::uint32_t stage = 3;
  Tier params = Tier::kDevice;                 // home of the 16-bit (or fp32) working parameters
  Tier grads = Tier::kDevice;                  // home of the gradient shards
  Tier optimizer = Tier::kHost;                // home of fp32 master weights and optimizer moments
  std::uint64_t sub_group_size = 100'000'000;  // elements per optimizer sub-group
  // optimizer = kNvme only: the share of the optimizer state (whole units, in registration order)
  // kept in host memory instead; the rest streams from NVMe. 0: all on NVMe.
  double optimizer_host_fraction = 0.0;
  // optimizer = kHost or kNvme, with params and grads on the device: the share of the optimizer
  // state (whole units from the first, the units the next forward needs first) kept in device
  // memory and updated there by the device's optimizer op; the rest is updated by the CPU. With
  // optimizer = kNvme, optimizer_host_fraction's units follow these. 0: none on the device.
  double optimizer_device_fraction = 0.0;
  // Each unit's optimizer update starts as soon as its gradient is complete, during the rest of
  // the backward, and is confirmed or redone at step() (runtime/engine/speculation.hpp). false: the
  // whole update runs in step(), after the last gradient. Bitwise the same either way.
  bool overlap_optimizer = true;
  // The updates step() would run itself (all of them when the step clips or overflow-checks fail
  // speculation) run instead when the next forward gathers each unit, on the same worker, and the
  // gather takes the new parameters from the update: the step's parameter writes are never read
  // back for the forward (runtime/engine/deferred_update.cpp). The step commits once the last deferred
  // unit is done. Bitwise the same parameters either way.
  bool defer_update = false;
  // params = kNvme / grads = kNvme only: the same for the 16-bit parameters and the gradients.
  double params_host_fraction = 0.0;
  double grads_host_fraction = 0.0;
  std::uint32_t prefetch_depth = 2;            // units gathered ahead of use
  std::uint32_t buffer_count = 4;              // host staging buffers for NVMe sub-groups
  std::uint64_t persistence_threshold = 100'000;  // units smaller than this stay gathered
  std::uint64_t max_inflight_bytes = 1ull << 30;  // prefetch bytes in flight, all tiers

  bool operator==(const ZeroConfig&) const = default;
};

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  bool bias_correction = true;
  double grad_clip = 1.0;          // global L2 norm; 0 disables clipping
  std::uint32_t threads = 0;       // CPU optimizer threads; 0 = all hardware threads
  std::uint64_t warmup_steps = 0;  // linear learning-rate warm-up: lr * min(1, step / warmup)
  // After warm-up (runtime/config/lr_schedule.hpp): kLinear and kCosine decay from lr at warmup_steps to
  // min_lr at step lr_decay_steps (counted from the first step), then hold min_lr.
  LrScheduleKind schedule = LrScheduleKind::kConstant;
  std::uint64_t lr_decay_steps = 0;  // linear, cosine: > warmup_steps
  double min_lr = 0.0;               // linear, cosine: <= lr
  // How the state is kept (cpu_adam/state_format.hpp): the moments in fp32, bf16 or int8 blocks,
  // the master weights in fp32 or bf16, rounded stochastically each step or Kahan-compensated
  // (master_rounding; bf16 master only).
  cpu_adam::StateDType state_dtype = cpu_adam::StateDType::kFp32;
  cpu_adam::StateDType master_dtype = cpu_adam::StateDType::kFp32;
  MasterRounding master_rounding = MasterRounding::kStochastic;

  bool operator==(const OptimizerConfig&) const = default;
};

struct PrecisionConfig {
  DType params = DType::kBf16;
  DType grads = DType::kBf16;
  // The dtype gradients are reduce-scattered in across ranks; empty: "auto" (resolved by
  // gradient_reduce_dtype below).
  std::optional<DType> reduce_dtype;
  bool dynamic_loss_scale = true;  // fp16 only: scale down on overflow, up after a clean window
  double loss_scale = 65536.0;     // initial (dynamic) or fixed (static) scale; fp16 only
  std::uint32_t loss_scale_window = 1000;
  double min_loss_scale = 1.0;

  bool operator==(const PrecisionConfig&) const = default;
};

// The dtype of the gradient reduce-scatter. "auto": the 16-bit gradient dtype when each step has
// one micro-batch (the reduced shard is stored in that dtype anyway: half the bytes on the wire,
// each rank's contribution rounded to it first), fp32 when micro-batches accumulate (their sum is
// kept in fp32) or the gradients are fp32. An explicit dtype is used as given.
DType gradient_reduce_dtype(const PrecisionConfig& precision, std::uint32_t grad_accumulation);

struct CheckpointConfig {
  std::string dir;                   // empty: no periodic checkpoints
  std::uint64_t interval_steps = 0;  // 0: only when asked
  std::uint32_t keep = 2;

  bool operator==(const CheckpointConfig&) const = default;
};

struct TraceConfig {
  std::string path;  // Chrome trace JSON; empty: no trace

  bool operator==(const TraceConfig&) const = default;
};

struct ModelConfig {
  std::uint64_t params = 0;  // explicit parameter count for `strata plan`; 0: derive from shape
  std::uint32_t layers = 4;
  std::uint32_t d_model = 256;
  std::uint32_t heads = 4;
  std::uint32_t seq_len = 128;
  std::uint32_t vocab = 256;
  bool tied_head = true;
  std::uint32_t micro_batch = 8;
  std::uint32_t grad_accumulation = 1;

  bool operator==(const ModelConfig&) const = default;
};

struct CommConfig {
  CommBackend backend = CommBackend::kAuto;

  bool operator==(const CommConfig&) const = default;
};

struct RunConfig {
  std::uint32_t ranks = 1;
  std::uint64_t seed = 1234;

  bool operator==(const RunConfig&) const = default;
};

struct Config {
  std::string source;  // file the config was read from ("<string>" for parse_config)
  RunConfig run;
  TiersConfig tiers;
  CommConfig comm;
  ZeroConfig zero;
  OptimizerConfig optimizer;
  PrecisionConfig precision;
  CheckpointConfig checkpoint;
  TraceConfig trace;
  ModelConfig model;

  bool operator==(const Config&) const = default;

  // Parameter count: [model].params when set, else the GPT-2 shape's count.
  std::uint64_t parameter_count() const;
};

// A config error: where (file, line, column, key path) and what (message, including what is
// allowed).
class ConfigError : public std::runtime_error {
 public:
  ConfigError(std::string file, std::uint32_t line, std::uint32_t column, std::string key_path,
              std::string message);
  const std::string& file() const { return file_; }
  std::uint32_t line() const { return line_; }
  std::uint32_t column() const { return column_; }
  const std::string& key_path() const { return key_path_; }
  const std::string& message() const { return message_; }

 private:
  std::string file_;
  std::uint32_t line_;
  std::uint32_t column_;
  std::string key_path_;
  std::string message_;
};

// Reads and validates a TOML config file. Throws ConfigError.
Config load_config(const std::filesystem::path& path);
// Same, from text; `source_name` stands for the file name in messages.
Config parse_config(std::string_view toml_text, std::string_view source_name = "<string>");

// GPT-2-style decoder parameter count: embeddings, per block 12·d² + 13·d, final LayerNorm, head.
std::uint64_t gpt_parameter_count(const ModelConfig& model);

}  // namespace strata::runtime
