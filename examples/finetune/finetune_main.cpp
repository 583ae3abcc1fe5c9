// strata-finetune: fine-tunes a GPT-2-architecture model on byte-level text through strata's
// ZeRO-3 Engine, with parameters, gradients and optimizer state where the TOML config puts them;
// with --model, a Hugging Face model folder (Llama, Mistral, Qwen2, GPT-2) on text / JSONL data,
// exported back as a folder transformers loads (hf_finetune.hpp).
//
//   strata-finetune --config examples/configs/params_optimizer_nvme.toml --steps 40
//   strata-finetune --model HF_DIR --data FILE_OR_DIR... --config TIERS.toml --steps N --export OUT
//
// Prints where the state lives, one progress line per step (loss, learning rate, tokens/s, where
// the step's time went, NVMe traffic), periodic validation losses and a summary.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "models/training/gpt_trainer.hpp"
#include "examples/finetune/hf_finetune.hpp"
#include "models/training/training_run.hpp"
#include "base/units.hpp"
#include "models/gpt/gpt_cuda.hpp"
#include "models/gpt/gpt_model.hpp"
#include "models/gpt/gpt_spec.hpp"
#include "runtime/config/byte_size.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/config/config.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/checkpoint/periodic_checkpoints.hpp"
#include "runtime/plan/rank_placement.hpp"
#include "tiers/device/device.hpp"

