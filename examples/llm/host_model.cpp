#include "examples/llm/host_model.hpp"

#include <filesystem>
#include <iostream>

#include "models/decoder/decoder_model.hpp"

namespace strata::examples {

void add_host_model_options(CLI::App& app, HostModelOptions& options) {
  app.add_option("--blas-threads", options.blas_threads, "OpenBLAS threads (0: all cores)");
  app.add_option("--resident-budget", options.resident_budget,
                 "host memory for weights kept resident (auto: 3/4 of RAM; e.g. 12GiB; 0: "
                 "stream every unit from the folder on every pass)");
}

ModelFolder open_model_folder(const HostModelOptions& options) {
  llm::set_blas_threads(options.blas_threads);
  return ModelFolder{llm::read_hf_config(std::filesystem::path(options.model) / "config.json"),
                     llm::Tokenizer::load(options.model)};
}

llm::HostWeights load_host_weights(const ModelFolder& folder, const HostModelOptions& options,
                                   std::string_view program) {
  llm::HostWeights weights =
      llm::HostWeights::load(options.model, llm::decoder_units(folder.config),
                             llm::parse_resident_budget(options.resident_budget));
  if (const std::string note = llm::describe_residency(weights, options.model); !note.empty()) {
    std::cerr << program << ": " << note << "\n";
  }
  return weights;
}

}  // namespace strata::examples
