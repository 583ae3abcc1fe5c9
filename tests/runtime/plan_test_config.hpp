// The config the plan tests start from: budgets no test model outgrows, one NVMe path, and
// everything else at its default (the host device, params and grads on it, optimizer on the host).
#pragma once

#include "runtime/config/config.hpp"

namespace strata::runtime::testing {

inline Config roomy_plan_config() {
  return parse_config(R"(
[tiers.device]
budget = "1TiB"
[tiers.host]
budget = "1TiB"
[tiers.nvme]
paths = ["/mnt/nvme"]
budget = "16TiB"
)");
}

}  // namespace strata::runtime::testing
