// strata-llm-bench: training throughput (forward + backward, tokens/s) of the Hugging Face decoder
// on the host in fp32, for a config.json. No Engine, no optimizer, no I/O: the model alone, so
// scripts/bench-llm-vs-torch.sh can put it beside PyTorch running the same model.
//
//   strata-llm-bench --config config.json [--threads 2] [--batch 4] [--seq-len 256] [--steps 3]
#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <oneapi/tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <exception>
#include <iostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "models/decoder/decoder_model.hpp"
#include "models/decoder/hf_config.hpp"
#include "runtime/engine/param_init.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using strata::llm::DecoderModel;
using strata::llm::UnitSpec;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Every unit's parameters, initialised as the Engine would (runtime::init_tensor_range).
std::vector<std::vector<float>> initial_parameters(const std::vector<UnitSpec>& units) {
  std::vector<std::vector<float>> values;
  for (const UnitSpec& unit : units) {
    std::vector<float>& flat = values.emplace_back(unit.numel);
    const strata::runtime::UnitSpec engine = strata::llm::engine_unit(unit);
    for (std::size_t t = 0; t < unit.tensors.size(); ++t) {
      strata::runtime::init_tensor_range(
          1234, unit.name, engine.tensors[t], 0,
          std::span(flat).subspan(unit.tensors[t].offset, unit.tensors[t].numel()));
    }
  }
  return values;
}

int run(const std::string& config_path, std::uint32_t threads, std::uint32_t steps,
        const strata::llm::DecoderOptions& options) {
  strata::llm::set_blas_threads(threads);
  const tbb::global_control tbb_threads(tbb::global_control::max_allowed_parallelism, threads);
  const strata::llm::HfConfig config = strata::llm::read_hf_config(config_path);
  DecoderModel model(config, options);
  const auto params = initial_parameters(model.units());
  std::vector<std::vector<float>> grads;
  for (const UnitSpec& unit : model.units()) grads.emplace_back(unit.numel);
  const std::size_t sequence_tokens = options.seq_len + 1;
  std::vector<std::int32_t> tokens(options.micro_batch * sequence_tokens);
  std::mt19937 rng(1);
  for (std::int32_t& token : tokens) token = static_cast<std::int32_t>(rng() % config.vocab_size);

  std::vector<std::vector<std::span<const float>>> views;
  std::vector<std::vector<std::span<float>>> grad_views;
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    views.push_back(strata::llm::split_unit(model.units()[u], std::span<const float>(params[u])));
    grad_views.push_back(strata::llm::split_unit(model.units()[u], std::span<float>(grads[u])));
  }
  const auto shared = [&](std::size_t u) {
    return model.units()[u].reads_embedding ? std::span<const std::span<const float>>(views[0])
                                            : std::span<const std::span<const float>>();
  };
  const auto step = [&] {
    model.set_batch(tokens);
    for (std::size_t u = 0; u < model.unit_count(); ++u) model.forward_unit(u, views[u], shared(u));
    const double loss = model.loss();
    for (std::size_t u = model.unit_count(); u-- > 0;) {
      model.backward_unit(u, views[u], grad_views[u], shared(u));
    }
    return loss;
  };

  const std::size_t rows = std::size_t{options.micro_batch} * options.seq_len;
  fmt::print("model: {} ({}), {} layers, hidden {}, heads {}/{} kv, inner {}, vocab {}, {} head\n",
             config.architecture, config_path, config.num_layers, config.hidden_size,
             config.num_heads, config.num_kv_heads, config.intermediate_size, config.vocab_size,
             config.tie_word_embeddings ? "tied" : "untied");
  fmt::print("parameters: {:.1f} M, batch {} x seq {} = {} tokens/step, activations {:.0f} MiB, "
             "{} threads\n",
             static_cast<double>(model.parameter_count()) / 1e6, options.micro_batch,
             options.seq_len, rows, static_cast<double>(model.activation_bytes()) / (1 << 20),
             threads);
  const double first_loss = step();  // warm-up: pages in the activations
  double best = 1e30;
  double total = 0.0;
  for (std::uint32_t i = 0; i < steps; ++i) {
    const Clock::time_point start = Clock::now();
    step();
    const double seconds = seconds_since(start);
    best = std::min(best, seconds);
    total += seconds;
  }
  fmt::print("loss at init: {:.4f}\n", first_loss);
  fmt::print("forward + backward: {:.1f} ms best, {:.1f} ms mean over {} steps\n", best * 1e3,
             total / steps * 1e3, steps);
  fmt::print("tokens_per_s: {:.1f}\n", static_cast<double>(rows) / best);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Decoder forward + backward throughput on the host (fp32, OpenBLAS)"};
  std::string config_path;
  std::uint32_t threads = 2;
  std::uint32_t steps = 3;
  strata::llm::DecoderOptions options;
  options.seq_len = 256;
  options.micro_batch = 4;
  app.add_option("--config", config_path, "the model's config.json")->required();
  app.add_option("--threads", threads, "OpenBLAS and oneTBB threads")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed steps (after one warm-up step)")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", options.micro_batch, "sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--seq-len", options.seq_len, "tokens per sequence")->check(CLI::PositiveNumber);
  app.add_flag("--checkpointing", options.activation_checkpointing, "activation checkpointing");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(config_path, threads, steps, options);
  } catch (const std::exception& error) {
    std::cerr << "strata-llm-bench: error: " << error.what() << "\n";
    return 1;
  }
}
