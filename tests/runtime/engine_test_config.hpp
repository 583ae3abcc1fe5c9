// The base setup of the Engine tests: the single-process tests' config (64 MiB budgets, ZeRO-3,
// clipped AdamW, NVMe under one path) and TinyMlp widths, and the host device they all run on.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/config/config.hpp"
#include "tiers/device/device.hpp"

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

// The host device (no GPU needed) with the config's device budget.
inline std::unique_ptr<tiers::Device> host_device(const Config& config) {
  tiers::DeviceOptions options;
  options.kind = tiers::DeviceKind::kHost;
  options.budget_bytes = config.tiers.device.budget_bytes;
  return tiers::make_device(options);
}

}  // namespace strata::runtime::testing
