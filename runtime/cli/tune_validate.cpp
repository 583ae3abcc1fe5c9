#include "runtime/cli/tune_validate.hpp"

#include <algorithm>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "base/assert.hpp"
#include "runtime/cli/step_runner.hpp"
#include "runtime/comm/communicator.hpp"
#include "runtime/tune/cost_model.hpp"
#include "runtime/tune/validation.hpp"

namespace strata::cli {
namespace {

// Real steps timed per config and round (as many I/O-only steps alternate with them): the median
// of three keeps one disturbed step on a shared machine out of the round's figure.
constexpr std::uint32_t kValidationSteps = 3;

struct HandConfig {
  std::string name;
  runtime::Config config;
};

// The tuned config and its neighbours one knob away, and the config as given.
std::vector<HandConfig> grid(const runtime::Config& given, const runtime::Config& tuned) {
  std::vector<HandConfig> out = {{"tuned", tuned}, {"as given", given}};
  auto variant = [&](std::string name, auto change) {
    runtime::Config c = tuned;
    change(c.zero, c.tiers.nvme);
    // A neighbour the tuned config already is stays in the table: the two figures of one config
    // show the run's noise.
    out.push_back({c == tuned ? "(= tuned) " + name : std::move(name), c});
  };
  variant("sub_group_size / 4", [](runtime::ZeroConfig& z, auto&) {
    z.sub_group_size = std::max<std::uint64_t>(1024, z.sub_group_size / 4);
  });
  variant("sub_group_size x 4", [](runtime::ZeroConfig& z, auto&) { z.sub_group_size *= 4; });
  variant("buffer_count 2", [](runtime::ZeroConfig& z, auto&) { z.buffer_count = 2; });
  const runtime::ZeroConfig& zero = tuned.zero;
  if (zero.optimizer_host_fraction + zero.params_host_fraction + zero.grads_host_fraction > 0) {
    variant("no host fractions", [](runtime::ZeroConfig& z, auto&) {
      z.optimizer_host_fraction = z.params_host_fraction = z.grads_host_fraction = 0;
    });
  }
  if (zero.optimizer_device_fraction > 0) {
    variant("no optimizer on the device", [](runtime::ZeroConfig& z, auto&) {
      z.optimizer_device_fraction = 0;
    });
  }
  variant("1 MiB x 16 x 1 ring", [](auto&, runtime::NvmeTierConfig& n) {
    n.block_size = 1 << 20;
    n.queue_depth = 16;
    n.rings = 1;
  });
  return out;
}

// " (0.5 on host)" for a kind a host fraction splits.
std::string on_host(double fraction) {
  return fraction > 0 ? fmt::format(" ({} on host)", fraction) : std::string();
}

// The validation's own scratch stores (in_scratch_stores).
constexpr std::string_view kScratchName = "strata-tune-validate";

// One row of the table: a config, its prediction and its figure of each round.
struct Row {
  std::string name;
  bool is_tuned = false;  // the tuned config itself (its own row or a neighbour equal to it)
  runtime::Config config;
  runtime::tune::StepPrediction prediction;
  std::string placement;
  std::vector<double> round_s;  // the median of each round's real steps
};

std::string comparison_words(const runtime::tune::HandComparison& c) {
  switch (c.verdict) {
    case runtime::tune::Comparison::kNoWorse:
      return fmt::format("{:.4f} s faster or equal: no worse", -c.difference_s);
    case runtime::tune::Comparison::kWithinNoise:
      return fmt::format("{:.4f} s slower, less than the larger spread {:.4f} s: within noise",
                         c.difference_s, c.noise_s);
    case runtime::tune::Comparison::kWorse:
      return fmt::format("{:.4f} s slower, not less than the larger spread {:.4f} s: worse",
                         c.difference_s, c.noise_s);
  }
  return {};
}

void print_verdicts(const std::vector<Row>& rows) {
  // The tuned config's figures: every round of every row that is the tuned config (its own and
  // the neighbours labelled "(= tuned)"), so its median and spread count the differences between
  // those rows, which one row's rounds can understate.
  std::vector<double> tuned_s;
  std::size_t tuned_rows = 0;
  for (const Row& row : rows) {
    if (!row.is_tuned || row.round_s.empty()) continue;
    tuned_s.insert(tuned_s.end(), row.round_s.begin(), row.round_s.end());
    ++tuned_rows;
  }
  const runtime::tune::RoundFigures tuned_figures = runtime::tune::summarize(tuned_s);
  const double predicted = rows.front().prediction.optimizer_s;
  std::cout << fmt::format(
      "verdict 1: the tuned config measured {:.3f} s (median of {} figure(s): {} row(s) x rounds) "
      "against its prediction {:.3f} s: ratio {:.2f}, {} {:.0f}%\n",
      tuned_figures.median_s, tuned_s.size(), tuned_rows, predicted,
      tuned_figures.median_s / predicted,
      runtime::tune::within_prediction(tuned_figures.median_s, predicted) ? "within" : "NOT within",
      100 * runtime::tune::kPredictionTolerance);
  // The hand config with the lowest median (the tuned config's own rows aside).
  const Row* best = nullptr;
  double best_median_s = 0;
  for (const Row& row : rows) {
    if (row.is_tuned || row.round_s.empty()) continue;
    const double median_s = runtime::tune::summarize(row.round_s).median_s;
    if (best == nullptr || median_s < best_median_s) {
      best = &row;
      best_median_s = median_s;
    }
  }
  if (best == nullptr) {
    std::cout << "verdict 2: no hand config other than the tuned one fits: nothing to compare\n";
    return;
  }
  const runtime::tune::RoundFigures best_figures = runtime::tune::summarize(best->round_s);
  std::cout << fmt::format(
      "verdict 2: the tuned config {:.4f} s (spread {:.4f} s) against the best hand config, "
      "\"{}\", {:.4f} s (spread {:.4f} s): {}\n",
      tuned_figures.median_s, tuned_figures.spread_s(), best->name, best_figures.median_s,
      best_figures.spread_s(),
      comparison_words(runtime::tune::compare_to_hand(tuned_figures, best_figures)));
}

}  // namespace

void validate_choice(const runtime::Config& given, const runtime::Config& tuned,
                     const runtime::tune::MachineProfile& profile, std::uint64_t params,
                     std::uint64_t model_unit_params, std::uint32_t rounds) {
  STRATA_ASSERT(rounds >= 1);
  // Units of the model's size: the budgets were fitted to its largest unit (pipeline buffers,
  // gathered units), so other units could make the tuned config not fit, or fit too easily.
  const std::uint64_t unit_params =
      std::max<std::uint64_t>(1, std::min<std::uint64_t>(params, model_unit_params));
  const std::vector<std::uint64_t> units = unit_sizes(params, unit_params);
  std::vector<Row> rows;
  for (const HandConfig& hand : grid(given, tuned)) {
    Row row;
    row.name = hand.name;
    row.is_tuned = hand.config == tuned;
    row.config = in_scratch_stores(hand.config, kScratchName);
    row.prediction = runtime::tune::predict_step(row.config,
                                                 runtime::PlanInputs(params, 1, units), profile);
    const runtime::Config& c = row.config;
    row.placement = fmt::format(
        "{}{}/{}{}/{}{}, {}, {}", runtime::to_string(c.zero.params),
        on_host(c.zero.params_host_fraction), runtime::to_string(c.zero.grads),
        on_host(c.zero.grads_host_fraction), runtime::to_string(c.zero.optimizer),
        on_host(c.zero.optimizer_host_fraction), c.zero.sub_group_size, c.zero.buffer_count);
    rows.push_back(std::move(row));
  }
  std::vector<std::size_t> fitting;  // the rows timed
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].prediction.plan.fits()) fitting.push_back(i);
  }
  std::cout << fmt::format(
      "validation: the optimizer step over {} parameters ({} units) on the host device, {} "
      "round(s), each timing every config once (median of {} real steps) in an order that changes "
      "each round; per config the median over the rounds and its min..max spread, against the "
      "predicted optimizer phase\n",
      params, units.size(), rounds, kValidationSteps);
  std::unique_ptr<runtime::comm::Communicator> comm = runtime::comm::make_communicator();
  for (std::uint32_t round = 0; round < rounds; ++round) {
    for (std::size_t position : runtime::tune::round_order(fitting.size(), round)) {
      Row& row = rows[fitting[position]];
      const Timings timings = run_steps_on_host(row.config, *comm, params, unit_params, kValidationSteps);
      row.round_s.push_back(median(timings.step_s));
    }
  }
  std::cout << fmt::format("  {:<30} {:>9} {:>9} {:>13} {:>6} {:>5}  {}\n", "config", "predicted",
                           "measured", "spread", "ratio", "fits",
                           "placement (params/grads/optimizer), sub-group, buffers");
  for (const Row& row : rows) {
    if (row.round_s.empty()) {
      std::cout << fmt::format("  {:<30} {:>9} {:>9} {:>13} {:>6} {:>5}  {}\n", row.name, "-", "-",
                               "-", "-", "no", row.placement);
      continue;
    }
    const runtime::tune::RoundFigures figures = runtime::tune::summarize(row.round_s);
    std::cout << fmt::format("  {:<30} {:>8.3f}s {:>8.3f}s {:>6.3f}..{:<5.3f} {:>6.2f} {:>5}  {}\n",
                             row.name, row.prediction.optimizer_s, figures.median_s,
                             figures.min_s, figures.max_s,
                             figures.median_s / row.prediction.optimizer_s, "yes", row.placement);
  }
  if (rows.front().round_s.empty()) {
    std::cout << "verdicts: none: the tuned config does not fit the validation's parameters\n";
  } else {
    print_verdicts(rows);
  }
  remove_scratch_stores(in_scratch_stores(tuned, kScratchName));
}

}  // namespace strata::cli
