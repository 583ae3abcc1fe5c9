// strata-gpt-bench: forward + backward time per micro-batch of the GPT on the host, with the
// matrix-product rate that bounds it. Parameters come from ParameterStore; no Engine, no I/O.
//
//   strata-gpt-bench [--config examples/configs/default.toml] [--threads 2] [--steps 5]
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <vector>

#include "models/gpt/gpt_model.hpp"
#include "models/gpt/kernels.hpp"
#include "models/gpt/parameter_store.hpp"
#include "runtime/config/config.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU seconds of every thread of the process: on a shared machine, where wall time includes time
// spent waiting for a core, CPU time per step shows the work itself.
double process_cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

// Matrix-product rate of OpenBLAS at the model's largest shape (rows × d · d × 4d).
double measure_gemm_gflops(std::size_t rows, std::size_t d) {
  std::vector<float> a(rows * d, 0.5f), b(d * 4 * d, 0.25f), c(rows * 4 * d);
  using strata::gpt::detail::Transpose;
  strata::gpt::detail::gemm(Transpose::kNo, Transpose::kNo, rows, 4 * d, d, 1.0f, a.data(), d,
                            b.data(), 4 * d, 0.0f, c.data(), 4 * d);
  constexpr int kRepeats = 10;
  const Clock::time_point start = Clock::now();
  for (int i = 0; i < kRepeats; ++i) {
    strata::gpt::detail::gemm(Transpose::kNo, Transpose::kNo, rows, 4 * d, d, 1.0f, a.data(), d,
                              b.data(), 4 * d, 0.0f, c.data(), 4 * d);
  }
  return 2.0 * static_cast<double>(rows * d * 4 * d) * kRepeats / seconds_since(start) / 1e9;
}

// The best forward and forward + backward seconds over the timed steps, and their sums.
struct StepTimes {
  double forward_best = 1e30;
  double step_best = 1e30;
  double step_total = 0.0;
  double step_cpu_total = 0.0;
};

// `steps` rounds of one forward pass, then one forward + backward step, each timed.
StepTimes time_steps(strata::gpt::GptModel& model, const strata::gpt::ParameterStore& params,
                     strata::gpt::ParameterStore& grads, const std::vector<std::int32_t>& tokens,
                     std::uint32_t steps) {
  StepTimes t;
  for (std::uint32_t step = 0; step < steps; ++step) {
    Clock::time_point start = Clock::now();
    strata::gpt::forward_loss(model, params, tokens);
    t.forward_best = std::min(t.forward_best, seconds_since(start));
    start = Clock::now();
    const double cpu_start = process_cpu_seconds();
    strata::gpt::forward_backward(model, params, grads, tokens);
    const double step_seconds = seconds_since(start);
    t.step_cpu_total += process_cpu_seconds() - cpu_start;
    t.step_best = std::min(t.step_best, step_seconds);
    t.step_total += step_seconds;
  }
  return t;
}

// The step times, the model's flop rate and the sgemm rate that bounds it.
void print_rates(const strata::runtime::ModelConfig& model_config, std::size_t rows,
                 std::uint32_t steps, const StepTimes& t) {
  const double step_mean = t.step_total / steps;
  // Matrix products: 6 flops per parameter per token (2 forward, 4 backward), embeddings aside,
  // plus attention's 4 products of seq × seq × head_dim per head forward, 8 backward (full
  // square: the causal half is computed, then masked).
  const double d = model_config.d_model;
  const double matrix_params = model_config.layers * 12.0 * d * d + model_config.vocab * d;
  const double attention_flops = model_config.layers * 12.0 * rows * model_config.seq_len * d;
  const double flops = 6.0 * matrix_params * rows + attention_flops;
  const double gemm_gflops = measure_gemm_gflops(rows, model_config.d_model);
  fmt::print("forward:            {:8.1f} ms (best of {})\n", t.forward_best * 1e3, steps);
  fmt::print("forward + backward: {:8.1f} ms best, {:.1f} ms mean\n", t.step_best * 1e3,
             step_mean * 1e3);
  fmt::print("CPU time per step:  {:8.1f} ms (all threads; includes OpenBLAS spin-waits)\n",
             t.step_cpu_total / steps * 1e3);
  fmt::print("tokens/s:           {:8.0f} (best step)\n", static_cast<double>(rows) / t.step_best);
  fmt::print("model GFLOP/s:      {:8.1f} ({:.1f} GFLOP per step)\n", flops / t.step_best / 1e9,
             flops / 1e9);
  fmt::print("bound: sgemm {}x{}x{}: {:.1f} GFLOP/s -> {:.1f} ms per step at that rate\n", rows,
             4 * model_config.d_model, model_config.d_model, gemm_gflops,
             flops / gemm_gflops / 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GPT forward + backward throughput on the host (fp32, OpenBLAS)"};
  std::string config_path;
  std::uint32_t threads = 2;
  std::uint32_t steps = 5;
  strata::runtime::ModelConfig model_config;
  model_config.layers = 8;
  model_config.d_model = 512;
  model_config.heads = 8;
  model_config.seq_len = 128;
  model_config.micro_batch = 8;
  app.add_option("--config", config_path, "TOML config whose [model] to use");
  app.add_option("--threads", threads, "OpenBLAS threads (0: all hardware threads)");
  app.add_option("--steps", steps, "timed steps (after one warm-up step)")
      ->check(CLI::PositiveNumber);
  app.add_option("--layers", model_config.layers);
  app.add_option("--d-model", model_config.d_model);
  app.add_option("--heads", model_config.heads);
  app.add_option("--seq-len", model_config.seq_len);
  app.add_option("--micro-batch", model_config.micro_batch);
  app.add_flag("!--untied", model_config.tied_head, "separate lm_head.weight");
  CLI11_PARSE(app, argc, argv);
  if (!config_path.empty()) {
    model_config = strata::runtime::load_config(config_path).model;
  }

  strata::gpt::set_blas_threads(threads);
  strata::gpt::GptModel model(model_config);
  const strata::gpt::ParameterStore params =
      strata::gpt::ParameterStore::initialized(model.units(), 1234);
  strata::gpt::ParameterStore grads(model.units());
  std::vector<std::int32_t> tokens(model.batch_tokens());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>((i * 2654435761u) % model_config.vocab);
  }

  const std::size_t rows = std::size_t{model_config.micro_batch} * model_config.seq_len;
  fmt::print(
      "model: {} layers, d_model {}, heads {}, seq_len {}, vocab {}, micro_batch {}, {} head\n",
      model_config.layers, model_config.d_model, model_config.heads, model_config.seq_len,
      model_config.vocab, model_config.micro_batch, model_config.tied_head ? "tied" : "untied");
  fmt::print(
      "parameters: {:.2f} M, tokens per step: {}, activations: {:.0f} MiB, OpenBLAS threads: {}\n",
      static_cast<double>(model.parameter_count()) / 1e6, rows,
      static_cast<double>(model.activation_bytes()) / (1 << 20), strata::gpt::blas_threads());

  strata::gpt::forward_backward(model, params, grads, tokens);  // warm-up: page in activations
  const StepTimes times = time_steps(model, params, grads, tokens, steps);
  print_rates(model_config, rows, steps, times);
  return 0;
}
