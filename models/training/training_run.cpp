#include "models/training/training_run.hpp"
#include "runtime/plan/rank_placement.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <thread>

namespace strata::examples {
namespace {

std::uint64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
}

double seconds(const timeval& time) {
  return static_cast<double>(time.tv_sec) + static_cast<double>(time.tv_usec) * 1e-6;
}

}  // namespace

double process_cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

std::optional<PlacedDevice> place_device(runtime::Config& config, runtime::DeviceKind kind,
                                         runtime::comm::Communicator& comm) {
  config.tiers.device.kind = kind;
  PlacedDevice placed;
  try {
    const runtime::RankPlacement placement = runtime::select_rank_placement(
        config, runtime::detect_placement_environment(config.run.ranks));
    placed.device = tiers::make_device(runtime::placed_device_options(placement, config));
    placed.device_comm = runtime::make_placed_device_comm(placement, comm);
  } catch (const runtime::PlacementError& error) {
    std::cerr << "strata-finetune: " << error.what() << "\n";
    return std::nullopt;
  }
  // The memory check and the Engine count the data path of the device this rank got ("auto"
  // resolved), not the host device's: a GPU stages through pinned memory and keeps no undo copies.
  config.tiers.device.kind = placed.device->kind();
  placed.engine_comm = placed.device_comm ? placed.device_comm.get() : &comm;
  return placed;
}

std::string describe_device(const PlacedDevice& placed) {
  return fmt::format("device: {}, collectives over {}", placed.device->name(),
                     placed.engine_comm->backend_name());
}

std::unique_ptr<tiers::GpuProfiler> start_profiler(bool wanted, const PlacedDevice& placed) {
  if (!wanted) return nullptr;
  if (placed.device->kind() != tiers::DeviceKind::kCuda) {
    throw std::invalid_argument("--profile reads the GPU's activity: it needs --device cuda");
  }
  return tiers::start_gpu_profiler();
}

std::string describe_optimizer_home(const runtime::ZeroConfig& zero) {
  const std::string home(runtime::to_string(zero.optimizer));
  if (zero.optimizer_device_fraction <= 0 || zero.optimizer == runtime::Tier::kDevice) return home;
  return fmt::format("{} ({:.0f}% on device)", home, 100 * zero.optimizer_device_fraction);
}

std::string describe_optimizer(const runtime::OptimizerConfig& optimizer) {
  std::string text =
      fmt::format("{}, lr {:g}, weight decay {:g} (matrices and embeddings)",
                  runtime::to_string(optimizer.type), optimizer.lr, optimizer.weight_decay);
  if (optimizer.warmup_steps > 0) text += fmt::format(", warm-up {} steps", optimizer.warmup_steps);
  if (optimizer.schedule != runtime::LrScheduleKind::kConstant) {
    text += fmt::format(", {} decay to {:g} at step {}", runtime::to_string(optimizer.schedule),
                        optimizer.min_lr, optimizer.lr_decay_steps);
  }
  return text;
}

void print_start_notes(const runtime::OptimizerConfig& optimizer, std::uint64_t first_step,
                       std::uint32_t steps, std::string_view source) {
  const std::uint64_t last_step = run_end_step(first_step, steps);
  if (first_step >= steps && first_step > 0) {
    std::cout << fmt::format(
        "  resumed at step {} from {}: the run (--steps {}) is already complete, nothing to "
        "train\n",
        first_step, source, steps);
  } else if (first_step > 0) {
    std::cout << fmt::format(
        "  resumed at step {} from {}: {} steps left to reach --steps {}\n", first_step, source,
        steps - first_step, steps);
  }
  if (optimizer.schedule == runtime::LrScheduleKind::kConstant ||
      last_step <= optimizer.lr_decay_steps) {
    return;
  }
  std::cout << fmt::format(
      "  note: the run ends at step {}, past [optimizer] lr_decay_steps = {}: its last {} steps "
      "use min_lr {:g}\n",
      last_step, optimizer.lr_decay_steps,
      last_step - std::max(optimizer.lr_decay_steps, first_step), optimizer.min_lr);
}

void print_validation(std::uint64_t step, double val_loss) {
  std::cout << fmt::format("step {:4} | val loss {:.4f}\n", step, val_loss);
}

void print_summary(const RunTotals& totals, std::uint64_t host_budget_bytes) {
  std::cout << fmt::format(
      "summary: {} steps, val loss {:.4f} -> {:.4f} ({:+.1f}%), {:.0f} tokens/s, NVMe read {} "
      "written {}, peak RSS {} (host budget {})\n",
      totals.steps, totals.initial_val_loss, totals.final_val_loss,
      100.0 * (totals.final_val_loss - totals.initial_val_loss) / totals.initial_val_loss,
      totals.tokens_per_s(),
      runtime::format_decimal_bytes(static_cast<double>(totals.nvme_read_bytes)),
      runtime::format_decimal_bytes(static_cast<double>(totals.nvme_written_bytes)),
      runtime::format_binary_bytes(peak_rss_bytes()),
      runtime::format_binary_bytes(host_budget_bytes));
  if (totals.steps > 0 && totals.train_s > 0) {
    std::cout << fmt::format(
        "  CPU: {:.2f} core-s per step, {:.2f} of {} cores busy during the steps\n",
        totals.train_cpu_s / static_cast<double>(totals.steps), totals.train_cpu_s / totals.train_s,
        std::thread::hardware_concurrency());
  }
}

nlohmann::json summary_json(const RunTotals& totals, const runtime::Config& config) {
  return {{"params", config.parameter_count()},
          {"steps", totals.steps},
          {"ranks", config.run.ranks},
          {"initial_val_loss", totals.initial_val_loss},
          {"final_val_loss", totals.final_val_loss},
          {"tokens_per_s", totals.tokens_per_s()},
          {"train_s", totals.train_s},
          {"peak_rss_bytes", peak_rss_bytes()},
          {"nvme_read_bytes", totals.nvme_read_bytes},
          {"nvme_written_bytes", totals.nvme_written_bytes},
          {"comm_bytes_per_rank", totals.comm_bytes},
          {"cpu_s_per_step",
           totals.steps > 0 ? totals.train_cpu_s / static_cast<double>(totals.steps) : 0.0},
          {"cores_busy", totals.train_s > 0 ? totals.train_cpu_s / totals.train_s : 0.0},
          {"placement",
           {{"params", runtime::to_string(config.zero.params)},
            {"grads", runtime::to_string(config.zero.grads)},
            {"optimizer", runtime::to_string(config.zero.optimizer)}}}};
}

}  // namespace strata::examples
