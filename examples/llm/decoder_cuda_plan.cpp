// The CUDA decoder's device buffers, counted as decoder_cuda.cpp's allocate_buffers() allocates
// them (it asserts the two agree), so the memory plan charges the device for them up front.
#include <algorithm>

#include "examples/llm/decoder_impl.hpp"

namespace strata::llm::detail {

bool plans_tensor_core_attention(const HfConfig& config, const DecoderOptions& options) {
  const std::size_t head_dim = Dims(config).head_dim;
  const bool supported = head_dim % 8 == 0 && head_dim <= 128;  // flash_attention.hpp
  switch (options.cuda_attention) {
    case CudaAttention::kAuto:
      return supported && !options.cuda_fp32_products;
    case CudaAttention::kTensorCores:
      return true;
    case CudaAttention::kFp32:
      return false;
  }
  return false;
}

examples::DeviceBytes cuda_decoder_activation_bytes(const HfConfig& config,
                                                    const DecoderOptions& options,
                                                    bool tensor_core_attention) {
  const Dims dims(config);
  const std::size_t rows = std::size_t{options.micro_batch} * options.seq_len;
  const std::size_t d = dims.hidden;
  const std::size_t vocab = dims.vocab;
  const std::size_t lse = std::size_t{options.micro_batch} * dims.heads * options.seq_len;
  examples::DeviceBytes bytes;
  bytes.add<std::int32_t>(rows);  // inputs
  bytes.add<std::int32_t>(rows);  // targets
  bytes.add<float>(rows);         // loss weights
  bytes.add<std::uint32_t>(rows);  // row positions
  bytes.add<std::uint32_t>(rows);  // row first keys
  bytes.add<std::int32_t>(vocab + 1);
  bytes.add<std::int32_t>(rows);
  if (dims.gpt2) {
    bytes.add<std::int32_t>(std::size_t{config.max_position_embeddings} + 1);
    bytes.add<std::int32_t>(rows);
  }
  bytes.add<double>(rows);  // row losses
  for (std::size_t l = 0; l <= config.num_layers; ++l) bytes.add<float>(rows * d);  // residuals
  const std::size_t kept_layers = options.activation_checkpointing ? 1 : config.num_layers;
  for (std::size_t l = 0; l < kept_layers; ++l) {
    for (const std::size_t floats :
         {rows * d, rows, rows, rows * dims.qkv_width, lse, rows * dims.q_width, rows * d,
          rows * d, rows, rows, rows * dims.pre_width, rows * dims.inner}) {
      bytes.add<float>(floats);
    }
  }
  for (const std::size_t floats :
       {rows * d, rows, rows, rows * vocab, rows * vocab, rows * d, rows * d, rows * dims.q_width,
        rows * dims.qkv_width, rows * dims.pre_width, rows * dims.inner, lse}) {
    bytes.add<float>(floats);
  }
  if (config.tie_word_embeddings) bytes.add<float>(vocab * d);
  if (!dims.gpt2) {
    const RopeTable table(config, options.seq_len);
    bytes.add<float>(table.cos().size());
    bytes.add<float>(table.sin().size());
  }
  // The bf16 operands of the largest product, one buffer per side.
  const std::size_t widest =
      std::max({vocab, dims.pre_width, dims.qkv_width, dims.inner, dims.q_width, d});
  const std::size_t operand = std::max(rows * widest, widest * std::max(d, dims.q_width));
  bytes.add<std::uint16_t>(operand);
  bytes.add<std::uint16_t>(operand);
  if (tensor_core_attention) {
    // q, k, v and dout rounded to bf16 (flash_attention_scratch_elements).
    bytes.add<std::uint16_t>(rows * 2 * (dims.heads + dims.kv_heads) * dims.head_dim);
  }
  return bytes;
}

}  // namespace strata::llm::detail
