// The `strata` program's subcommands. Each lives in its own file and registers itself on the parent
// CLI11 app; a failing command throws CLI::RuntimeError with its exit code (2: bad input).
#pragma once

#include <CLI/CLI.hpp>

namespace strata::cli {

inline constexpr int kExitBadInput = 2;
inline constexpr int kExitDoesNotFit = 3;

void add_plan_command(CLI::App& app);
void add_bench_device_command(CLI::App& bench);
void add_bench_step_command(CLI::App& bench);
void add_bench_comm_command(CLI::App& bench);
void add_bench_io_command(CLI::App& bench);
void add_bench_adam_command(CLI::App& bench);

}  // namespace strata::cli
