// Proves safetensors export/load round-trips bit-exactly (F32) or to the rounded value (BF16,
// F16), and that every kind of malformed file is a SafetensorsError naming file and tensor.
// (The reader and writer of runtime/checkpoint/safetensors.*.)
#include "io/whole_file.hpp"
#include "runtime/checkpoint/safetensors.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "cpu_adam/typed_span.hpp"
#include "tests/io/io_test_support.hpp"

namespace strata::runtime {
namespace {

using io::testing::ScratchDir;

std::vector<UnitSpec> two_units(std::uint64_t width = 5) {
  return {UnitSpec{"emb", {TensorSpec{"emb.weight", {7, width}, TensorInit::normal(1)}}},
          UnitSpec{"h.0",
                   {TensorSpec{"h.0.w", {width, 3}, TensorInit::normal(1)},
                    TensorSpec{"h.0.b", {3}, TensorInit::zeros()}}}};
}

std::vector<std::vector<float>> values_for(const std::vector<UnitSpec>& units) {
  std::vector<std::vector<float>> values;
  float x = 0.37f;
  for (const UnitSpec& unit : units) {
    std::size_t numel = 0;
    for (const TensorSpec& tensor : unit.tensors) numel += tensor.numel();
    values.emplace_back(numel);
    for (float& v : values.back()) {
      x = x * 3.1f - std::floor(x * 3.1f);
      v = (x - 0.5f) * 1e3f;
    }
  }
  return values;
}

class SafetensorsRoundTrip : public ::testing::TestWithParam<DType> {};

TEST_P(SafetensorsRoundTrip, ExportLoadGivesTheRoundedValuesAndTheSameBytes) {
  const DType dtype = GetParam();
  ScratchDir scratch;
  const std::vector<UnitSpec> units = two_units();
  const std::vector<std::vector<float>> original = values_for(units);
  const std::filesystem::path first = scratch.path() / "first.safetensors";
  const std::filesystem::path second = scratch.path() / "second.safetensors";
  save_safetensors(first, units, [&](std::size_t u) { return original[u]; }, dtype,
                   {{"format", "pt"}, {"step", "12"}});
  std::vector<std::vector<float>> loaded(units.size());
  load_safetensors(first, units, [&](std::size_t u, std::span<const float> v) {
    loaded[u].assign(v.begin(), v.end());
  });
  for (std::size_t u = 0; u < units.size(); ++u) {
    ASSERT_EQ(loaded[u].size(), original[u].size());
    for (std::size_t i = 0; i < original[u].size(); ++i) {
      const float value = original[u][i];
      const float expected = dtype == DType::kFp32   ? value
                             : dtype == DType::kBf16 ? to_float(to_bf16(value))
                                                     : to_float(to_fp16(value));
      ASSERT_EQ(std::bit_cast<std::uint32_t>(loaded[u][i]), std::bit_cast<std::uint32_t>(expected))
          << units[u].name << " element " << i;
    }
  }
  save_safetensors(second, units, [&](std::size_t u) { return loaded[u]; }, dtype,
                   {{"format", "pt"}, {"step", "12"}});
  EXPECT_EQ(io::read_file_bytes(first), io::read_file_bytes(second));
  const SafetensorsFile file = SafetensorsFile::read(first);
  EXPECT_EQ(file.metadata().at("step"), "12");
  EXPECT_EQ(file.entries().size(), 3u);
  EXPECT_FALSE(std::filesystem::exists(scratch.path() / "first.safetensors.tmp"));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SafetensorsRoundTrip,
                         ::testing::Values(DType::kFp32, DType::kBf16, DType::kFp16),
                         [](const ::testing::TestParamInfo<DType>& param_info) {
                           return std::string(to_string(param_info.param));
                         });

// A file from a header text and a data section of `data_bytes` zero bytes.
std::vector<std::uint8_t> make_file(const std::string& header, std::size_t data_bytes,
                                    std::uint64_t header_length_field) {
  std::vector<std::uint8_t> bytes(8 + header.size() + data_bytes, 0);
  for (std::size_t i = 0; i < 8; ++i) {  // little-endian, byte by byte
    bytes[i] = static_cast<std::uint8_t>(header_length_field >> (8 * i));
  }
  std::copy(header.begin(), header.end(), bytes.begin() + 8);
  return bytes;
}

struct MalformedCase {
  const char* label;
  std::string header;
  std::size_t data_bytes;
  const char* tensor;              // expected SafetensorsError::tensor()
  const char* problem;             // expected substring of SafetensorsError::problem()
  std::int64_t length_adjust = 0;  // added to the true header length in the length field
};

class SafetensorsMalformed : public ::testing::TestWithParam<MalformedCase> {};

TEST_P(SafetensorsMalformed, IsAnErrorNamingFileTensorAndProblem) {
  const MalformedCase& c = GetParam();
  const auto length =
      static_cast<std::uint64_t>(static_cast<std::int64_t>(c.header.size()) + c.length_adjust);
  try {
    SafetensorsFile::parse(make_file(c.header, c.data_bytes, length), "bad.safetensors");
    FAIL() << "parsed a malformed file: " << c.label;
  } catch (const SafetensorsError& error) {
    EXPECT_EQ(error.file(), "bad.safetensors");
    EXPECT_EQ(error.tensor(), c.tensor) << error.what();
    EXPECT_NE(error.problem().find(c.problem), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("bad.safetensors"), std::string::npos);
  }
}

const std::string kA = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";

INSTANTIATE_TEST_SUITE_P(
    Cases, SafetensorsMalformed,
    ::testing::Values(
        MalformedCase{"length beyond file", "{" + kA + "}", 8, "", "exceeds", 1000},
        MalformedCase{"huge length", "{" + kA + "}", 8, "", "exceeds", INT64_MAX / 2},
        MalformedCase{"bad json", R"({"a":{"dtype":"F32",)", 8, "", "not valid JSON"},
        MalformedCase{"truncated by length", "{" + kA + "}", 8, "", "not valid JSON", -3},
        MalformedCase{"not an object", "[1,2]", 0, "", "must be a JSON object"},
        MalformedCase{"entry not an object", R"({"a":3})", 0, "a", "must be an object"},
        MalformedCase{"unknown dtype", R"({"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})",
                      8, "a", "unknown or unsupported dtype"},
        MalformedCase{"unknown key",
                      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8, "a",
                      "unknown key 'x'"},
        MalformedCase{"missing offsets", R"({"a":{"dtype":"F32","shape":[2]}})", 8, "a",
                      "missing 'data_offsets'"},
        MalformedCase{"negative dim", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",
                      8, "a", "non-negative integer"},
        MalformedCase{"size mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",
                      8, "a", "needs 12 bytes"},
        MalformedCase{"bf16 size mismatch",
                      R"({"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})", 8, "a",
                      "needs 4 bytes"},
        MalformedCase{"end before begin",
                      R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8, "a",
                      "end before begin"},
        MalformedCase{"three offsets",
                      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", 8, "a",
                      "must be [begin, end]"},
        MalformedCase{"out of range", "{" + kA + "}", 4, "a", "run past the 4 data bytes"},
        MalformedCase{"overlap",
                      "{" + kA + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12,
                      "b", "overlap tensor 'a'"},
        MalformedCase{"gap", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8, "a",
                      "belong to no tensor"},
        MalformedCase{"trailing data", "{" + kA + "}", 12, "", "[8, 12) belong to no tensor"},
        MalformedCase{"metadata not strings", R"({"__metadata__":{"step":3}})", 0, "",
                      "must be a string"}),
    [](const ::testing::TestParamInfo<MalformedCase>& param_info) {
      std::string label = param_info.param.label;
      for (char& c : label) {
        c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      }
      return label;
    });

