#include "examples/finetune/hf_finetune.hpp"

#include <filesystem>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/training/training_run.hpp"
#include "models/training/llm_trainer.hpp"
#include "models/decoder/model_plan.hpp"
#include "runtime/config/byte_size.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "runtime/engine/trace.hpp"
#include "tiers/device/device.hpp"

namespace strata::examples {
namespace {

using runtime::format_decimal_bytes;

llm::LlmTrainerOptions trainer_options(const runtime::Config& config,
                                       const HfFinetuneOptions& options, runtime::Tracer* tracer) {
  llm::LlmTrainerOptions trainer;
  trainer.model_dir = options.model_dir;
  for (const std::string& path : options.data) trainer.data.emplace_back(path);
  trainer.seq_len = options.seq_len.value_or(config.model.seq_len);
  trainer.micro_batch = options.micro_batch.value_or(config.model.micro_batch);
  trainer.grad_accumulation = options.grad_accumulation.value_or(config.model.grad_accumulation);
  trainer.activation_checkpointing = options.activation_checkpointing;
  trainer.document_mask = options.document_mask;
  trainer.cuda_attention = options.attention;
  if (options.synchronous_unit_calls) {
    trainer.unit_calls = llm::LlmTrainerOptions::UnitCalls::kSynchronous;
  }
  trainer.eval_batches = options.eval_batches;
  trainer.resume = options.resume;
  trainer.overwrite = options.overwrite;
  trainer.tracer = tracer;
  return trainer;
}

// The memory plan, with the device charged for the decoder's own compute when it runs on a GPU.
runtime::MemoryPlan hf_memory_plan(const runtime::Config& config, const llm::HfConfig& hf_config,
                                   const llm::LlmTrainerOptions& trainer_opts,
                                   const PlacedDevice& placed) {
  llm::DecoderOptions decoder_options;
  decoder_options.seq_len = trainer_opts.seq_len;
  decoder_options.micro_batch = trainer_opts.micro_batch;
  decoder_options.activation_checkpointing = trainer_opts.activation_checkpointing;
  return runtime::make_memory_plan(
      config, llm::plan_inputs(hf_config, config.run.ranks, decoder_options,
                               placed.device->kind() == tiers::DeviceKind::kCuda));
}

// The lead's first lines: the model, the batch shape and where the state lives.
void print_model_and_plan(const runtime::Config& config, const HfFinetuneOptions& options,
                          const llm::HfConfig& hf_config,
                          const llm::LlmTrainerOptions& trainer_opts,
                          const runtime::MemoryPlan& plan) {
  std::cout << fmt::format(
      "strata-finetune: {} ({}), {} parameters ({} layers, hidden {}, {} heads / {} kv), seq "
      "{}, micro-batch {} x {} accumulation, {} rank(s)\n  state: params on {}, grads on {}, "
      "optimizer on {}; model state {} per rank\n",
      options.model_dir, hf_config.architecture, config.model.params, hf_config.num_layers,
      hf_config.hidden_size, hf_config.num_heads, hf_config.num_kv_heads, trainer_opts.seq_len,
      trainer_opts.micro_batch, trainer_opts.grad_accumulation, config.run.ranks,
      runtime::to_string(config.zero.params), runtime::to_string(config.zero.grads),
      describe_optimizer_home(config.zero),
      format_decimal_bytes(static_cast<double>(plan.model_state_bytes_per_rank())));
  std::cout << "  optimizer: " << describe_optimizer(config.optimizer) << "\n";
}

// --resume-from's checkpoint loaded (the training order is a function of the step,
// llm_trainer.hpp: loading the step is enough), with the lead's lines on the device, the
// checkpoint, the data and where the run starts.
void start_from(llm::LlmTrainer& trainer, const runtime::Config& config,
                const HfFinetuneOptions& options, const PlacedDevice& placed, bool lead) {
  if (lead) {
    std::cout << fmt::format("  {}, attention {}, {} unit calls\n", describe_device(placed),
                             trainer.model().attention_implementation(),
                             trainer.asynchronous_unit_calls() ? "asynchronous" : "synchronous");
  }
  if (!options.resume_from.empty()) {
    trainer.engine().load(options.resume_from);
    if (lead) {
      std::cout << fmt::format("  loaded checkpoint {} (step {})\n", options.resume_from,
                               trainer.engine().step_count());
    }
  }
  if (!lead) return;
  std::cout << fmt::format(
      "  data: {} tokens, {} training and {} validation windows of {} tokens; {}\n",
      trainer.data_tokens(), trainer.data().train_windows(), trainer.data().validation_windows(),
      trainer.data().window_tokens(), trainer.engine().placement_summary());
  print_start_notes(config.optimizer, trainer.engine().step_count(), options.steps,
                    options.resume_from.empty() ? std::string("the NVMe store")
                                                : "checkpoint " + options.resume_from);
}

// After the last step: the export (every rank takes part), then the lead's summary, trace and
// summary JSON.
void finish_run(llm::LlmTrainer& trainer, const RunTotals& totals, const runtime::Config& config,
                const HfFinetuneOptions& options, const runtime::Tracer& tracer, bool lead) {
  if (!options.export_dir.empty()) {
    llm::ExportOptions export_options;
    export_options.dtype = options.export_dtype;
    export_options.max_shard_bytes = options.max_shard_bytes;
    trainer.export_hf(options.export_dir, export_options);
    if (lead) {
      std::cout << fmt::format("  exported {} ({})\n", options.export_dir,
                               runtime::to_string(options.export_dtype));
    }
  }
  if (!lead) return;
  print_summary(totals, config.tiers.host.budget_bytes);
  if (!options.trace.empty()) {
    tracer.write_chrome_json(options.trace);
    std::cout << fmt::format("  trace: {} ({} events)\n", options.trace, tracer.event_count());
  }
  if (!options.summary_json.empty()) {
    nlohmann::json summary = summary_json(totals, config);
    summary["model"] = options.model_dir;
    std::ofstream(options.summary_json) << summary.dump(2) << "\n";
  }
}

}  // namespace

int run_hf_finetune(runtime::Config config, const HfFinetuneOptions& options) {
  std::unique_ptr<runtime::comm::Communicator> comm = runtime::comm::make_communicator();
  const bool lead = comm->rank() == 0;
  config.run.ranks = static_cast<std::uint32_t>(comm->size());
  for (const std::string& path : config.tiers.nvme.paths) std::filesystem::create_directories(path);
  const llm::HfConfig hf_config =
      llm::read_hf_config(std::filesystem::path(options.model_dir) / "config.json");
  llm::describe_model_for_plan(hf_config, config);
  config.model.grad_accumulation = options.grad_accumulation.value_or(config.model.grad_accumulation);
  runtime::Tracer tracer;
  const llm::LlmTrainerOptions trainer_opts =
      trainer_options(config, options, options.trace.empty() ? nullptr : &tracer);
  llm::set_blas_threads(options.blas_threads);
  // The device first (nothing is allocated on it yet): whether the model computes on a GPU
  // decides what the plan charges the device tier for.
  std::optional<PlacedDevice> placed = place_device(config, options.device, *comm);
  if (!placed) return 2;
  const runtime::MemoryPlan plan = hf_memory_plan(config, hf_config, trainer_opts, *placed);
  if (lead) print_model_and_plan(config, options, hf_config, trainer_opts, plan);
  if (!plan.fits()) {
    std::cerr << "strata-finetune: the memory plan does not fit; nothing was trained\n"
              << runtime::render_plan_text(plan, config);
    return 3;
  }
  llm::LlmTrainer trainer(config, *placed->device, *placed->engine_comm, trainer_opts);
  start_from(trainer, config, options, *placed, lead);
  const std::unique_ptr<tiers::GpuProfiler> profiler = start_profiler(options.profile, *placed);
  const RunTotals totals =
      run_training(trainer, {options.steps, options.eval_every, config.run.ranks, lead,
                             config.checkpoint, options.overwrite, profiler.get()});
  finish_run(trainer, totals, config, options, tracer, lead);
  return 0;
}

}  // namespace strata::examples
