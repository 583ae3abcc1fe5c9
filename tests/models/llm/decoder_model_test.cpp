// Proves DecoderModel's activation checkpointing is bitwise free, KV-cache decoding gives the full
// forward's logits, results are deterministic, loss weights and short batches behave, and bad
// tokens are refused naming their position; packed documents with a separator are scored as if
// each were alone (every family); host_bf16_operands rounds exactly the products' operands.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/float16.hpp"
#include "models/decoder/linear.hpp"
#include "tests/models/llm/tiny_llm.hpp"

namespace strata::llm {
namespace {

using testing::UnitBuffers;

struct Family {
  const char* name;
  const char* config_json;
};

const Family kFamilies[] = {{"llama", testing::kTinyLlama},
                            {"qwen2", testing::kTinyQwen2},
                            {"mistral", testing::kTinyMistral},
                            {"gpt2", testing::kTinyGpt2}};

class DecoderModelTest : public ::testing::TestWithParam<Family> {
 protected:
  static constexpr std::uint64_t kSeed = 7;
  HfConfig config() const { return parse_hf_config(GetParam().config_json); }
};

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Inside a Bf16OperandsScope a product equals the plain fp32 product of the operands rounded to
// bf16 beforehand, strides and transposes included; outside it the operands are used as they are.
TEST(Bf16Operands, ProductsRoundBothOperandsOnlyInsideTheScope) {
  using gpt::detail::Transpose;
  std::mt19937 random(11);
  std::normal_distribution<float> normal;
  const std::size_t m = 5, n = 7, k = 9, lda = 12, ldb = 10;  // A [k × m] (transposed), B [k × n]
  std::vector<float> a(k * lda), b(k * ldb);
  for (float& v : a) v = normal(random);
  for (float& v : b) v = normal(random);
  std::vector<float> a_rounded = a, b_rounded = b;
  for (float& v : a_rounded) v = to_float(to_bf16(v));
  for (float& v : b_rounded) v = to_float(to_bf16(v));
  const auto run = [&](const std::vector<float>& x, const std::vector<float>& y) {
    std::vector<float> c(m * n, 0.5f);
    detail::product(Transpose::kYes, Transpose::kNo, m, n, k, 1.5f, x.data(), lda, y.data(), ldb,
                    1.0f, c.data(), n);
    return c;
  };
  const std::vector<float> plain = run(a, b);
  const std::vector<float> expected = [&] {
    std::vector<float> c(m * n, 0.5f);
    gpt::detail::gemm(Transpose::kYes, Transpose::kNo, m, n, k, 1.5f, a_rounded.data(), lda,
                      b_rounded.data(), ldb, 1.0f, c.data(), n);
    return c;
  }();
  std::vector<float> scoped;
  {
    const detail::Bf16OperandsScope rounding(true);
    scoped = run(a, b);
  }
  EXPECT_TRUE(bitwise_equal(scoped, expected));
  EXPECT_FALSE(bitwise_equal(plain, expected));  // the rounding is visible in these values
  EXPECT_TRUE(bitwise_equal(run(a, b), plain));  // and gone after the scope
}

TEST_P(DecoderModelTest, ActivationCheckpointingIsBitwiseEqual) {
  SCOPED_TRACE(::testing::Message() << GetParam().name << ", seed " << kSeed);
  set_blas_threads(2);
  const HfConfig c = config();
  constexpr std::uint32_t kSeqLen = 10;
  constexpr std::uint32_t kBatch = 2;
  DecoderModel plain(c, {kSeqLen, kBatch, false});
  DecoderModel checkpointed(c, {kSeqLen, kBatch, true});
  EXPECT_LT(checkpointed.activation_bytes(), plain.activation_bytes());
  const UnitBuffers params = testing::random_parameters(plain.units(), kSeed);
  const auto tokens = testing::random_tokens(kBatch * (kSeqLen + 1), c.vocab_size, kSeed + 1);
  const auto mask = testing::random_mask(kBatch * kSeqLen, kSeed + 2);
  UnitBuffers plain_grads(plain.units());
  UnitBuffers checkpointed_grads(plain.units());
  const double plain_loss =
      testing::forward_backward(plain, params, plain_grads, tokens, kSeqLen + 1, mask);
  const double checkpointed_loss = testing::forward_backward(checkpointed, params,
                                                             checkpointed_grads, tokens,
                                                             kSeqLen + 1, mask);
  EXPECT_EQ(std::memcmp(&plain_loss, &checkpointed_loss, sizeof(double)), 0);
  for (std::size_t u = 0; u < plain.unit_count(); ++u) {
    EXPECT_TRUE(bitwise_equal(plain_grads.unit(u), checkpointed_grads.unit(u)))
        << plain.units()[u].name;
  }
}

TEST_P(DecoderModelTest, SameInputsGiveBitwiseSameResults) {
  set_blas_threads(2);
  const HfConfig c = config();
  DecoderModel model(c, {8, 2, false});
  const UnitBuffers params = testing::random_parameters(model.units(), kSeed);
  const auto tokens = testing::random_tokens(2 * 9, c.vocab_size, kSeed + 1);
  UnitBuffers first(model.units());
  UnitBuffers second(model.units());
  const double loss_first = testing::forward_backward(model, params, first, tokens, 9, {});
  const double loss_second = testing::forward_backward(model, params, second, tokens, 9, {});
  EXPECT_EQ(std::memcmp(&loss_first, &loss_second, sizeof(double)), 0);
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    EXPECT_TRUE(bitwise_equal(first.unit(u), second.unit(u))) << model.units()[u].name;
  }
}

// Feeds a prompt, then one token at a time; after each feed the next-token logits equal those of
// a full forward over the same tokens at that position (different product shapes, so within fp32
// rounding: 1e-5 of the largest logit; measured at most 5e-7).
TEST_P(DecoderModelTest, KvCacheDecodingMatchesFullForward) {
  set_blas_threads(1);
  const HfConfig c = config();
  // The Llama prompt is longer than the decoder's 64-query attention chunk.
  const std::size_t prompt = std::string(GetParam().name) == "llama" ? 70 : 4;
  const std::size_t total = std::min<std::size_t>(prompt + 8, c.max_position_embeddings);
  DecoderModel full(c, {static_cast<std::uint32_t>(total), 1, false});
  DecoderModel decoder(c, {4, 1, false});
  const UnitBuffers params = testing::random_parameters(full.units(), kSeed);
  std::vector<std::int32_t> tokens = testing::random_tokens(total + 1, c.vocab_size, kSeed + 3);
  testing::forward(full, params, tokens, total + 1);
  const std::span<const float> logits = full.logits();
  const std::size_t vocab = c.vocab_size;

  decoder.start_decoding(total);
  std::size_t fed = 0;
  double worst = 0.0;
  while (fed < total) {
    const std::size_t count = fed == 0 ? prompt : 1;
    testing::decode(decoder, params, std::span(tokens).subspan(fed, count));
    fed += count;
    ASSERT_EQ(decoder.decoded_positions(), fed);
    const std::span<const float> next = decoder.next_logits();
    const std::span<const float> expected = logits.subspan((fed - 1) * vocab, vocab);
    float largest = 0.0f;
    for (const float value : expected) largest = std::max(largest, std::abs(value));
    for (std::size_t i = 0; i < vocab; ++i) {
      ASSERT_NEAR(next[i], expected[i], 1e-5f * largest) << "position " << fed - 1 << " id " << i;
      worst = std::max(worst, static_cast<double>(std::abs(next[i] - expected[i]) / largest));
    }
  }
  std::printf("%s: decoding vs full forward, worst difference %.2e of the largest logit\n",
              GetParam().name, worst);
  EXPECT_THROW(testing::decode(decoder, params, std::span(tokens).first(1)),
               std::invalid_argument);
}

TEST_P(DecoderModelTest, LossWeightsLeaveTargetsOut) {
  set_blas_threads(1);
  const HfConfig c = config();
  DecoderModel model(c, {6, 2, false});
  const UnitBuffers params = testing::random_parameters(model.units(), kSeed);
  auto tokens = testing::random_tokens(2 * 7, c.vocab_size, kSeed + 1);
  std::vector<float> mask(12, 1.0f);
  mask[5] = 0.0f;  // the last target of sequence 0: tokens[6], never an input
  mask[8] = 0.0f;
  UnitBuffers grads(model.units());
  const double loss = testing::forward_backward(model, params, grads, tokens, 7, mask);
  EXPECT_DOUBLE_EQ(model.loss_weight(), 10.0);
  EXPECT_NEAR(loss, model.loss_sum() / model.loss_weight(), 1e-12);
  // A different masked target changes nothing, bit for bit.
  tokens[6] = (tokens[6] + 1) % static_cast<std::int32_t>(c.vocab_size);
  UnitBuffers grads_changed(model.units());
  const double loss_changed =
      testing::forward_backward(model, params, grads_changed, tokens, 7, mask);
  EXPECT_EQ(loss, loss_changed);
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    EXPECT_TRUE(bitwise_equal(grads.unit(u), grads_changed.unit(u))) << model.units()[u].name;
  }
  // ... while unmasking it does change the loss.
  mask[5] = 1.0f;
  EXPECT_NE(testing::forward_backward(model, params, grads_changed, tokens, 7, mask), loss);
  // Everything masked: loss 0, every gradient 0.
  const std::vector<float> nothing(12, 0.0f);
  const double zero = testing::forward_backward(model, params, grads, tokens, 7, nothing);
  EXPECT_EQ(zero, 0.0);
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    for (const float g : grads.unit(u)) ASSERT_EQ(g, 0.0f) << model.units()[u].name;
  }
}