TEST(SafetensorsMalformed, FileShorterThanLengthField) {
  try {
    SafetensorsFile::parse({1, 2, 3}, "tiny.safetensors");
    FAIL() << "parsed a 3-byte file";
  } catch (const SafetensorsError& error) {
    EXPECT_NE(error.problem().find("shorter than the 8-byte header length"), std::string::npos);
  }
}

// Hugging Face checkpoints (SafetensorsRules::kAnyCheckpoint, models/checkpoint): the format's
// other dtypes are listed with their names but refused when read; an entry's other keys are
// ignored; a dtype the format does not define is still an error.
TEST(SafetensorsAnyCheckpoint, ListsOtherDTypesAndRefusesToReadThem) {
  const std::string header =
      R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]},)"
      R"("w":{"dtype":"BF16","shape":[2],"data_offsets":[16,20],"note":1}})";
  const SafetensorsFile file = SafetensorsFile::parse(make_file(header, 20, header.size()),
                                                      "hf.safetensors",
                                                      SafetensorsRules::kAnyCheckpoint);
  ASSERT_EQ(file.entries().size(), 2u);
  const SafetensorsEntry& ids = *file.find("ids");
  EXPECT_EQ(ids.dtype_name, "I64");
  EXPECT_FALSE(ids.dtype.has_value());
  EXPECT_EQ(file.find("w")->dtype, DType::kBf16);
  std::vector<float> values(2);
  file.read_fp32(*file.find("w"), values);
  try {
    file.read_fp32(ids, values);
    FAIL() << "read an I64 tensor as fp32";
  } catch (const SafetensorsError& error) {
    EXPECT_EQ(error.tensor(), "ids");
    EXPECT_NE(error.problem().find("dtype I64 cannot be read"), std::string::npos) << error.what();
  }
}

