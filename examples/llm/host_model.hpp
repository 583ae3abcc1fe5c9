// The set-up strata-eval and strata-generate share: the command-line options that name a Hugging
// Face model folder and how its weights are held, then the folder's config.json and tokenizer, then
// its weights in host memory (HostWeights: units resident within --resident-budget, the rest
// streamed from the folder on every pass).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "models/checkpoint/host_weights.hpp"
#include "models/decoder/hf_config.hpp"
#include "models/tokenizer/tokenizer.hpp"

namespace strata::examples {

struct HostModelOptions {
  std::string model;  // the folder: config.json, tokenizer, safetensors
  std::uint32_t blas_threads = 0;
  std::string resident_budget = "auto";
};

// --blas-threads and --resident-budget (each program adds --model where its help lists it).
void add_host_model_options(CLI::App& app, HostModelOptions& options);

struct ModelFolder {
  llm::HfConfig config;
  llm::Tokenizer tokenizer;
};

// Sets the OpenBLAS threads, then reads the folder's config.json and tokenizer.
ModelFolder open_model_folder(const HostModelOptions& options);

// The folder's weights within the resident budget; when some units are streamed, says so on
// stderr as "<program>: <note>".
llm::HostWeights load_host_weights(const ModelFolder& folder, const HostModelOptions& options,
                                   std::string_view program);

}  // namespace strata::examples
