// strata-make-tiny-model: writes a tiny random Hugging Face model folder (config.json,
// tokenizer.json, safetensors) to try the fine-tuning programs without a download.
//
//   strata-make-tiny-model --family llama --out /tmp/tiny-llama
#include <iostream>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "models/decoder/decoder_model.hpp"
#include "models/checkpoint/tiny_model.hpp"

int main(int argc, char** argv) {
  namespace llm = strata::llm;
  CLI::App app{"strata-make-tiny-model: a tiny random Hugging Face model folder"};
  std::string out;
  std::string family = "llama";
  std::string dtype = "bf16";
  llm::TinyModelOptions options;
  // Long enough for the sequence lengths people train at (the library's default, 256, keeps the
  // tests' folders small; a GPT-2 folder's position table grows with it).
  options.max_positions = 2048;
  app.add_option("--out", out, "folder to write")->required();
  app.add_option("--family", family, "llama (default), qwen2, mistral or gpt2")
      ->check(CLI::IsMember({"llama", "qwen2", "mistral", "gpt2"}));
  app.add_option("--hidden-size", options.hidden_size, "default 32")->check(CLI::Range(8u, 8192u));
  app.add_option("--intermediate-size", options.intermediate_size, "default 64")
      ->check(CLI::Range(8u, 32768u));
  app.add_option("--layers", options.layers, "default 2")->check(CLI::Range(1u, 256u));
  app.add_option("--heads", options.heads, "default 4")->check(CLI::Range(1u, 256u));
  app.add_option("--kv-heads", options.kv_heads, "default 2")->check(CLI::Range(1u, 256u));
  app.add_option("--max-positions", options.max_positions,
                 "max_position_embeddings (GPT-2: n_positions), the longest --seq-len the folder "
                 "trains at; default 2048")
      ->check(CLI::Range(2u, 1u << 20));
  app.add_option("--dtype", dtype, "bf16 (default), fp16 or fp32")
      ->check(CLI::IsMember({"bf16", "fp16", "fp32"}));
  app.add_option("--seed", options.seed, "default 1");
  CLI11_PARSE(app, argc, argv);
  options.family = family == "qwen2"     ? llm::Family::kQwen2
                   : family == "mistral" ? llm::Family::kMistral
                   : family == "gpt2"    ? llm::Family::kGpt2
                                         : llm::Family::kLlama;
  options.dtype = dtype == "fp32"   ? strata::DType::kFp32
                  : dtype == "fp16" ? strata::DType::kFp16
                                    : strata::DType::kBf16;
  try {
    llm::write_tiny_model(out, options);
    const llm::HfConfig config = llm::read_hf_config(std::filesystem::path(out) / "config.json");
    std::cout << fmt::format("wrote {} ({} {}, {} parameters)\n", out, config.architecture,
                             dtype, config.parameter_count());
  } catch (const std::exception& error) {
    std::cerr << "strata-make-tiny-model: error: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
