// Proves the CUDA decoder's memory plan without a GPU (decoder_cuda_plan.cpp): the bf16 path's
// loss chunks follow the option or hold about 2^26 logits in whole 64-row tiles, and on the
// 1.08 B Llama (and the same with a 128 k vocabulary) the bf16 path plans less device memory
// than the fp32 reference, its logits never [rows × vocab] whole.
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <string>

#include "models/decoder/decoder_cuda.hpp"
#include "models/decoder/hf_config.hpp"

namespace strata::llm {
namespace {

// The 1.08 B Llama of docs/benchmarks.md: hidden 2048, 24 layers, 16 / 4 heads, inner 5632.
std::string llama_1b_json(std::uint32_t vocab) {
  return R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
    "intermediate_size": 5632, "num_hidden_layers": 24, "num_attention_heads": 16,
    "num_key_value_heads": 4, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "vocab_size": )" +
         std::to_string(vocab) + R"(, "max_position_embeddings": 2048,
    "tie_word_embeddings": false, "hidden_act": "silu", "torch_dtype": "bfloat16",
    "bos_token_id": 1, "eos_token_id": 2})";
}

DecoderOptions step_options() {
  DecoderOptions options;
  options.seq_len = 1024;
  options.micro_batch = 8;
  return options;
}

TEST(DecoderCudaPlan, LossChunksFollowTheOptionOrHoldAbout64MiLogits) {
  DecoderOptions options = step_options();
  EXPECT_EQ(detail::cuda_loss_chunk_rows(parse_hf_config(llama_1b_json(32000)), options), 2048u);
  EXPECT_EQ(detail::cuda_loss_chunk_rows(parse_hf_config(llama_1b_json(128256)), options), 512u);
  EXPECT_EQ(detail::cuda_loss_chunk_rows(parse_hf_config(llama_1b_json(64)), options), 8192u);
  options.cuda_loss_chunk_rows = 100;
  EXPECT_EQ(detail::cuda_loss_chunk_rows(parse_hf_config(llama_1b_json(32000)), options), 100u);
  options.cuda_loss_chunk_rows = 100000;  // capped at the batch's rows
  EXPECT_EQ(detail::cuda_loss_chunk_rows(parse_hf_config(llama_1b_json(32000)), options), 8192u);
}

TEST(DecoderCudaPlan, Bf16PathPlansLessThanTheFp32Reference) {
  for (const std::uint32_t vocab : {32000u, 128256u}) {
    const HfConfig config = parse_hf_config(llama_1b_json(vocab));
    DecoderOptions bf16 = step_options();
    DecoderOptions fp32 = bf16;
    fp32.cuda_fp32_products = true;
    const std::uint64_t bf16_bytes =
        detail::cuda_decoder_activation_bytes(config, bf16, true).budgeted;
    const std::uint64_t fp32_bytes =
        detail::cuda_decoder_activation_bytes(config, fp32, false).budgeted;
    std::cout << "vocab " << vocab << ": bf16 path " << (bf16_bytes >> 20) << " MiB, fp32 path "
              << (fp32_bytes >> 20) << " MiB\n";
    EXPECT_LT(bf16_bytes, fp32_bytes);
    // The fp32 path holds logits and dlogits whole; the bf16 path one chunk of each.
    const std::uint64_t whole_logits = std::uint64_t{8192} * vocab * sizeof(float);
    EXPECT_LT(bf16_bytes + whole_logits, fp32_bytes);
  }
}

}  // namespace
}  // namespace strata::llm
