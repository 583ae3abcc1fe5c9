// strata-eval: perplexity of a Hugging Face model folder on a text file (perplexity.hpp has the
// window rule).
//
//   strata-eval --model MODEL_DIR --data FILE --seq-len 512 [--json]
//
// Prints the token count, the mean next-token NLL (nats) and the perplexity; --json prints one
// object {"tokens", "mean_nll", "perplexity"} (plus "scored" and "windows"). --dump DIR writes
// what another implementation needs to check these figures: DIR/token_ids.json (the whole text's
// ids) and DIR/first_window_logits.f32 (the first window's logits, little-endian fp32,
// [min(seq_len, tokens) - 1 × vocab_size], row-major; scripts/gpu_export_check.py reads them).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "examples/llm/host_model.hpp"
#include "models/checkpoint/file_io.hpp"
#include "models/inference/perplexity.hpp"

namespace {

struct Options {
  strata::examples::HostModelOptions host;
  std::string data;
  std::uint32_t seq_len = 512;
  std::uint32_t batch = 4;
  bool json = false;
  std::string dump;
};

void write_dump(const std::filesystem::path& dir, const std::vector<std::int32_t>& tokens,
                const std::vector<float>& logits) {
  std::filesystem::create_directories(dir);
  const std::filesystem::path ids = dir / "token_ids.json";
  std::ofstream(ids) << nlohmann::json(tokens).dump() << "\n";
  const std::filesystem::path floats = dir / "first_window_logits.f32";
  std::ofstream out(floats, std::ios::binary);
  out.write(reinterpret_cast<const char*>(logits.data()),
            static_cast<std::streamsize>(logits.size() * sizeof(float)));
  if (!out) throw std::runtime_error("cannot write " + floats.string());
}

int run(const Options& options) {
  namespace llm = strata::llm;
  const strata::examples::ModelFolder folder = strata::examples::open_model_folder(options.host);
  const std::vector<std::int32_t> tokens =
      folder.tokenizer.encode(llm::read_text_file(options.data));
  const llm::HostWeights weights =
      strata::examples::load_host_weights(folder, options.host, "strata-eval");
  const llm::PerplexityResult result =
      llm::evaluate_perplexity(folder.config, weights, tokens, options.seq_len, options.batch,
                               !options.dump.empty());
  if (!options.dump.empty()) write_dump(options.dump, tokens, result.first_logits);
  if (options.json) {
    const nlohmann::json out = {{"tokens", result.tokens},
                                {"scored", result.scored},
                                {"windows", result.windows},
                                {"mean_nll", result.mean_nll},
                                {"perplexity", result.perplexity}};
    std::cout << out.dump() << "\n";
  } else {
    std::cout << fmt::format(
        "strata-eval: {} tokens, {} windows of {}, {} scored\nmean NLL {:.6f} nats, perplexity "
        "{:.4f}\n",
        result.tokens, result.windows, options.seq_len, result.scored, result.mean_nll,
        result.perplexity);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"strata-eval: perplexity of a Hugging Face model on a text file"};
  Options options;
  app.add_option("--model", options.host.model, "Hugging Face model folder")->required();
  app.add_option("--data", options.data, "text file (tokenized whole)")->required();
  app.add_option("--seq-len", options.seq_len, "tokens per window (default 512)")
      ->check(CLI::Range(2u, 1u << 20));
  app.add_option("--batch", options.batch, "windows per forward (default 4)")
      ->check(CLI::Range(1u, 4096u));
  strata::examples::add_host_model_options(app, options.host);
  app.add_flag("--json", options.json, "print one JSON object");
  app.add_option("--dump", options.dump,
                 "write DIR/token_ids.json and DIR/first_window_logits.f32 (for comparisons)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(options);
  } catch (const std::exception& error) {
    std::cerr << "strata-eval: error: " << error.what() << "\n";
    return 1;
  }
}