TEST_P(DecoderModelTest, ShortSequencesEqualAModelBuiltForThem) {
  set_blas_threads(1);
  const HfConfig c = config();
  DecoderModel long_model(c, {12, 3, false});
  DecoderModel short_model(c, {5, 2, false});
  const UnitBuffers params = testing::random_parameters(long_model.units(), kSeed);
  const auto tokens = testing::random_tokens(2 * 6, c.vocab_size, kSeed + 4);
  UnitBuffers long_grads(long_model.units());
  UnitBuffers short_grads(long_model.units());
  const double long_loss = testing::forward_backward(long_model, params, long_grads, tokens, 6, {});
  const double short_loss =
      testing::forward_backward(short_model, params, short_grads, tokens, 0, {});
  EXPECT_EQ(long_loss, short_loss);
  for (std::size_t u = 0; u < long_model.unit_count(); ++u) {
    EXPECT_TRUE(bitwise_equal(long_grads.unit(u), short_grads.unit(u)))
        << long_model.units()[u].name;
  }
}

// With document_separator, a packed sequence "doc A + separator, doc B" gives every position of
// each document the logits that document gets alone (attention stays inside it, positions
// restart, Mistral's window and GPT-2's learned positions included); without it, doc B's differ.
TEST_P(DecoderModelTest, PackedDocumentsAreScoredAsIfAlone) {
  set_blas_threads(1);
  const HfConfig c = config();
  const std::int32_t separator = 0;
  std::vector<std::int32_t> doc_a = testing::random_tokens(6, c.vocab_size - 1, kSeed + 5);
  std::vector<std::int32_t> doc_b = testing::random_tokens(9, c.vocab_size - 1, kSeed + 6);
  for (std::int32_t& token : doc_a) ++token;  // no separator inside a document
  for (std::int32_t& token : doc_b) ++token;
  doc_a.push_back(separator);
  std::vector<std::int32_t> packed = doc_a;
  packed.insert(packed.end(), doc_b.begin(), doc_b.end());  // 16 tokens: 15 inputs

  DecoderOptions options{15, 1, false};
  options.document_separator = separator;
  DecoderModel masked(c, options);
  DecoderModel plain(c, {15, 1, false});
  const UnitBuffers params = testing::random_parameters(masked.units(), kSeed);
  testing::forward(masked, params, packed, packed.size());
  const std::vector<float> packed_logits(masked.logits().begin(), masked.logits().end());
  testing::forward(plain, params, packed, packed.size());
  const std::vector<float> unmasked_logits(plain.logits().begin(), plain.logits().end());

  const std::size_t vocab = c.vocab_size;
  float largest = 0.0f;
  for (const float v : packed_logits) largest = std::max(largest, std::abs(v));
  // doc A's 7 inputs (its tokens and the separator) and doc B's first 8, each alone.
  struct Part {
    std::vector<std::int32_t> tokens;
    std::size_t first_row;
  };
  const Part parts[] = {{doc_a, 0}, {doc_b, doc_a.size()}};
  float worst = 0.0f;
  float masking_matters = 0.0f;
  for (const Part& part : parts) {
    std::vector<std::int32_t> alone = part.tokens;
    if (part.first_row == 0) alone.push_back(doc_b.front());  // a target for the separator
    DecoderModel single(c, {static_cast<std::uint32_t>(alone.size() - 1), 1, false});
    testing::forward(single, params, alone, alone.size());
    const std::span<const float> expected = single.logits();
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const std::size_t at = part.first_row * vocab + i;
      worst = std::max(worst, std::abs(packed_logits[at] - expected[i]));
      masking_matters = std::max(masking_matters, std::abs(unmasked_logits[at] - expected[i]));
    }
  }
  EXPECT_LE(worst, 1e-5f * largest) << "largest logit " << largest;
  EXPECT_GT(masking_matters, 1e-3f * largest) << "doc B saw doc A without the mask, yet matched";
}

