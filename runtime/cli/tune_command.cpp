// `strata tune CONFIG [--model DIR | --params N] [--time-budget 120s] [--write TUNED.toml]
// [--validate [--validate-rounds 3]]`: measure this machine (runtime/tune/measure.hpp), choose the
// NVMe knobs, optimizer threads, placement and pipeline sizes that minimise the predicted step time
// within the budgets (runtime/tune/choose.hpp), print the measurements, the choice and the
// prediction, and write the tuned config as commented TOML. --validate then times the optimizer
// step of the tuned config and of a few hand configs with `strata bench step`'s machinery,
// alternately over rounds, and prints two verdicts (tune_validate.cpp).
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/io_error.hpp"
#include "runtime/config/byte_size.hpp"
#include "runtime/cli/commands.hpp"
#include "runtime/cli/tune_calibrate.hpp"
#include "runtime/cli/tune_validate.hpp"
#include "runtime/tune/choose.hpp"
#include "runtime/tune/measure.hpp"
#include "runtime/tune/tuned_toml.hpp"

namespace strata::cli {
namespace {

using runtime::tune::MachineProfile;

// A bound on --validate-rounds: each round runs every config of the validation once.
constexpr int kMaxValidateRounds = 100;

struct TuneOptions {
  std::string config_path;
  std::string model_dir;
  std::string params;
  std::string time_budget = "120s";
  std::string write_path;
  double compute_tflops = 0;
  bool validate = false;
  std::string validate_params = "1e7";
  int validate_rounds = 3;
};

[[noreturn]] void bad_input(const std::string& message) {
  std::cerr << "strata tune: " << message << "\n";
  throw CLI::RuntimeError(kExitBadInput);
}

// "120s", "2m", "1.5min", "1h" or a bare number of seconds.
std::optional<double> parse_seconds(const std::string& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const std::string unit = text.substr(used);
  const double scale = unit.empty() || unit == "s"      ? 1
                       : unit == "m" || unit == "min" ? 60
                       : unit == "h"                  ? 3600
                                                      : -1;
  if (scale < 0 || !(value > 0) || !std::isfinite(value)) return std::nullopt;
  return value * scale;
}

void print_profile(const MachineProfile& profile) {
  if (!profile.io.empty()) {
    std::cout << fmt::format("  {:>9} {:>6} {:>6} {:>11} {:>11} {:>11} {:>11} {:>5}\n", "block",
                             "depth", "rings", "read MB/s", "write MB/s", "mixed MB/s",
                             "flush MB/s", "runs");
    for (const runtime::tune::IoPoint& p : profile.io) {
      std::cout << fmt::format(
          "  {:>9} {:>6} {:>6} {:>11.0f} {:>11.0f} {:>11.0f} {:>11.0f} {:>5}\n",
          runtime::format_binary_bytes(p.block_bytes), p.queue_depth, p.rings, p.read_mb_per_s,
          p.write_mb_per_s, p.mixed_mb_per_s, p.flush_mb_per_s, p.runs);
    }
    if (profile.engine_io_scale != 1) {
      std::cout << fmt::format(
          "  mixed rates as the Engine's optimizer step sees them: {:.2f}x the probe's\n",
          profile.engine_io_scale);
    }
    std::cout << fmt::format("  flush (median of the points): {:.0f} MB/s\n",
                             runtime::tune::flush_mb_per_s(profile));
  }
  for (const runtime::tune::PathPoint& p : profile.paths) {
    std::cout << fmt::format("  path {}: read {:.0f} MB/s, write {:.0f} MB/s (1 MiB x 16 x 1)\n",
                             p.path, p.read_mb_per_s, p.write_mb_per_s);
  }
  std::cout << fmt::format("  host memory: {:.1f} GB/s (parallel memcpy), checksum: {:.1f} GB/s "
                           "(XXH3, one thread)\n",
                           profile.host_memory_gb_per_s, profile.checksum_gb_per_s);
  std::cout << "  Adam, "
            << (profile.adam.empty()
                    ? std::string("not measured")
                    : runtime::tune::describe_adam_update(profile.adam.front().update))
            << ":";
  for (const runtime::tune::AdamPoint& p : profile.adam) {
    std::cout << fmt::format("  {} thread{} {:.3g} params/s", p.threads, p.threads == 1 ? "" : "s",
                             p.params_per_s);
  }
  std::cout << "\n";
  if (profile.h2d_gb_per_s) {
    std::cout << fmt::format("  GPU {}: pinned h2d {:.1f} GB/s, d2h {:.1f} GB/s\n",
                             profile.gpu_note, *profile.h2d_gb_per_s, *profile.d2h_gb_per_s);
  } else {
    std::cout << "  GPU copies: " << profile.gpu_note << "\n";
  }
}

std::string describe_prediction(const runtime::tune::StepPrediction& p) {
  return fmt::format(
      "{:.3f} s (forward+backward {:.3f} s: NVMe {:.3f} s, copies {:.3f} s, compute {}; "
      "optimizer {:.3f} s: NVMe {:.3f} s, checksums {:.3f} s, Adam {:.3f} s, {} sub-groups "
      "{:.3f} s, commit {:.3f} s)",
      p.step_s, p.forward_backward_s, p.nvme_forward_backward_s, p.transfer_s,
      p.compute_s > 0 ? fmt::format("{:.3f} s", p.compute_s) : std::string("not modelled"),
      p.optimizer_s, p.nvme_optimizer_s, p.checksum_s, p.adam_s, p.sub_groups, p.overhead_s,
      p.commit_s);
}

void print_choice(const runtime::tune::TuneChoice& choice) {
  const runtime::Config& c = choice.config;
  std::cout << fmt::format("choice ({} candidates predicted, {} fit the budgets):\n",
                           choice.candidates, choice.fitting);
  std::cout << fmt::format("  [tiers.nvme] block_size = {}, queue_depth = {}, rings = {}\n",
                           runtime::format_binary_bytes(c.tiers.nvme.block_size),
                           c.tiers.nvme.queue_depth, c.tiers.nvme.rings);
  std::cout << fmt::format("  [optimizer]  threads = {}\n", c.optimizer.threads);
  std::cout << fmt::format(
      "  [zero]       params = \"{}\", grads = \"{}\", optimizer = \"{}\", "
      "params_host_fraction = {}, grads_host_fraction = {}, optimizer_host_fraction = {}, "
      "sub_group_size = {}, buffer_count = {}, prefetch_depth = {}\n",
      runtime::to_string(c.zero.params), runtime::to_string(c.zero.grads),
      runtime::to_string(c.zero.optimizer), c.zero.params_host_fraction,
      c.zero.grads_host_fraction, c.zero.optimizer_host_fraction, c.zero.sub_group_size,
      c.zero.buffer_count, c.zero.prefetch_depth);
  std::cout << "predicted step: " << describe_prediction(choice.prediction) << "\n";
}

runtime::tune::TomlComments comments_for(const runtime::tune::TuneChoice& choice,
                                         const TuneOptions& options, std::uint64_t params) {
  runtime::tune::TomlComments comments;
  comments.header = {
      fmt::format("Written by `strata tune {}` for {} parameters (time budget {}).",
                  options.config_path, params, options.time_budget),
      fmt::format("Predicted step: {}", describe_prediction(choice.prediction)),
      "Every key is documented, with its default, in docs/config.md."};
  comments.keys = choice.reasons;
  return comments;
}

// What is tuned: the config (with --model's shapes or --params' count), the plan's inputs and the
// time the measurements may take.
struct TuneRequest {
  runtime::Config config;
  runtime::PlanInputs inputs;
  double budget_s = 0;
};

// The options checked; empty when the config or the model could not be read (reported).
std::optional<TuneRequest> check_request(const TuneOptions& options) {
  std::optional<runtime::Config> loaded = load_config_or_report(options.config_path, "strata tune");
  if (!loaded) return std::nullopt;
  TuneRequest request{*loaded, {}, 0};
  runtime::Config& config = request.config;
  if (!options.model_dir.empty() && !options.params.empty()) {
    bad_input("give --model or --params, not both");
  }
  nlohmann::json described;
  if (!options.model_dir.empty() &&
      !apply_hf_model(options.model_dir, config, described, "strata tune")) {
    return std::nullopt;
  }
  request.inputs = runtime::PlanInputs(config.parameter_count(), config.run.ranks);
  if (!options.params.empty()) {
    const std::optional<std::uint64_t> params = parse_whole_count(options.params, 1e15);
    if (!params) bad_input(fmt::format("--params: \"{}\" is not a whole parameter count between 1 "
                                       "and 1e15 (e.g. 7.5e9)", options.params));
    request.inputs.params = *params;
    config.model.params = *params;  // so the written config plans the same model
  }
  const std::optional<double> budget_s = parse_seconds(options.time_budget);
  if (!budget_s) {
    bad_input(fmt::format("--time-budget: \"{}\" is not a duration (e.g. 120s, 2m, 90)",
                          options.time_budget));
  }
  request.budget_s = *budget_s;
  if (options.validate_rounds < 1 || options.validate_rounds > kMaxValidateRounds) {
    bad_input(fmt::format("--validate-rounds: {} is not a number of rounds between 1 and {} "
                          "(each round times every config once)",
                          options.validate_rounds, kMaxValidateRounds));
  }
  return request;
}

runtime::tune::MeasureOptions measure_options(const TuneRequest& request) {
  const runtime::Config& config = request.config;
  runtime::tune::MeasureOptions measure;
  measure.budget_s = request.budget_s;
  measure.nvme = config.tiers.nvme;
  measure.device = config.tiers.device.kind;
  measure.adam_update = runtime::tune::adam_update(config);
  measure.compressed_param_out = runtime::tune::compressed_param_out(config);
  measure.log = &std::cout;
  return measure;
}

// The choice on the measured profile, its I/O point confirmed and timed on the Engine.
std::optional<runtime::tune::TuneChoice> choose(const TuneRequest& request,
                                                const runtime::tune::MeasureOptions& measure,
                                                MachineProfile& profile) {
  const runtime::Config& config = request.config;
  const runtime::PlanInputs& inputs = request.inputs;
  std::optional<runtime::tune::TuneChoice> choice =
      runtime::tune::choose_config(config, inputs, profile);
  // The chosen I/O point measured again (confirm_io_point: the grid's best overstates itself),
  // and the choice made again on the mean; a new point chosen then is confirmed in turn.
  for (int round = 0; round < 3 && choice && !profile.io.empty(); ++round) {
    const runtime::tune::IoPoint& point =
        runtime::tune::nearest_io_point(profile, choice->config.tiers.nvme);
    if (point.runs > 1) break;
    runtime::tune::confirm_io_point(measure, profile,
                                    static_cast<std::size_t>(&point - profile.io.data()));
    choice = runtime::tune::choose_config(config, inputs, profile);
  }
  // The I/O point timed on the Engine's own step with the chosen config (the probe's raw I/O can
  // rank queue depths otherwise), its rate calibrated on that step, and the choice made again.
  if (choice) {
    choose_io_point_on_engine(choice->config, profile, inputs.params,
                              choice->prediction.plan.unit_elements, request.budget_s, std::cout);
    if (profile.engine_io_point) choice = runtime::tune::choose_config(config, inputs, profile);
  }
  return choice;
}

// --write: the tuned config as commented TOML.
void write_tuned(const TuneOptions& options, const runtime::tune::TuneChoice& choice,
                 std::uint64_t params) {
  std::ofstream out(options.write_path);
  out << runtime::tune::render_config_toml(choice.config, comments_for(choice, options, params));
  if (!out.flush()) bad_input(fmt::format("--write: cannot write {}", options.write_path));
  std::cout << "wrote " << options.write_path << "\n";
}

// --validate: the tuned config's step timed beside hand configs.
void validate(const TuneOptions& options, const TuneRequest& request,
              const runtime::tune::TuneChoice& choice, const MachineProfile& profile) {
  const std::optional<std::uint64_t> params = parse_whole_count(options.validate_params, 1e12);
  if (!params) bad_input(fmt::format("--validate-params: \"{}\" is not a whole count",
                                     options.validate_params));
  validate_choice(request.config, choice.config, profile, *params,
                  choice.prediction.plan.unit_elements,
                  static_cast<std::uint32_t>(options.validate_rounds));
}

int run_tune(const TuneOptions& options) {
  const std::optional<TuneRequest> request = check_request(options);
  if (!request) return kExitBadInput;
  const runtime::Config& config = request->config;
  std::cout << fmt::format("strata tune: {}, {} parameters, {} rank(s), time budget {:.0f} s\n",
                           config.source, request->inputs.params, request->inputs.ranks,
                           request->budget_s);
  const runtime::tune::MeasureOptions measure = measure_options(*request);
  const auto started = std::chrono::steady_clock::now();
  MachineProfile profile = runtime::tune::measure_machine(measure);
  profile.compute_flops = options.compute_tflops * 1e12;
  calibrate_sub_group_overhead(config, profile, std::cout);
  const std::optional<runtime::tune::TuneChoice> choice = choose(*request, measure, profile);
  std::cout << fmt::format(
      "measured in {:.1f} s:\n",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  print_profile(profile);
  const runtime::tune::StepPrediction given =
      runtime::tune::predict_step(config, request->inputs, profile);
  if (!choice) {
    std::cerr << "strata tune: no placement fits the budgets; `strata plan " << config.source
              << "` says what would\n";
    return kExitDoesNotFit;
  }
  print_choice(*choice);
  std::cout << "the config as given: "
            << (given.plan.fits() ? "predicted " + describe_prediction(given)
                                  : std::string("does not fit its budgets"))
            << "\n";
  if (!options.write_path.empty()) write_tuned(options, *choice, request->inputs.params);
  if (options.validate) validate(options, *request, *choice, profile);
  return 0;
}

}  // namespace

void add_tune_command(CLI::App& app) {
  auto options = std::make_shared<TuneOptions>();
  CLI::App* tune = app.add_subcommand(
      "tune", "measure this machine and choose the NVMe, optimizer and placement knobs");
  tune->add_option("config", options->config_path, "TOML config file (budgets, NVMe paths)")
      ->required();
  tune->add_option("--model", options->model_dir,
                   "Hugging Face model folder: parameter count and shapes from its config.json");
  tune->add_option("--params", options->params, "parameter count, e.g. 7.5e9 (default: [model])");
  tune->add_option("--time-budget", options->time_budget,
                   "time the measurements may take (120s, 2m, 90)")
      ->capture_default_str();
  tune->add_option("--write", options->write_path, "write the tuned config here (TOML)");
  tune->add_option("--compute-tflops", options->compute_tflops,
                   "forward+backward rate for the compute estimate (default 0: left out)")
      ->check(CLI::Range(0.0, 1e6));
  tune->add_flag("--validate", options->validate,
                 "time the tuned config's optimizer step and a grid of hand configs, alternately "
                 "over rounds, and print the verdicts (within 15% of the prediction; against the "
                 "best)");
  tune->add_option("--validate-params", options->validate_params,
                   "parameters of the validation steps")
      ->capture_default_str();
  tune->add_option("--validate-rounds", options->validate_rounds,
                   "rounds of --validate: each times every config once, in an order that changes "
                   "each round; medians and min..max spreads over the rounds (1 or more)")
      ->capture_default_str();
  tune->callback([options] {
    int code = 0;
    try {
      code = run_tune(*options);
    } catch (const io::IoError& error) {
      std::cerr << "strata tune: " << error.what() << "\n";
      throw CLI::RuntimeError(1);
    }
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace strata::cli
