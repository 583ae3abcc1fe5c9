// `strata plan CONFIG`: the per-rank memory plan, printed before anything is allocated.
// `strata plan [CONFIG] --model DIR`: the same for a Hugging Face model folder, its units from
// config.json and, when it would compute on a GPU (--device cuda, or [tiers.device] kind "cuda",
// or "auto" with a usable GPU), the device memory of its compute at --seq-len x --micro-batch
// (models/decoder; the program links strata_decoder, the runtime library does not). Either way
// the plan counts the data path of that device (a GPU's pinned staging, the host device's undo
// copies).
#include <filesystem>
#include <optional>
#include <iostream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/decoder/model_plan.hpp"
#include "runtime/cli/commands.hpp"
#include "runtime/config/config.hpp"
#include "runtime/plan/memory_plan.hpp"
#include "tiers/device/device.hpp"

namespace strata::cli {

bool apply_hf_model(const std::string& model_dir, runtime::Config& config,
                    nlohmann::json& described, std::string_view command) {
  try {
    const llm::HfConfig hf = llm::read_hf_config(std::filesystem::path(model_dir) / "config.json");
    llm::describe_model_for_plan(hf, config);
    described = {{"dir", model_dir},
                 {"architecture", hf.architecture},
                 {"params", config.model.params},
                 {"layers", hf.num_layers},
                 {"hidden_size", hf.hidden_size},
                 {"largest_unit_params", llm::largest_unit_numel(hf)}};
    return true;
  } catch (const std::exception& error) {
    std::cerr << command << ": --model: " << error.what() << "\n";
    return false;
  }
}

namespace {

struct PlanOptions {
  std::string config_path;  // empty: the defaults (only with --model)
  std::string model_dir;
  std::string params;  // text, so that "7.5e9" is accepted
  std::uint32_t ranks = 0;
  std::optional<std::uint32_t> seq_len, micro_batch;  // default: [model]
  bool activation_checkpointing = false;
  std::string device;  // host, cuda; empty: [tiers.device] kind
  double pcie_gbps = runtime::kAssumedPcieBytesPerS / 1e9;  // each way, for the PCIe bound
  bool json = false;
};

// Whether the model would compute on a GPU: --device, else [tiers.device] kind ("auto": a GPU is
// usable here).
bool computes_on_cuda(const PlanOptions& options, const runtime::Config& config) {
  if (!options.device.empty()) return options.device == "cuda";
  if (config.tiers.device.kind == runtime::DeviceKind::kCuda) return true;
  return config.tiers.device.kind == runtime::DeviceKind::kAuto &&
         tiers::cuda_unavailable_reason().empty();
}

int run_plan(const PlanOptions& options) {
  if (options.config_path.empty() && options.model_dir.empty()) {
    std::cerr << "strata plan: give a CONFIG, --model DIR, or both\n";
    return kExitBadInput;
  }
  std::optional<runtime::Config> loaded =
      options.config_path.empty()
          ? std::optional<runtime::Config>(runtime::parse_config("", "(default config)"))
                                  : load_config_or_report(options.config_path, "strata plan");
  if (!loaded) return kExitBadInput;
  runtime::Config& config = *loaded;
  // The plan counts the data path of the device the run computes on: a CUDA device's staged path
  // (pinned staging on the host, no undo copies) for --device cuda even where the config says
  // "auto", the host device's for --device host.
  const bool on_cuda = computes_on_cuda(options, config);
  config.tiers.device.kind = on_cuda ? runtime::DeviceKind::kCuda : runtime::DeviceKind::kHost;
  nlohmann::json described;
  if (!options.model_dir.empty() && !apply_hf_model(options.model_dir, config, described, "strata plan")) {
    return kExitBadInput;
  }
  runtime::PlanInputs inputs;
  const std::uint32_t ranks = options.ranks != 0 ? options.ranks : config.run.ranks;
  if (!options.model_dir.empty()) {
    llm::DecoderOptions decoder;
    decoder.seq_len = options.seq_len.value_or(config.model.seq_len);
    decoder.micro_batch = options.micro_batch.value_or(config.model.micro_batch);
    decoder.activation_checkpointing = options.activation_checkpointing;
    const llm::HfConfig hf =
        llm::read_hf_config(std::filesystem::path(options.model_dir) / "config.json");
    inputs = llm::plan_inputs(hf, ranks, decoder, on_cuda);
  }
  inputs.params = config.parameter_count();
  inputs.ranks = ranks;
  inputs.pcie_bytes_per_s = options.pcie_gbps * 1e9;
  if (!options.params.empty()) {
    const std::optional<std::uint64_t> params = parse_whole_count(options.params, 1e15);
    if (!params) {
      std::cerr << "strata plan: --params: \"" << options.params
                << "\" is not a whole parameter count between 1 and 1e15 (e.g. 7.5e9)\n";
      return kExitBadInput;
    }
    inputs.params = *params;
    inputs.unit_numels.clear();  // a parameter count of its own: units estimated from it
  }

  const runtime::MemoryPlan plan = runtime::make_memory_plan(config, inputs);
  if (options.json) {
    nlohmann::json out = runtime::plan_to_json(plan, config);
    if (!described.is_null()) out["model"] = described;
    std::cout << out.dump(2) << "\n";
  } else {
    if (!described.is_null()) {
      std::cout << fmt::format("model: {} ({}), {} parameters, {} layers, largest unit {} "
                               "parameters\n",
                               options.model_dir, described["architecture"].get<std::string>(),
                               config.model.params, described["layers"].get<std::uint32_t>(),
                               described["largest_unit_params"].get<std::uint64_t>());
    }
    std::cout << runtime::render_plan_text(plan, config);
  }
  return plan.fits() ? 0 : kExitDoesNotFit;
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* plan = app.add_subcommand(
      "plan", "print the per-rank memory plan (bytes per state kind per tier, I/O, communication)");
  plan->add_option("config", options->config_path, "TOML config file (default: the defaults)");
  plan->add_option("--model", options->model_dir,
                   "Hugging Face model folder: parameter count and shapes from its config.json");
  plan->add_option("--params", options->params,
                   "parameter count, e.g. 7.5e9 (default: from [model])");
  plan->add_option("--ranks", options->ranks, "data-parallel ranks (default: [run] ranks)")
      ->check(CLI::Range(1u, 1u << 20));
  plan->add_option("--seq-len", options->seq_len,
                   "--model: tokens per sequence (default [model] seq_len)")
      ->check(CLI::Range(1u, 1u << 20));
  plan->add_option("--micro-batch", options->micro_batch,
                   "--model: sequences per micro-batch (default [model] micro_batch)")
      ->check(CLI::Range(1u, 1u << 16));
  plan->add_flag("--activation-checkpointing", options->activation_checkpointing,
                 "--model: count one layer's activations, recomputed in backward");
  plan->add_option("--device", options->device,
                   "where the model computes and the device tier lives: host or cuda (default: "
                   "[tiers.device] kind; auto: cuda when a GPU is usable); the plan counts that "
                   "device's data path, and with --model its compute on a GPU")
      ->check(CLI::IsMember({"host", "cuda"}));
  plan->add_option("--pcie-gbps", options->pcie_gbps,
                   "--device cuda: the PCIe rate each way, GB/s, that the plan's bound on the step "
                   "time from its host<->device copies assumes (default 25: PCIe Gen4 x16)")
      ->check(CLI::Range(0.001, 1e6));
  plan->add_flag("--json", options->json, "print the plan as one JSON object");
  plan->callback([options] {
    const int code = run_plan(*options);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace strata::cli