// The host computes attention itself whatever cuda_attention says, and says so.
TEST_P(DecoderModelTest, HostAttentionIsNamed) {
  DecoderOptions options{4, 2, false};
  options.cuda_attention = CudaAttention::kTensorCores;
  EXPECT_EQ(DecoderModel(config(), options).attention_implementation(), "fp32 on the host");
}

TEST_P(DecoderModelTest, BadTokensAndShapesAreRefused) {
  const HfConfig c = config();
  DecoderModel model(c, {4, 2, false});
  std::vector<std::int32_t> tokens(10, 1);
  tokens[7] = static_cast<std::int32_t>(c.vocab_size);
  try {
    model.set_batch(tokens);
    ADD_FAILURE() << "accepted a token outside the vocabulary";
  } catch (const std::out_of_range& error) {
    EXPECT_NE(std::string(error.what()).find("position 7"), std::string::npos) << error.what();
  }
  tokens[7] = -1;
  EXPECT_THROW(model.set_batch(tokens), std::out_of_range);
  tokens[7] = 1;
  EXPECT_THROW(model.set_batch(std::span(tokens).first(9)), std::invalid_argument);
  EXPECT_THROW(model.set_batch(tokens, 6), std::invalid_argument);  // beyond seq_len + 1
  const std::vector<float> wrong_count(3, 1.0f);
  EXPECT_THROW(model.set_batch(tokens, 5, wrong_count), std::invalid_argument);
  const std::vector<float> negative = {1, 1, -1, 1, 1, 1, 1, 1};
  EXPECT_THROW(model.set_batch(tokens, 5, negative), std::invalid_argument);
  EXPECT_THROW(model.start_decoding(c.max_position_embeddings + 1), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Families, DecoderModelTest, ::testing::ValuesIn(kFamilies),
                         [](const ::testing::TestParamInfo<Family>& param_info) {
                           return std::string(param_info.param.name);
                         });

}  // namespace
}  // namespace strata::llm
