// The base setup of the single-process Engine tests (engine, checkpoint, fault, crash): a host
// device with 64 MiB budgets, ZeRO-3, clipped AdamW, NVMe under one path, and the TinyMlp widths.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/config.hpp"

namespace strata::runtime::testing {

inline const std::vector<std::uint32_t> kEngineTestWidths = {24, 72, 40, 8};  // uneven unit sizes

inline Config engine_test_config(const std::string& nvme_path) {
  Config config = parse_config(R"(
[tiers.device]
kind = "host"
budget = "64MiB"
[tiers.host]
budget = "64MiB"
[zero]
stage = 3
sub_group_size = 2048
[optimizer]
type = "adamw"
lr = 1e-2
weight_decay = 0.01
grad_clip = 0.5
)");
  config.tiers.nvme.paths = {nvme_path};
  return config;
}

}  // namespace strata::runtime::testing
