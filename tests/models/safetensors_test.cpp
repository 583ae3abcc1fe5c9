// Proves the GPT's safetensors export/load round-trips bit-exactly (F32) or to the rounded value
// (BF16, F16), and that a file of another model is a SafetensorsError naming the tensor.
#include "models/gpt/safetensors.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "base/float16.hpp"
#include "io/whole_file.hpp"
#include "models/gpt/gpt_model.hpp"
#include "models/gpt/parameter_store.hpp"
#include "tests/models/tiny_gpt_config.hpp"
#include "tests/io/io_test_support.hpp"

namespace strata::gpt {
namespace {

using io::testing::ScratchDir;
using testing::tiny_config;

std::vector<std::int32_t> some_tokens(std::size_t count, std::uint32_t vocab) {
  std::vector<std::int32_t> tokens(count);
  for (std::size_t i = 0; i < count; ++i) {
    tokens[i] = static_cast<std::int32_t>((i * 7 + 3) % vocab);
  }
  return tokens;
}

class SafetensorsRoundTrip : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(SafetensorsRoundTrip, ExportLoadGivesSameValuesBytesAndLoss) {
  const auto [dtype, tied] = GetParam();
  ScratchDir scratch;
  set_blas_threads(1);
  GptModel model(tiny_config(tied));
  const ParameterStore original = ParameterStore::initialized(model.units(), 7);
  const std::filesystem::path first = scratch.path() / "first.safetensors";
  const std::filesystem::path second = scratch.path() / "second.safetensors";
  save_safetensors(first, original, dtype, {{"format", "pt"}, {"step", "12"}});

  ParameterStore loaded(model.units());
  load_safetensors(first, loaded);
  for (std::size_t u = 0; u < model.unit_count(); ++u) {
    for (std::size_t i = 0; i < original.unit(u).size(); ++i) {
      const float value = original.unit(u)[i];
      const float expected = dtype == DType::kFp32 ? value
                             : dtype == DType::kBf16
                                 ? to_float(to_bf16(value))
                                 : to_float(to_fp16(value));
      ASSERT_EQ(std::bit_cast<std::uint32_t>(loaded.unit(u)[i]),
                std::bit_cast<std::uint32_t>(expected))
          << model.units()[u].name << " element " << i;
    }
  }
  save_safetensors(second, loaded, dtype, {{"format", "pt"}, {"step", "12"}});
  EXPECT_EQ(io::read_file_bytes(first), io::read_file_bytes(second));

  const SafetensorsFile file = SafetensorsFile::read(first);
  EXPECT_EQ(file.metadata().at("step"), "12");
  EXPECT_EQ(file.entries().size(), tied ? 28u : 29u);

  const std::vector<std::int32_t> tokens = some_tokens(model.batch_tokens(), 32);
  const double original_loss = forward_loss(model, original, tokens);
  const double loaded_loss = forward_loss(model, loaded, tokens);
  if (dtype == DType::kFp32) {
    EXPECT_EQ(original_loss, loaded_loss);
  } else {
    EXPECT_NEAR(original_loss, loaded_loss, 1e-2);  // parameters moved by <= 2⁻⁸ relative
  }
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, SafetensorsRoundTrip,
    ::testing::Combine(::testing::Values(DType::kFp32, DType::kBf16,
                                         DType::kFp16),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<SafetensorsRoundTrip::ParamType>& param_info) {
      return std::string(runtime::to_string(std::get<0>(param_info.param))) +
             (std::get<1>(param_info.param) ? "Tied" : "Untied");
    });

// The header parser's malformed-file cases are tested once, with the parser, in
// tests/runtime/safetensors_test.cpp; here: the GPT's names and shapes.

class SafetensorsModelMismatch : public ::testing::Test {
 protected:
  void expect_load_error(const ParameterStore& saved, ParameterStore& target,
                         const std::string& tensor, const std::string& problem) {
    ScratchDir scratch;
    const std::filesystem::path path = scratch.path() / "model.safetensors";
    save_safetensors(path, saved, DType::kFp32);
    const std::vector<std::vector<float>> before = snapshot(target);
    try {
      load_safetensors(path, target);
      FAIL() << "loaded a mismatching file";
    } catch (const SafetensorsError& error) {
      EXPECT_EQ(error.file(), path.string());
      EXPECT_EQ(error.tensor(), tensor) << error.what();
      EXPECT_NE(error.problem().find(problem), std::string::npos) << error.what();
    }
    EXPECT_EQ(snapshot(target), before) << "a failed load must leave the parameters untouched";
  }
  static std::vector<std::vector<float>> snapshot(const ParameterStore& store) {
    std::vector<std::vector<float>> values;
    for (std::size_t u = 0; u < store.units().size(); ++u) {
      values.emplace_back(store.unit(u).begin(), store.unit(u).end());
    }
    return values;
  }
};

TEST_F(SafetensorsModelMismatch, MissingTensor) {
  const ParameterStore tied = ParameterStore::initialized(gpt_units(tiny_config(true)), 1);
  ParameterStore untied(gpt_units(tiny_config(false)));
  expect_load_error(tied, untied, "lm_head.weight", "missing");
}

TEST_F(SafetensorsModelMismatch, ExtraTensor) {
  const ParameterStore untied = ParameterStore::initialized(gpt_units(tiny_config(false)), 1);
  ParameterStore tied(gpt_units(tiny_config(true)));
  expect_load_error(untied, tied, "lm_head.weight", "not a parameter of the model");
}

TEST_F(SafetensorsModelMismatch, ShapeDiffers) {
  runtime::ModelConfig longer = tiny_config(true);
  longer.seq_len = 16;
  const ParameterStore saved = ParameterStore::initialized(gpt_units(longer), 1);
  ParameterStore target(gpt_units(tiny_config(true)));
  expect_load_error(saved, target, "wpe.weight", "shape [16, 16] differs from the model's [8, 16]");
}

}  // namespace
}  // namespace strata::gpt
