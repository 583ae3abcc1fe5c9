// The `strata` program's subcommands. Each lives in its own file and registers itself on the parent
// CLI11 app; a failing command throws CLI::RuntimeError with its exit code (2: bad input).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

#include "runtime/config/config.hpp"

namespace strata::cli {

inline constexpr int kExitBadInput = 2;
inline constexpr int kExitDoesNotFit = 3;

// The config at `path`; on a bad one prints "<command>: bad config: <why>" to stderr and returns
// nullopt (the caller exits with kExitBadInput).
std::optional<runtime::Config> load_config_or_report(const std::string& path,
                                                     std::string_view command);

// A whole count written as a number ("7.5e9", "1000000") between 1 and `max`; nullopt otherwise.
std::optional<std::uint64_t> parse_whole_count(const std::string& text, double max);

// [model] from a Hugging Face folder's config.json (models/decoder), described for the output; on a
// bad folder prints "<command>: --model: <why>" and returns false.
bool apply_hf_model(const std::string& model_dir, runtime::Config& config,
                    nlohmann::json& described, std::string_view command);

void add_plan_command(CLI::App& app);
void add_tune_command(CLI::App& app);
void add_bench_device_command(CLI::App& bench);
void add_bench_step_command(CLI::App& bench);
void add_bench_comm_command(CLI::App& bench);
void add_bench_io_command(CLI::App& bench);
void add_bench_adam_command(CLI::App& bench);

}  // namespace strata::cli
