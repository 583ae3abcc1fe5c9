// `strata`: plan a run's memory, and measure what the hardware can do (`strata bench ...`).
#include <exception>
#include <iostream>

#include "runtime/cli/commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"strata: ZeRO-3 training with state offloaded to host memory and NVMe"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "strata 0.1.0");

  strata::cli::add_plan_command(app);
  strata::cli::add_tune_command(app);

  CLI::App* bench = app.add_subcommand("bench", "throughput benchmarks (print figures and bounds)");
  bench->require_subcommand(1);
  strata::cli::add_bench_device_command(*bench);
  strata::cli::add_bench_step_command(*bench);
  strata::cli::add_bench_comm_command(*bench);
  strata::cli::add_bench_io_command(*bench);
  strata::cli::add_bench_adam_command(*bench);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  } catch (const std::exception& error) {
    std::cerr << "strata: error: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