TEST(SafetensorsAnyCheckpoint, UnknownDTypeIsAnError) {
  const std::string header = R"({"a":{"dtype":"X9","shape":[1],"data_offsets":[0,1]}})";
  try {
    SafetensorsFile::parse(make_file(header, 1, header.size()), "hf.safetensors",
                           SafetensorsRules::kAnyCheckpoint);
    FAIL() << "parsed an unknown dtype";
  } catch (const SafetensorsError& error) {
    EXPECT_EQ(error.tensor(), "a");
    EXPECT_NE(error.problem().find("unknown dtype \"X9\""), std::string::npos) << error.what();
  }
}

TEST(SafetensorsMalformed, MissingFileNamesPathAndErrno) {
  ScratchDir scratch;
  const std::filesystem::path path = scratch.path() / "absent.safetensors";
  try {
    SafetensorsFile::read(path);
    FAIL() << "read a missing file";
  } catch (const io::IoError& error) {
    EXPECT_EQ(error.code().value(), ENOENT);
    EXPECT_NE(std::string(error.what()).find(path.string()), std::string::npos) << error.what();
  }
}

// Loading checks the file against the model: missing tensors, wrong shapes, extra tensors; a
// failed load hands out no unit.
void expect_load_error(const std::vector<UnitSpec>& saved, const std::vector<UnitSpec>& target,
                       const std::string& tensor, const std::string& problem) {
  ScratchDir scratch;
  const std::filesystem::path path = scratch.path() / "model.safetensors";
  const auto values = values_for(saved);
  save_safetensors(
      path, saved, [&](std::size_t u) { return values[u]; }, DType::kFp32);
  bool wrote = false;
  try {
    load_safetensors(path, target, [&](std::size_t, std::span<const float>) { wrote = true; });
    FAIL() << "loaded a mismatching file";
  } catch (const SafetensorsError& error) {
    EXPECT_EQ(error.file(), path.string());
    EXPECT_EQ(error.tensor(), tensor) << error.what();
    EXPECT_NE(error.problem().find(problem), std::string::npos) << error.what();
  }
  EXPECT_FALSE(wrote) << "a failed load must leave the parameters untouched";
}

TEST(SafetensorsModelMismatch, MissingTensor) {
  std::vector<UnitSpec> fewer = two_units();
  fewer[1].tensors.pop_back();
  expect_load_error(fewer, two_units(), "h.0.b", "missing");
}

TEST(SafetensorsModelMismatch, ExtraTensor) {
  std::vector<UnitSpec> fewer = two_units();
  fewer[1].tensors.pop_back();
  expect_load_error(two_units(), fewer, "h.0.b", "not a parameter of the model");
}

TEST(SafetensorsModelMismatch, ShapeDiffers) {
  expect_load_error(two_units(6), two_units(5), "emb.weight",
                    "shape [7, 6] differs from the model's [7, 5]");
}

}  // namespace
}  // namespace strata::runtime
