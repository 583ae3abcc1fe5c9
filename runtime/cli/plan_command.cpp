// `strata plan CONFIG`: the per-rank memory plan, printed before anything is allocated.
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/cli/commands.hpp"
#include "runtime/config.hpp"
#include "runtime/memory_plan.hpp"

namespace strata::cli {
namespace {

struct PlanOptions {
  std::string config_path;
  std::string params;  // text, so that "7.5e9" is accepted
  std::uint32_t ranks = 0;
  bool json = false;
};

int run_plan(const PlanOptions& options) {
  const std::optional<runtime::Config> loaded =
      load_config_or_report(options.config_path, "strata plan");
  if (!loaded) return kExitBadInput;
  const runtime::Config& config = *loaded;
  runtime::PlanInputs inputs;
  inputs.params = config.parameter_count();
  inputs.ranks = options.ranks != 0 ? options.ranks : config.run.ranks;
  if (!options.params.empty()) {
    const std::optional<std::uint64_t> params = parse_whole_count(options.params, 1e15);
    if (!params) {
      std::cerr << "strata plan: --params: \"" << options.params
                << "\" is not a whole parameter count between 1 and 1e15 (e.g. 7.5e9)\n";
      return kExitBadInput;
    }
    inputs.params = *params;
  }

  const runtime::MemoryPlan plan = runtime::make_memory_plan(config, inputs);
  if (options.json) {
    std::cout << runtime::plan_to_json(plan, config).dump(2) << "\n";
  } else {
    std::cout << runtime::render_plan_text(plan, config);
  }
  return plan.fits() ? 0 : kExitDoesNotFit;
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* plan = app.add_subcommand(
      "plan", "print the per-rank memory plan (bytes per state kind per tier, I/O, communication)");
  plan->add_option("config", options->config_path, "TOML config file")->required();
  plan->add_option("--params", options->params,
                   "parameter count, e.g. 7.5e9 (default: from [model])");
  plan->add_option("--ranks", options->ranks, "data-parallel ranks (default: [run] ranks)")
      ->check(CLI::Range(1u, 1u << 20));
  plan->add_flag("--json", options->json, "print the plan as one JSON object");
  plan->callback([options] {
    const int code = run_plan(*options);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace strata::cli
