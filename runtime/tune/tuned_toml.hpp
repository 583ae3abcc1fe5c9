// A Config written back as TOML that load_config() reads to the same Config: every key of
// docs/config.md, grouped by section, with a comment beside each key that has one (why `strata
// tune` chose it). Keys that the reader refuses with their defaults (lr_decay_steps and min_lr
// under schedule = "constant") are written as comments.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "runtime/config/config.hpp"

namespace strata::runtime::tune {

struct TomlComments {
  std::vector<std::string> header;  // lines at the top, each written as "# line"
  // Per key, by its full path ("tiers.nvme.block_size"): the comment written after the value.
  std::vector<std::pair<std::string, std::string>> keys;
};

std::string render_config_toml(const Config& config, const TomlComments& comments = {});

}  // namespace strata::runtime::tune
