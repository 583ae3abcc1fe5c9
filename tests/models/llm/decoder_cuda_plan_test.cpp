// Proves the CUDA decoder's memory plan without a GPU (decoder_cuda_plan.cpp): the bf16 path's
// loss chunks follow the option or hold about 2^26 logits in whole 64-row tiles, and on the
// 1.08 B Llama (and the same with a 128 k vocabulary) the bf16 path plans less device memory
// than the fp32 reference, its logits never [rows × vocab] whole; and the gathered units the plan
// counts for that path keep fp32 views of their norms alone (the Engine packs them), where the
// fp32 reference keeps the whole unit, so the same budget caches more units.
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "models/decoder/decoder_cuda.hpp"
#include "models/decoder/hf_config.hpp"
#include "models/decoder/model_plan.hpp"
#include "runtime/config/config.hpp"
#include "runtime/plan/memory_plan.hpp"

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

TEST(DecoderCudaPlan, Bf16PathsUnitsKeepFp32ViewsOfTheirNormsAlone) {
  const HfConfig config = parse_hf_config(llama_1b_json(32000));
  DecoderOptions bf16 = step_options();
  DecoderOptions fp32 = bf16;
  fp32.cuda_fp32_products = true;
  const runtime::PlanInputs packed = plan_inputs(config, 1, bf16, true);
  const runtime::PlanInputs whole = plan_inputs(config, 1, fp32, true);
  const std::vector<UnitSpec> units = decoder_units(config);
  ASSERT_EQ(packed.unit_fp32_view_numels.size(), units.size());
  ASSERT_EQ(whole.unit_fp32_view_numels.size(), units.size());
  const std::uint64_t hidden = 2048;
  for (std::size_t u = 0; u < units.size(); ++u) {
    SCOPED_TRACE(units[u].name);
    EXPECT_GE(whole.unit_fp32_view_numels[u], units[u].numel) << "the whole padded unit";
    const std::uint64_t norms = units[u].kind == UnitKind::kLayer  ? 2 * hidden
                                : units[u].kind == UnitKind::kHead ? hidden
                                                                   : 0;
    EXPECT_GE(packed.unit_fp32_view_numels[u], norms);
    EXPECT_LE(packed.unit_fp32_view_numels[u], norms + 3 * runtime::kFp32ViewAlignElements);
  }
  EXPECT_TRUE(plan_inputs(config, 1, bf16, false).unit_fp32_view_numels.empty())
      << "on the host every tensor is read in fp32";

  // bf16 parameters, everything on the device: 2 bytes per parameter gathered, not 6.
  runtime::Config runtime_config;
  runtime_config.tiers.device.kind = runtime::DeviceKind::kCuda;
  runtime_config.tiers.device.budget_bytes = std::uint64_t{1} << 40;
  runtime_config.precision.params = DType::kBf16;
  describe_model_for_plan(config, runtime_config);
  const auto gathered = [&](const runtime::PlanInputs& inputs) {
    const runtime::MemoryPlan plan = runtime::make_memory_plan(runtime_config, inputs);
    for (const runtime::BufferRow& row : plan.buffers) {
      if (row.purpose.find("gathered units") != std::string::npos) return row.bytes;
    }
    ADD_FAILURE() << "no gathered units' row";
    return std::uint64_t{0};
  };
  const double params = static_cast<double>(config.parameter_count());
  EXPECT_NEAR(static_cast<double>(gathered(whole)) / params, 6.0, 0.05);
  EXPECT_NEAR(static_cast<double>(gathered(packed)) / params, 2.0, 0.05);
}

}  // namespace
}  // namespace strata::llm
