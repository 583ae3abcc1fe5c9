// The tiny fine-tuning run the strata_finetune tests share: two layers of width 32, 4 sequences of
// 32 tokens, the host device, AdamW at lr 3e-3, NVMe under the test's scratch directory.
#pragma once

#include <string>
#include <string_view>

#include "runtime/config/config.hpp"
#include "tests/io/io_test_support.hpp"

namespace strata::examples::testing {

// `more_toml` goes on inside the [optimizer] table (more optimizer keys, then any other tables).
inline runtime::Config tiny_finetune_config(const io::testing::ScratchDir& dir,
                                            std::string_view more_toml = {}) {
  runtime::Config config = runtime::parse_config(std::string(R"(
[model]
layers = 2
d_model = 32
heads = 2
seq_len = 32
micro_batch = 4
[tiers.device]
kind = "host"
budget = "256MiB"
[tiers.host]
budget = "64MiB"
[zero]
sub_group_size = 4096
[optimizer]
lr = 3e-3
)") + std::string(more_toml));
  config.tiers.nvme.paths = {dir.path().string()};
  return config;
}

}  // namespace strata::examples::testing
