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

#include "examples/llm/host_model.hpp"
#include "models/inference/generation.hpp"

namespace {

struct Options {
  strata::examples::HostModelOptions host;
  std::string prompt;
  strata::llm::GenerationOptions generation;
  bool json = false;
};

int run(Options options) {
  namespace llm = strata::llm;
  const strata::examples::ModelFolder folder = strata::examples::open_model_folder(options.host);
  const std::vector<std::int32_t> prompt_ids = folder.tokenizer.encode(options.prompt);
  const llm::HostWeights weights =
      strata::examples::load_host_weights(folder, options.host, "strata-generate");
  options.generation.stop_ids = folder.config.eos_token_ids;
  if (options.generation.stop_ids.empty()) {
    if (const auto eos = folder.tokenizer.eos_id()) options.generation.stop_ids.push_back(*eos);
  }
  const std::vector<std::int32_t> ids =
      llm::generate(folder.config, weights, prompt_ids, options.generation);
  const std::string text = folder.tokenizer.decode(ids, /*skip_special_tokens=*/true);
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
  app.add_option("--model", options.host.model, "Hugging Face model folder")->required();
  app.add_option("--prompt", options.prompt, "text to continue")->required();
  app.add_option("--max-new-tokens", options.generation.max_new_tokens, "default 64")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--temperature", options.generation.temperature, "0 (default): greedy")
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--top-p", options.generation.top_p, "nucleus sampling mass (default 1)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", options.generation.seed, "sampling seed (default 0)");
  strata::examples::add_host_model_options(app, options.host);
  app.add_flag("--json", options.json, "print one JSON object");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(options);
  } catch (const std::exception& error) {
    std::cerr << "strata-generate: error: " << error.what() << "\n";
    return 1;
  }
}
