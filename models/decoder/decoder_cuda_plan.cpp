// The CUDA decoder's device buffers, counted as decoder_cuda_base.cpp and each path's
// allocate_buffers() (decoder_cuda.cpp, decoder_cuda_bf16.cpp) allocate them (each asserts the
// two agree), so the memory plan charges the device for them up front.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "models/decoder/decoder_impl.hpp"

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

examples::DeviceBytes cuda_decoder_base_bytes(const HfConfig& config,
                                              const DecoderOptions& options) {
  const Dims dims(config);
  const std::size_t rows = std::size_t{options.micro_batch} * options.seq_len;
  const std::size_t d = dims.hidden;
  examples::DeviceBytes bytes;
  bytes.add<std::int32_t>(rows);   // inputs
  bytes.add<std::int32_t>(rows);   // targets
  bytes.add<float>(rows);          // loss weights
  bytes.add<std::uint32_t>(rows);  // row positions
  bytes.add<std::uint32_t>(rows);  // row first keys
  bytes.add<std::int32_t>(dims.vocab + 1);
  bytes.add<std::int32_t>(rows);
  if (dims.gpt2) {
    bytes.add<std::int32_t>(std::size_t{config.max_position_embeddings} + 1);
    bytes.add<std::int32_t>(rows);
  }
  bytes.add<double>(rows);                                                          // row losses
  for (std::size_t l = 0; l <= config.num_layers; ++l) bytes.add<float>(rows * d);  // residuals
  bytes.add<float>(rows * d);                                                       // d_resid
  if (config.tie_word_embeddings) bytes.add<float>(dims.vocab * d);
  if (!dims.gpt2) {
    const RopeTable table(config, options.seq_len);
    bytes.add<float>(table.cos().size());
    bytes.add<float>(table.sin().size());
  }
  return bytes;
}

std::size_t cuda_loss_chunk_rows(const HfConfig& config, const DecoderOptions& options) {
  const std::size_t rows = std::size_t{options.micro_batch} * options.seq_len;
  if (options.cuda_loss_chunk_rows != 0) {
    return std::min<std::size_t>(options.cuda_loss_chunk_rows, rows);
  }
  constexpr std::size_t kChunkLogits = std::size_t{1} << 26;  // 256 MiB of fp32 logits
  std::size_t chunk = std::max<std::size_t>(1, kChunkLogits / Dims(config).vocab);
  if (chunk >= 64) chunk -= chunk % 64;  // whole tiles of the head's products
  return std::min(chunk, rows);
}

std::size_t cuda_weight_cache_elements(const HfConfig& config) {
  const Dims dims(config);
  const std::size_t layer =
      dims.hidden * (dims.qkv_width + dims.q_width + dims.pre_width + dims.inner) + dims.qkv_width +
      dims.pre_width;
  return std::max(layer, dims.vocab * dims.hidden);
}

std::size_t cuda_gemm_workspace_bytes(const HfConfig& config, const DecoderOptions& options) {
  const Dims dims(config);
  const std::size_t rows = std::size_t{options.micro_batch} * options.seq_len;
  const std::size_t widest = std::max({dims.pre_width, dims.qkv_width, dims.hidden});
  constexpr std::size_t kMost = std::size_t{32} << 20;  // LtGemm::kWorkspaceBytes
  return std::min(kMost, round_up(rows * widest * sizeof(float), std::size_t{256}));
}

