// The run both strata-finetune drivers share (the built-in GPT of gpt_trainer.hpp and --model's
// LlmTrainer): the initial validation, the steps with one progress line each and periodic
// validation, the periodic checkpoints of [checkpoint] (runtime/checkpoint/periodic_checkpoints.hpp), then
// the summary line and JSON, so the two print the same figures and save the same checkpoints. A
// trainer offers engine(), train_step() (a report with step, loss, tokens, compute_s,
// gather_wait_s, grads_s, total_s and the Engine's StepStats as optimizer) and validation_loss();
// every rank runs the loop, rank 0 (`lead`) prints.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/config/byte_size.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/config/config.hpp"
#include "runtime/engine/engine.hpp"
#include "runtime/checkpoint/periodic_checkpoints.hpp"
#include "tiers/device/device.hpp"
#include "tiers/device/gpu_profile.hpp"

namespace strata::examples {

// --steps is a run's total, not a count from the resume point: the same command line restarted
// after a crash ends at the same step, with the same schedule end, as the uninterrupted run.
// The step a run of `total_steps` ends at, resumed at `committed_step` (never before it).
inline std::uint64_t run_end_step(std::uint64_t committed_step, std::uint64_t total_steps) {
  return committed_step > total_steps ? committed_step : total_steps;
}

struct RunOptions {
  std::uint32_t steps = 100;  // the run's total (run_end_step)
  std::uint32_t eval_every = 25;  // 0: validation only at the start and after the last step
  std::uint32_t ranks = 1;
  bool lead = true;  // prints
  runtime::CheckpointConfig checkpoint;  // [checkpoint]: saves every interval_steps, keeps `keep`
  // --overwrite: checkpoints past the run's first step are removed instead of refused.
  bool overwrite = false;
  // --profile: each step's GPU time by kind and the GPU's idle time (CUPTI), printed after the
  // step's line. Null: not profiled.
  tiers::GpuProfiler* profiler = nullptr;
};

// The run's figures; tokens summed over ranks.
struct RunTotals {
  std::uint64_t steps = 0;  // trained in this run
  double initial_val_loss = 0;
  double final_val_loss = 0;
  std::uint64_t tokens = 0;
  double train_s = 0;
  std::uint64_t nvme_read_bytes = 0;
  std::uint64_t nvme_written_bytes = 0;
  std::uint64_t comm_bytes = 0;  // the lead rank's collective payload ([precision] reduce_dtype)
  // This process's CPU time (user + system, every thread) over the training steps: with the
  // cores all busy, a placement that spends more CPU per step (I/O, checksums, copies) loses
  // tokens/s in proportion, which no overlap can hide.
  double train_cpu_s = 0;