namespace {

using strata::runtime::format_binary_bytes;
using strata::runtime::format_decimal_bytes;

struct Options {
  std::string config;
  std::uint32_t steps = 100;
  std::vector<std::string> data;
  std::string init;
  std::string export_path;
  std::string export_dtype;  // default: fp32 (built-in GPT), bf16 (--model)
  std::string model;
  std::optional<std::uint32_t> seq_len;
  std::optional<std::uint32_t> micro_batch;
  std::optional<std::uint32_t> grad_accumulation;
  bool activation_checkpointing = false;
  bool document_mask = false;
  std::string max_shard_size = "5GB";
  std::string trace;
  std::string summary_json;
  bool profile = false;
  std::uint32_t eval_every = 25;
  std::uint32_t eval_batches = 4;
  std::uint32_t blas_threads = 0;
  std::string device = "host";
  std::string attention = "auto";  // --model on CUDA: auto, tensor-cores or fp32
  bool synchronous_unit_calls = false;  // on CUDA (both models): wait for each unit's compute
  bool resume = false;
  bool overwrite = false;
  std::string resume_from;  // a checkpoint, or a [checkpoint] dir (its newest)
};

// --trace, else [trace] path; empty: no trace.
std::string trace_path(const Options& options, const strata::runtime::Config& config) {
  return options.trace.empty() ? config.trace.path : options.trace;
}

// The checkpoint --resume-from names: the path itself, or the newest step checkpoint under it.
std::filesystem::path checkpoint_to_load(const std::string& path) {
  const std::optional<std::filesystem::path> found = strata::runtime::resolve_checkpoint(path);
  if (!found) {
    throw std::runtime_error("--resume-from " + path +
                             ": neither a complete checkpoint nor a directory of step-N "
                             "checkpoints ([checkpoint] dir)");
  }
  return *found;
}

strata::runtime::DeviceKind device_kind(const std::string& name) {
  if (name == "cuda") return strata::runtime::DeviceKind::kCuda;
  if (name == "auto") return strata::runtime::DeviceKind::kAuto;
  return strata::runtime::DeviceKind::kHost;
}

strata::DType export_dtype_of(const std::string& name) {
  using strata::DType;
  return name == "bf16"   ? DType::kBf16
         : name == "fp16" ? DType::kFp16
                          : DType::kFp32;
}

// --model: the Hugging Face path; the GPT-only flags are refused rather than ignored.
int run_model(const Options& options, const strata::runtime::Config& config) {
  if (!options.init.empty()) {
    std::cerr << "strata-finetune: --model takes its weights from the folder: --init applies to "
                 "the built-in GPT only\n";
    return 2;
  }
  const std::optional<std::uint64_t> max_shard =
      strata::runtime::parse_byte_size(options.max_shard_size);
  if (!max_shard || *max_shard == 0) {
    std::cerr << "strata-finetune: --max-shard-size: \"" << options.max_shard_size
              << "\" is not a size (e.g. 5GB, 500MiB)\n";
    return 2;
  }
  strata::examples::HfFinetuneOptions hf;
  hf.model_dir = options.model;
  hf.data = options.data;
  if (hf.data.empty()) hf.data = {"/usr/share/common-licenses"};
  hf.steps = options.steps;
  hf.seq_len = options.seq_len;
  hf.micro_batch = options.micro_batch;
  hf.grad_accumulation = options.grad_accumulation;
  hf.activation_checkpointing = options.activation_checkpointing;
  hf.document_mask = options.document_mask;
  hf.export_dir = options.export_path;
  hf.export_dtype = export_dtype_of(options.export_dtype.empty() ? "bf16" : options.export_dtype);
  hf.max_shard_bytes = *max_shard;
  hf.eval_every = options.eval_every;
  hf.eval_batches = options.eval_batches;
  hf.blas_threads = options.blas_threads;
  hf.device = device_kind(options.device);
  hf.attention = options.attention == "tensor-cores" ? strata::llm::CudaAttention::kTensorCores
                 : options.attention == "fp32"       ? strata::llm::CudaAttention::kFp32
                                                     : strata::llm::CudaAttention::kAuto;
  hf.synchronous_unit_calls = options.synchronous_unit_calls;
  hf.resume = options.resume;
  hf.overwrite = options.overwrite;
  if (!options.resume_from.empty()) hf.resume_from = checkpoint_to_load(options.resume_from);
  hf.trace = trace_path(options, config);
  hf.summary_json = options.summary_json;
  hf.profile = options.profile;
  return strata::examples::run_hf_finetune(config, hf);
}

// The built-in GPT's units, and on a GPU the device memory its compute takes: the CUDA backend's
// activations (gpt_cuda.hpp) and the trainer's fp32 gradient of the largest unit.
strata::runtime::PlanInputs gpt_plan_inputs(const strata::runtime::Config& config,
                                            strata::tiers::DeviceKind device) {
  strata::runtime::PlanInputs inputs(config.parameter_count(), config.run.ranks);
  std::uint64_t largest = 0;
  for (const strata::gpt::UnitSpec& unit : strata::gpt::gpt_units(config.model)) {
    inputs.unit_numels.push_back(unit.numel);
    largest = std::max<std::uint64_t>(largest, unit.numel);
  }
  if (device != strata::tiers::DeviceKind::kCuda) return inputs;
  // Two gradient slots of the largest unit: the asynchronous unit calls (unit_passes.hpp).
  inputs.compute_device_bytes =
      strata::gpt::detail::cuda_gpt_activation_bytes(config.model).budgeted +
      2 * strata::round_up(largest * sizeof(float), strata::tiers::kDeviceAllocationGranularity);
  inputs.compute_description = fmt::format(
      "the model's compute on the GPU: activations of {} x {} tokens, two gradient slots",
      config.model.micro_batch, config.model.seq_len);
  return inputs;
}

// The lead's first lines: the model, where the state lives and the budgets, the optimizer and the
// device.
void print_model_and_plan(const strata::runtime::Config& config,
                          const strata::runtime::MemoryPlan& plan,
                          const strata::examples::PlacedDevice& placed) {
  namespace runtime = strata::runtime;
  std::cout << fmt::format(
      "strata-finetune: {} parameters ({} layers, d_model {}, {} heads, seq {}), {} rank(s)\n",
      config.parameter_count(), config.model.layers, config.model.d_model, config.model.heads,
      config.model.seq_len, config.run.ranks);
  std::cout << fmt::format(
      "  state: params on {}, grads on {}, optimizer on {}; model state {} per rank\n"
      "  budgets: device {}, host {}, nvme {} ({})\n",
      runtime::to_string(config.zero.params), runtime::to_string(config.zero.grads),
      strata::examples::describe_optimizer_home(config.zero),
      format_decimal_bytes(static_cast<double>(plan.model_state_bytes_per_rank())),
      format_binary_bytes(config.tiers.device.budget_bytes),
      format_binary_bytes(config.tiers.host.budget_bytes),
      format_binary_bytes(config.tiers.nvme.budget_bytes),
      config.tiers.nvme.paths.empty() ? std::string("no paths") : config.tiers.nvme.paths.front());
  std::cout << "  optimizer: " << strata::examples::describe_optimizer(config.optimizer) << "\n";
  std::cout << "  " << strata::examples::describe_device(placed) << "\n";
}

strata::examples::TrainerOptions gpt_trainer_options(const Options& options,
                                                     strata::runtime::Tracer* tracer) {
  strata::examples::TrainerOptions trainer_options;
  for (const std::string& path : options.data) trainer_options.data.emplace_back(path);
  trainer_options.eval_batches = options.eval_batches;
  trainer_options.resume = options.resume;
  trainer_options.overwrite = options.overwrite;
  trainer_options.tracer = tracer;
  if (options.synchronous_unit_calls) {
    trainer_options.unit_calls = strata::examples::UnitCalls::kSynchronous;
  }
  return trainer_options;
}

// --init's weights, then `checkpoint` (--resume-from's), with the lead's lines on the checkpoint,
// the data and where the run starts.
void start_from(strata::examples::GptTrainer& trainer, const strata::runtime::Config& config,
                const Options& options, const std::optional<std::filesystem::path>& checkpoint,
                bool lead) {
  if (!options.init.empty()) trainer.load_weights(options.init);
  if (checkpoint) {
    trainer.load_checkpoint(*checkpoint);
    if (lead) {
      std::cout << fmt::format("  loaded checkpoint {} (step {})\n", checkpoint->string(),
                               trainer.engine().step_count());
    }
  }
  if (!lead) return;
  std::cout << fmt::format("  data: {} training bytes, {} validation bytes from {} file(s); {}\n",
                           trainer.corpus().train.size(), trainer.corpus().validation.size(),
                           trainer.corpus().files.size(), trainer.engine().placement_summary());
  strata::examples::print_start_notes(
      config.optimizer, trainer.engine().step_count(), options.steps,
      checkpoint ? "checkpoint " + checkpoint->string() : std::string("the NVMe store"));
}

// After the last step: the export (every rank takes part), then the lead's summary, trace and
// summary JSON.
void finish_run(strata::examples::GptTrainer& trainer, const strata::examples::RunTotals& totals,
                const strata::runtime::Config& config, const Options& options,
                const strata::runtime::Tracer& tracer, bool lead) {
  if (!options.export_path.empty()) {
    trainer.export_weights(options.export_path, export_dtype_of(options.export_dtype));
    if (lead) std::cout << "  exported " << options.export_path << "\n";
  }
  if (!lead) return;
  strata::examples::print_summary(totals, config.tiers.host.budget_bytes);
  const std::string trace = trace_path(options, config);
  if (!trace.empty()) {
    tracer.write_chrome_json(trace);
    std::cout << fmt::format("  trace: {} ({} events)\n", trace, tracer.event_count());
  }
  if (!options.summary_json.empty()) {
    const nlohmann::json summary = strata::examples::summary_json(totals, config);
    std::ofstream(options.summary_json) << summary.dump(2) << "\n";
  }
}

// The built-in GPT: place the device, check the plan, train, export.
int run_gpt(const Options& options, strata::runtime::Config& config) {
  namespace runtime = strata::runtime;
  if (options.attention != "auto") {
    std::cerr << "strata-finetune: --attention picks the Hugging Face decoder's kernels: it "
                 "applies to --model only\n";
    return 2;
  }
  std::unique_ptr<runtime::comm::Communicator> comm = runtime::comm::make_communicator();
  const bool lead = comm->rank() == 0;
  config.run.ranks = static_cast<std::uint32_t>(comm->size());
  for (const std::string& path : config.tiers.nvme.paths) std::filesystem::create_directories(path);

  // The device, then the plan (nothing is allocated on the device yet): refuse what cannot fit.
  // A GPU's plan charges the device for the model's own compute.
  strata::gpt::set_blas_threads(options.blas_threads);
  std::optional<strata::examples::PlacedDevice> placed =
      strata::examples::place_device(config, device_kind(options.device), *comm);
  if (!placed) return 2;
  const runtime::MemoryPlan plan =
      runtime::make_memory_plan(config, gpt_plan_inputs(config, placed->device->kind()));
  if (lead) print_model_and_plan(config, plan, *placed);
  if (!plan.fits()) {
    std::cerr << "strata-finetune: the memory plan does not fit; nothing was trained\n"
              << runtime::render_plan_text(plan, config);
    return 3;
  }

  runtime::Tracer tracer;
  const bool traced = !trace_path(options, config).empty();
  std::optional<std::filesystem::path> checkpoint;  // resolved before the trainer is built
  if (!options.resume_from.empty()) checkpoint = checkpoint_to_load(options.resume_from);
  strata::examples::GptTrainer trainer(config, *placed->device, *placed->engine_comm,
                                       gpt_trainer_options(options, traced ? &tracer : nullptr));
  start_from(trainer, config, options, checkpoint, lead);
  const std::unique_ptr<strata::tiers::GpuProfiler> profiler =
      strata::examples::start_profiler(options.profile, *placed);
  const strata::examples::RunTotals totals = strata::examples::run_training(
      trainer, {options.steps, options.eval_every, config.run.ranks, lead, config.checkpoint,
                options.overwrite, profiler.get()});
  finish_run(trainer, totals, config, options, tracer, lead);
  return 0;
}

int run(const Options& options) {
  strata::runtime::Config config;
  try {
    config = strata::runtime::load_config(options.config);
  } catch (const strata::runtime::ConfigError& error) {
    std::cerr << "strata-finetune: bad config: " << error.what() << "\n";
    return 2;
  }
  return options.model.empty() ? run_gpt(options, config) : run_model(options, config);
}

// --config, --steps, the data, the starting weights and the export.
void add_input_options(CLI::App& app, Options& options) {
  app.add_option("--config", options.config, "TOML config (examples/configs/*.toml)")->required();
  app.add_option("--steps", options.steps,
                 "the run's total optimizer steps (default 100): a resumed run ends at this step")
      ->check(CLI::Range(1u, 10'000'000u));
  app.add_option("--data", options.data,
                 "text files or directories (default: /usr/share/common-licenses); with "
                 "--model also *.jsonl ({\"text\"}, {\"prompt\", \"completion\"}, "
                 "{\"messages\"})");
  app.add_option("--init", options.init, "starting weights (safetensors)");
  app.add_option("--export", options.export_path,
                 "write the trained weights (safetensors; with --model: a model folder)");
  app.add_option("--export-dtype", options.export_dtype,
                 "fp32, bf16 or fp16 (default fp32; with --model bf16)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
}

// --model and the flags that apply to it only.
void add_model_options(CLI::App& app, Options& options) {
  app.add_option("--model", options.model,
                 "Hugging Face model folder (Llama, Mistral, Qwen2, GPT-2) to fine-tune instead "
                 "of the built-in GPT");
  app.add_option("--seq-len", options.seq_len, "--model: tokens per sequence (default [model])")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--micro-batch", options.micro_batch,
                 "--model: sequences per micro-batch (default [model])")
      ->check(CLI::Range(1u, 1u << 16));
  app.add_option("--grad-accumulation", options.grad_accumulation,
                 "--model: micro-batches per step (default [model])")
      ->check(CLI::Range(1u, 1u << 16));
  app.add_flag("--document-mask", options.document_mask,
               "--model: packed documents attend only within themselves and their positions "
               "restart (transformers' packing with restarting position_ids)");
  app.add_flag("--activation-checkpointing", options.activation_checkpointing,
               "--model: recompute each layer's forward in backward");
  app.add_option("--max-shard-size", options.max_shard_size,
                 "--model: largest exported safetensors shard (default 5GB)");
}

// Tracing, profiling, validation, threads, the device and the attention kernels.
void add_run_options(CLI::App& app, Options& options) {
  app.add_option("--trace", options.trace,
                 "write a Chrome trace (chrome://tracing, Perfetto) here (default: [trace] path)");
  app.add_option("--summary-json", options.summary_json, "write a JSON summary");
  app.add_flag("--profile", options.profile,
               "--device cuda: after each step's line, the GPU's time by kind (GEMM, attention, "
               "norms/elementwise, loss, optimizer, copies, collectives) and its idle time, from "
               "CUPTI's activity records");
  app.add_option("--eval-every", options.eval_every, "validation every N steps (0: at the end)");
  app.add_option("--eval-batches", options.eval_batches, "validation batches (default 4)")
      ->check(CLI::Range(1u, 100000u));
  app.add_option("--blas-threads", options.blas_threads, "OpenBLAS threads (0: all cores)");
  app.add_option("--device", options.device,
                 "where the model computes and the device tier lives: host (default; the "
                 "host-emulated device), cuda (each rank's local-rank GPU, or [tiers.device] "
                 "index: cuBLAS and kernels) or auto (cuda when usable); [comm] backend picks "
                 "NCCL or MPI")
      ->check(CLI::IsMember({"host", "cuda", "auto"}));
  app.add_option("--attention", options.attention,
                 "--model on cuda: the attention kernels: auto (default; tensor cores unless the "
                 "head_dim is one they do not take), tensor-cores (bf16 flash attention; refused "
                 "for such a head_dim) or fp32 (the tiled fp32 reference)")
      ->check(CLI::IsMember({"auto", "tensor-cores", "fp32"}));
  app.add_flag("--synchronous-unit-calls", options.synchronous_unit_calls,
               "--device cuda: wait for each unit's compute before the next unit's gather, as "
               "before the asynchronous calls (to compare; the bits are the same)");
}

// --resume, --overwrite and --resume-from (after --init, which --resume-from excludes).
void add_resume_options(CLI::App& app, Options& options) {
  app.add_flag("--resume", options.resume,
               "continue from the NVMe store's committed step (--steps stays the run's total)");
  app.add_flag("--overwrite", options.overwrite,
               "start afresh even when the NVMe store holds a committed step (it is lost); "
               "without it such a start is refused")
      ->excludes("--resume");
  app.add_option("--resume-from", options.resume_from,
                 "continue from a checkpoint: one directory ([checkpoint] dir/step-000120) or "
                 "the [checkpoint] dir itself (its newest); --steps stays the run's total")
      ->excludes("--resume")
      ->excludes("--init");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"strata-finetune: fine-tune a GPT through strata's ZeRO-3 engine"};
  Options options;
  add_input_options(app, options);
  add_model_options(app, options);
  add_run_options(app, options);
  add_resume_options(app, options);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(options);
  } catch (const std::exception& error) {
    std::cerr << "strata-finetune: error: " << error.what() << "\n";
    return 1;
  }
}
