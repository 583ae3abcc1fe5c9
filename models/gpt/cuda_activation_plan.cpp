// The CUDA GPT's device buffers, counted as gpt_cuda.cpp's constructor allocates them (it asserts
// the two agree).
#include "models/gpt/gpt_cuda.hpp"

namespace strata::gpt::detail {

examples::DeviceBytes cuda_gpt_activation_bytes(const runtime::ModelConfig& config) {
  const std::size_t rows = std::size_t{config.micro_batch} * config.seq_len;
  const std::size_t d = config.d_model;
  const std::size_t prob =
      std::size_t{config.micro_batch} * config.heads * config.seq_len * config.seq_len;
  examples::DeviceBytes bytes;
  bytes.add<std::int32_t>(rows);                                // inputs
  bytes.add<std::int32_t>(rows);                                // targets
  bytes.add<std::int32_t>(std::size_t{config.vocab} + 1);       // token offsets
  bytes.add<std::int32_t>(rows);                                // token rows
  bytes.add<double>(rows);                                      // row losses
  for (std::size_t l = 0; l <= config.layers; ++l) bytes.add<float>(rows * d);  // residuals
  for (std::size_t l = 0; l < config.layers; ++l) {
    for (const std::size_t floats :
         {rows * d, rows, rows, rows * 3 * d, prob, rows * d, rows * d, rows * d, rows, rows,
          rows * 4 * d, rows * 4 * d, rows * 4 * d}) {
      bytes.add<float>(floats);
    }
  }
  for (const std::size_t floats :
       {rows * d, rows, rows, rows * config.vocab, rows * config.vocab, rows * d, rows * d,
        rows * d, rows * 3 * d, rows * 4 * d, prob}) {
    bytes.add<float>(floats);
  }
  if (config.tied_head) bytes.add<float>(std::size_t{config.vocab} * d);
  return bytes;
}

}  // namespace strata::gpt::detail