  double tokens_per_s() const { return train_s > 0 ? static_cast<double>(tokens) / train_s : 0; }
};

// Each rank's device (its local rank's GPU, or [tiers.device] index, for `kind`) and the
// communicator its Engine uses ([comm]: NcclComm on GPUs, else `comm` itself). On a
// PlacementError it prints "strata-finetune: <why>" and returns nullopt (the caller exits 2).
// The lead prints describe_device() once it knows what else the line carries.
struct PlacedDevice {
  std::unique_ptr<tiers::Device> device;
  std::unique_ptr<runtime::comm::Communicator> device_comm;  // null: the Engine uses `comm`
  runtime::comm::Communicator* engine_comm = nullptr;
};
std::optional<PlacedDevice> place_device(runtime::Config& config, runtime::DeviceKind kind,
                                         runtime::comm::Communicator& comm);
// "device: <name>, collectives over <backend>".
std::string describe_device(const PlacedDevice& placed);

// --profile: CUPTI's view of each step on the GPU (tiers/device/gpu_profile.hpp); null when not
// wanted. Throws std::invalid_argument when the device is not a GPU, GpuProfilerUnavailable when
// CUPTI refuses.
std::unique_ptr<tiers::GpuProfiler> start_profiler(bool wanted, const PlacedDevice& placed);

// "adamw, lr 0.0003, weight decay 0.1 (...), warm-up 10 steps, cosine decay to 3e-05 at step 100".
std::string describe_optimizer(const runtime::OptimizerConfig& optimizer);
// Where the optimizer state lives: its home tier, and the share [zero] optimizer_device_fraction
// keeps on the device ("host (50% on device)").
std::string describe_optimizer_home(const runtime::ZeroConfig& zero);
// Printed before the first step: "resumed at step N from <source>: M steps left" when
// first_step > 0, and a note when the run's last step (run_end_step) lies past lr_decay_steps.
void print_start_notes(const runtime::OptimizerConfig& optimizer, std::uint64_t first_step,
                       std::uint32_t steps, std::string_view source = "the NVMe store");
void print_validation(std::uint64_t step, double val_loss);
// User + system CPU seconds this process has used so far, all threads together.
double process_cpu_seconds();
// "summary: N steps, val loss a -> b (+x%), tokens/s, NVMe read/written, peak RSS (host budget)",
// then "CPU: c core-s per step (b of n cores busy during the steps)".
void print_summary(const RunTotals& totals, std::uint64_t host_budget_bytes);
// The figures --summary-json writes: params, steps, ranks, losses, tokens/s, peak RSS, NVMe bytes,
// the lead rank's collective bytes, CPU seconds per step (this process's, user + system) and the
// placement of params, grads and optimizer state.
nlohmann::json summary_json(const RunTotals& totals, const runtime::Config& config);

template <class Report>
void print_step(const Report& report, std::uint32_t ranks) {
  const runtime::StepStats& optimizer = report.optimizer;
  std::cout << fmt::format(
      "step {:4} | loss {:.4f} | lr {:.3g} | {:6.0f} tok/s | {:.2f} s: compute {:.2f}, gather "
      "wait {:.2f}, grads {:.2f}, optimizer exposed {:.2f} (io wait {:.2f}, adam {:.2f}) | nvme "
      "r {} w {}{}{}{}{}{}{}{}{}\n",
      report.step, report.loss, optimizer.lr,
      static_cast<double>(report.tokens * ranks) / report.total_s, report.total_s,
      report.compute_s, report.gather_wait_s, report.grads_s, optimizer.step_s,
      optimizer.io_wait_s, optimizer.adam_s,
      runtime::format_decimal_bytes(static_cast<double>(optimizer.nvme.read_bytes)),
      runtime::format_decimal_bytes(static_cast<double>(optimizer.nvme.written_bytes)),
      // This rank's collective payload over the iteration (gathers, reduce-scatters, norm).
      ranks > 1 ? fmt::format(" | comm {}", runtime::format_decimal_bytes(
                                                static_cast<double>(optimizer.comm_bytes)))
                : std::string(),
      // [zero] overlap_optimizer: how much of the update ran during the backward.
      optimizer.speculated_groups > 0
          ? fmt::format(" | during backward: {} of {} sub-groups confirmed",
                        optimizer.confirmed_groups, optimizer.speculated_groups)
          : std::string(),
      // ... and how many parameter bytes the next forward takes from the step, not the drive.
      optimizer.fresh_param_bytes > 0
          ? fmt::format(" | params handed to the next forward {}",
                        runtime::format_decimal_bytes(
                            static_cast<double>(optimizer.fresh_param_bytes)))
          : std::string(),
      // A step that updates everything itself: its first sub-groups' state read under the backward.
      optimizer.pre_read_groups > 0
          ? fmt::format(" | read during backward: {} sub-groups", optimizer.pre_read_groups)
          : std::string(),
      // [zero] defer_update: how much of it runs under the next forward.
      optimizer.deferred_groups > 0
          ? fmt::format(" | deferred to the next forward: {} sub-groups", optimizer.deferred_groups)
          : std::string(),
      // ... and how long this iteration waited for the last step's (its exposed part).
      optimizer.deferred_wait_s > 0
          ? fmt::format(" | waited {:.3f} s for the last step's deferred updates",
                        optimizer.deferred_wait_s)
          : std::string(),
      // Gathers started before their unit was used (a CUDA device's copies and casts on its
      // streams; several ranks' all-gathers), gradient moves queued on the streams.
      optimizer.gathers_queued_ahead + optimizer.grad_moves_queued > 0
          ? fmt::format(" | ahead of use: {} gathers, {} gradient moves queued",
                        optimizer.gathers_queued_ahead, optimizer.grad_moves_queued)
          : std::string(),
      optimizer.skipped ? " | SKIPPED (non-finite gradients)" : "");
  std::cout.flush();  // progress lines reach a pipe or a log file as they happen
}

template <class Trainer>
RunTotals run_training(Trainer& trainer, const RunOptions& options) {
  const std::uint64_t first_step = trainer.engine().step_count();
  const std::uint64_t last_step = run_end_step(first_step, options.steps);
  const runtime::PeriodicCheckpoints checkpoints(options.checkpoint, options.lead);
  checkpoints.start(first_step, options.overwrite);  // refuses before any work
  RunTotals totals;
  totals.initial_val_loss = trainer.validation_loss();
  totals.final_val_loss = totals.initial_val_loss;
  if (options.lead) print_validation(first_step, totals.initial_val_loss);
  totals.steps = last_step - first_step;
  while (trainer.engine().step_count() < last_step) {
    if (options.profiler != nullptr) options.profiler->collect();  // the window starts here
    const double cpu_before = process_cpu_seconds();
    const auto report = trainer.train_step();
    totals.train_cpu_s += process_cpu_seconds() - cpu_before;
    const std::optional<tiers::GpuProfile> profile =
        options.profiler != nullptr ? std::optional(options.profiler->collect()) : std::nullopt;
    totals.tokens += report.tokens * options.ranks;
    totals.train_s += report.total_s;
    totals.nvme_read_bytes += report.optimizer.nvme.read_bytes;
    totals.nvme_written_bytes += report.optimizer.nvme.written_bytes;
    totals.comm_bytes += report.optimizer.comm_bytes;
    if (options.lead) print_step(report, options.ranks);
    if (options.lead && profile) {
      std::cout << "  gpu: " << tiers::describe(*profile) << "\n";
      if (trainer.engine().step_count() == last_step) {  // where the last step's time went
        std::cout << "  gpu kernels: " << tiers::describe_top_kernels(*profile, 12) << "\n";
      }
      std::cout.flush();
    }
    const std::optional<std::filesystem::path> saved = checkpoints.after_step(trainer.engine());
    if (options.lead && saved) std::cout << "  checkpoint " << saved->string() << "\n";
    const std::uint64_t done = trainer.engine().step_count() - first_step;
    if ((options.eval_every != 0 && done % options.eval_every == 0) ||
        trainer.engine().step_count() == last_step) {
      totals.final_val_loss = trainer.validation_loss();
      if (options.lead) print_validation(trainer.engine().step_count(), totals.final_val_loss);
    }
  }
  return totals;
}

}  // namespace strata::examples
