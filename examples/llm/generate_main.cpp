// strata-generate: continues a prompt with a Hugging Face model folder (KV-cache decoding on the
// host; generation.hpp).
//
//   strata-generate --model MODEL_DIR --prompt "Once upon a time" --max-new-tokens 32
//
// Greedy by default (--temperature 0); --temperature T --top-p P --seed S sample. The prompt is
// encoded without special tokens; generation stops at the model's eos. --json prints one object
// {"prompt_ids", "ids", "text"} (ids: the generated ids; text: their decoding).
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "models/inference/generation.hpp"
#include "models/checkpoint/host_weights.hpp"
#include "models/tokenizer/tokenizer.hpp"

namespace {

struct Options {
  std::string model;
  std::string prompt;
  strata::llm::GenerationOptions generation;
  std::uint32_t blas_threads = 0;
  std::string resident_budget = "auto";
  bool json = false;
};

int run(Options options) {
  namespace llm = strata::llm;
  llm::set_blas_threads(options.blas_threads);
  const llm::HfConfig config = llm::read_hf_config(std::filesystem::path(options.model) /
                                                   "config.json");
  const llm::Tokenizer tokenizer = llm::Tokenizer::load(options.model);
  const std::vector<std::int32_t> prompt_ids = tokenizer.encode(options.prompt);
  const llm::HostWeights weights =
      llm::HostWeights::load(options.model, llm::decoder_units(config),
                             llm::parse_resident_budget(options.resident_budget));
  if (const std::string note = llm::describe_residency(weights, options.model); !note.empty()) {
    std::cerr << "strata-generate: " << note << "\n";
  }
  options.generation.stop_ids = config.eos_token_ids;
  if (options.generation.stop_ids.empty()) {
    if (const auto eos = tokenizer.eos_id()) options.generation.stop_ids.push_back(*eos);
  }
  const std::vector<std::int32_t> ids =
      llm::generate(config, weights, prompt_ids, options.generation);
  const std::string text = tokenizer.decode(ids, /*skip_special_tokens=*/true);
  if (options.json) {
    const nlohmann::json out = {{"prompt_ids", prompt_ids}, {"ids", ids}, {"text", text}};
    std::cout << out.dump() << "\n";
  } else {
    std::cout << options.prompt << text << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"strata-generate: continue a prompt with a Hugging Face model"};
  Options options;
  app.add_option("--model", options.model, "Hugging Face model folder")->required();
  app.add_option("--prompt", options.prompt, "text to continue")->required();
  app.add_option("--max-new-tokens", options.generation.max_new_tokens, "default 64")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--temperature", options.generation.temperature, "0 (default): greedy")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--top-p", options.generation.top_p, "nucleus sampling mass (default 1)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", options.generation.seed, "sampling seed (default 0)");
  app.add_option("--blas-threads", options.blas_threads, "OpenBLAS threads (0: all cores)");
  app.add_option("--resident-budget", options.resident_budget,
                 "host memory for weights kept resident (auto: 3/4 of RAM; e.g. 12GiB; 0: "
                 "stream every unit from the folder on every pass)");
  app.add_flag("--json", options.json, "print one JSON object");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(options);
  } catch (const std::exception& error) {
    std::cerr << "strata-generate: error: " << error.what() << "\n";
    return 1;
  }
}
