#include "examples/finetune/hf_finetune.hpp"

#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "examples/finetune/run_length.hpp"
#include "examples/llm/llm_trainer.hpp"
#include "examples/llm/model_plan.hpp"
#include "runtime/byte_size.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/memory_plan.hpp"
#include "tiers/device/device.hpp"

namespace strata::examples {
namespace {

using runtime::format_binary_bytes;
using runtime::format_decimal_bytes;

std::uint64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
}

llm::LlmTrainerOptions trainer_options(const runtime::Config& config,
                                       const HfFinetuneOptions& options) {
  llm::LlmTrainerOptions trainer;
  trainer.model_dir = options.model_dir;
  for (const std::string& path : options.data) trainer.data.emplace_back(path);
  trainer.seq_len = options.seq_len.value_or(config.model.seq_len);
  trainer.micro_batch = options.micro_batch.value_or(config.model.micro_batch);
  trainer.grad_accumulation = options.grad_accumulation.value_or(config.model.grad_accumulation);
  trainer.activation_checkpointing = options.activation_checkpointing;
  trainer.eval_batches = options.eval_batches;
  trainer.resume = options.resume;
  trainer.overwrite = options.overwrite;
  return trainer;
}

void print_step(const llm::LlmStepReport& report, std::uint32_t ranks) {
  std::cout << fmt::format(
      "step {:4} | loss {:.4f} | lr {:.3g} | {:6.0f} tok/s | {:.2f} s: compute {:.2f}, gather "
      "wait {:.2f}, grads {:.2f}, optimizer {:.2f} | nvme r {} w {}{}\n",
      report.step, report.loss, report.optimizer.lr,
      static_cast<double>(report.tokens * ranks) / report.total_s, report.total_s,
      report.compute_s, report.gather_wait_s, report.grads_s, report.optimizer.step_s,
      format_decimal_bytes(static_cast<double>(report.optimizer.nvme.read_bytes)),
      format_decimal_bytes(static_cast<double>(report.optimizer.nvme.written_bytes)),
      report.optimizer.skipped ? " | SKIPPED (non-finite gradients)" : "");
  std::cout.flush();
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
  const runtime::MemoryPlan plan =
      runtime::make_memory_plan(config, {config.model.params, config.run.ranks});
  const llm::LlmTrainerOptions trainer_opts = trainer_options(config, options);
  if (lead) {
    std::cout << fmt::format(
        "strata-finetune: {} ({}), {} parameters ({} layers, hidden {}, {} heads / {} kv), seq "
        "{}, micro-batch {} x {} accumulation, {} rank(s)\n  state: params on {}, grads on {}, "
        "optimizer on {}; model state {} per rank\n",
        options.model_dir, hf_config.architecture, config.model.params, hf_config.num_layers,
        hf_config.hidden_size, hf_config.num_heads, hf_config.num_kv_heads, trainer_opts.seq_len,
        trainer_opts.micro_batch, trainer_opts.grad_accumulation, config.run.ranks,
        runtime::to_string(config.zero.params), runtime::to_string(config.zero.grads),
        runtime::to_string(config.zero.optimizer),
        format_decimal_bytes(static_cast<double>(plan.model_state_bytes_per_rank())));
  }
  if (!plan.fits()) {
    std::cerr << runtime::render_plan_text(plan, config);
    return 3;
  }
  llm::set_blas_threads(options.blas_threads);
  tiers::DeviceOptions device_options;
  device_options.kind = tiers::DeviceKind::kHost;
  device_options.budget_bytes = config.tiers.device.budget_bytes;
  auto device = tiers::make_device(device_options);
  llm::LlmTrainer trainer(config, *device, *comm, trainer_opts);
  if (lead) {
    std::cout << fmt::format(
        "  data: {} tokens, {} training and {} validation windows of {} tokens; {}\n",
        trainer.data_tokens(), trainer.data().train_windows(), trainer.data().validation_windows(),
        trainer.data().window_tokens(), trainer.engine().placement_summary());
    std::cout << resume_note(trainer.engine().step_count(), options.steps);
  }
  const double initial_val = trainer.validation_loss();
  if (lead) {
    std::cout << fmt::format("step {:4} | val loss {:.4f}\n", trainer.engine().step_count(),
                             initial_val);
  }
  double final_val = initial_val;
  std::uint64_t tokens = 0;
  double train_seconds = 0;
  const std::uint64_t first_step = trainer.engine().step_count();
  const std::uint64_t last_step = run_end_step(first_step, options.steps);
  while (trainer.engine().step_count() < last_step) {
    const llm::LlmStepReport report = trainer.train_step();
    tokens += report.tokens * config.run.ranks;
    train_seconds += report.total_s;
    if (lead) print_step(report, config.run.ranks);
    const std::uint64_t done = trainer.engine().step_count() - first_step;
    if ((options.eval_every != 0 && done % options.eval_every == 0) ||
        trainer.engine().step_count() == last_step) {
      final_val = trainer.validation_loss();
      if (lead) {
        std::cout << fmt::format("step {:4} | val loss {:.4f}\n", trainer.engine().step_count(),
                                 final_val);
      }
    }
  }
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
  const double tokens_per_s = train_seconds > 0 ? static_cast<double>(tokens) / train_seconds : 0;
  const std::uint64_t rss = peak_rss_bytes();
  if (lead) {
    std::cout << fmt::format(
        "summary: {} steps, val loss {:.4f} -> {:.4f} ({:+.1f}%), {:.0f} tokens/s, peak RSS {} "
        "(host budget {})\n",
        last_step - first_step, initial_val, final_val,
        100.0 * (final_val - initial_val) / initial_val,
        tokens_per_s, format_binary_bytes(rss), format_binary_bytes(config.tiers.host.budget_bytes));
  }
  if (lead && !options.summary_json.empty()) {
    const nlohmann::json summary = {{"model", options.model_dir},
                                    {"params", config.model.params},
                                    {"steps", options.steps},
                                    {"ranks", config.run.ranks},
                                    {"initial_val_loss", initial_val},
                                    {"final_val_loss", final_val},
                                    {"tokens_per_s", tokens_per_s},
                                    {"peak_rss_bytes", rss}};
    std::ofstream(options.summary_json) << summary.dump(2) << "\n";
  }
  return 0;
}

}  // namespace strata::examples