namespace {

// decoder_cuda.cpp's CudaDecoderFp32::allocate_buffers.
examples::DeviceBytes fp32_path_bytes(const HfConfig& config, const DecoderOptions& options,
                                      bool tensor_core_attention) {
  const Dims dims(config);
  const std::size_t rows = std::size_t{options.micro_batch} * options.seq_len;
  const std::size_t d = dims.hidden;
  const std::size_t vocab = dims.vocab;
  const std::size_t lse = std::size_t{options.micro_batch} * dims.heads * options.seq_len;
  examples::DeviceBytes bytes;
  const std::size_t kept_layers = options.activation_checkpointing ? 1 : config.num_layers;
  for (std::size_t l = 0; l < kept_layers; ++l) {
    for (const std::size_t floats :
         {rows * d, rows, rows, rows * dims.qkv_width, lse, rows * dims.q_width, rows * d, rows * d,
          rows, rows, rows * dims.pre_width, rows * dims.inner}) {
      bytes.add<float>(floats);
    }
  }
  for (const std::size_t floats :
       {rows * d, rows, rows, rows * vocab, rows * vocab, rows * d, rows * dims.q_width,
        rows * dims.qkv_width, rows * dims.pre_width, rows * dims.inner, lse}) {
    bytes.add<float>(floats);
  }
  if (tensor_core_attention) {
    // q, k, v and dout rounded to bf16 (flash_attention_scratch_elements).
    bytes.add<std::uint16_t>(rows * 2 * (dims.heads + dims.kv_heads) * dims.head_dim);
  }
  return bytes;
}

// decoder_cuda_bf16.cpp's CudaDecoderBf16::allocate_buffers.
examples::DeviceBytes bf16_path_bytes(const HfConfig& config, const DecoderOptions& options,
                                      bool tensor_core_attention) {
  const Dims dims(config);
  const std::size_t rows = std::size_t{options.micro_batch} * options.seq_len;
  const std::size_t d = dims.hidden;
  const std::size_t lse = std::size_t{options.micro_batch} * dims.heads * options.seq_len;
  const std::size_t chunk = cuda_loss_chunk_rows(config, options);
  examples::DeviceBytes bytes;
  const std::size_t kept_layers = options.activation_checkpointing ? 1 : config.num_layers;
  for (std::size_t l = 0; l < kept_layers; ++l) {
    bytes.add<std::uint16_t>(rows * d);  // norm1
    bytes.add<float>(rows);              // norm1 mean
    bytes.add<float>(rows);              // norm1 rstd
    bytes.add<std::uint16_t>(rows * dims.qkv_width);
    bytes.add<float>(lse);
    bytes.add<std::uint16_t>(rows * dims.q_width);  // attention output
    bytes.add<float>(rows * d);                     // mid: residual stream after attention
    bytes.add<std::uint16_t>(rows * d);             // norm2
    bytes.add<float>(rows);
    bytes.add<float>(rows);
    bytes.add<std::uint16_t>(rows * dims.pre_width);
    bytes.add<std::uint16_t>(rows * dims.inner);
  }
  bytes.add<std::uint16_t>(rows * d);               // head norm
  bytes.add<float>(rows);                           // head mean
  bytes.add<float>(rows);                           // head rstd
  bytes.add<float>(rows);                           // head log-sum-exp
  bytes.add<float>(chunk * dims.vocab);             // logits of one chunk
  bytes.add<std::uint16_t>(chunk * dims.vocab);     // dlogits of one chunk
  bytes.add<std::uint16_t>(rows * d);               // d_resid rounded
  bytes.add<float>(rows * d);                       // d_norm
  bytes.add<std::uint16_t>(rows * dims.q_width);    // d_att
  bytes.add<float>(rows * dims.qkv_width);          // d_qkv
  bytes.add<std::uint16_t>(rows * dims.qkv_width);  // d_qkv rounded
  bytes.add<std::uint16_t>(rows * dims.pre_width);  // d_pre
  bytes.add<std::uint16_t>(rows * dims.inner);      // d_act
  bytes.add<float>(lse);                            // delta
  if (!tensor_core_attention) {
    bytes.add<float>(rows * dims.qkv_width);  // q | k | v widened
    bytes.add<float>(rows * dims.q_width);    // the fp32 attention's output
    bytes.add<float>(rows * dims.q_width);    // d_att widened
  }
  bytes.add<std::uint16_t>(cuda_weight_cache_elements(config));
  bytes.add<std::byte>(cuda_gemm_workspace_bytes(config, options));
  return bytes;
}

}  // namespace

examples::DeviceBytes cuda_decoder_activation_bytes(const HfConfig& config,
                                                    const DecoderOptions& options,
                                                    bool tensor_core_attention) {
  examples::DeviceBytes bytes = cuda_decoder_base_bytes(config, options);
  bytes += options.cuda_fp32_products ? fp32_path_bytes(config, options, tensor_core_attention)
                                      : bf16_path_bytes(config, options, tensor_core_attention);
  return bytes;
}

}  // namespace strata::llm::detail
