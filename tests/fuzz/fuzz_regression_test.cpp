// Proves the parser bugs found while fuzzing stay fixed and the committed corpora stay harmless in
// every build (not only the clang fuzz build): each bug is a named case here, and every corpus
// file is fed through the same entry points the fuzz targets use.
#include <cstring>
#include <fstream>
#include <iterator>
#include <variant>

#include <gtest/gtest.h>
#include <xxhash.h>

#include "runtime/config/config.hpp"
#include "runtime/checkpoint/safetensors.hpp"
#include "tiers/manifest.hpp"

namespace strata {
namespace {

const std::filesystem::path kCorpus =
    std::filesystem::path(STRATA_SOURCE_DIR) / "tests/fuzz/corpus";

std::vector<std::uint8_t> read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A manifest header (as tiers/nvme_store.cpp writes it) with chosen fields, padded to `size`.
std::vector<std::byte> manifest_header(std::uint32_t count, std::uint64_t body_bytes,
                                       std::size_t size) {
  std::vector<std::byte> bytes(size);
  std::memcpy(bytes.data(), "STRATAMF", 8);
  const std::uint32_t fields[4] = {1, 0, 1, count};  // version, rank, ranks, count
  std::memcpy(bytes.data() + 8, fields, sizeof(fields));
  std::memcpy(bytes.data() + 8 + 16 + 24, &body_bytes, 8);
  return bytes;
}

std::string reason(const std::variant<tiers::DecodedManifest, std::string>& decoded) {
  const auto* text = std::get_if<std::string>(&decoded);
  return text != nullptr ? *text : "(decoded)";
}

// Found writing manifest_fuzz: a body size near 2^64 wrapped `body + 8 <= size` around and read the
// checksum from far outside the buffer.
TEST(FuzzRegression, ManifestHugeBodySizeDoesNotWrapAround) {
  const auto bytes = manifest_header(0, ~std::uint64_t{0} - 3, 4096);
  EXPECT_NE(reason(tiers::decode_manifest(bytes)).find("(truncated)"), std::string::npos);
}

// Found writing manifest_fuzz (which repairs the checksum to get past it): a record count of 2^32 -
// 1 resized the record vector to ~300 GiB before parsing a single record.
TEST(FuzzRegression, ManifestRecordCountBeyondItsBodyIsRefusedBeforeAllocating) {
  const std::uint64_t body = 8 + 16 + 32;
  auto bytes = manifest_header(0xffffffffu, body, 4096);
  const std::uint64_t sum = XXH3_64bits(bytes.data(), body);
  std::memcpy(bytes.data() + body, &sum, 8);
  EXPECT_NE(reason(tiers::decode_manifest(bytes)).find("claims 4294967295 extent records"),
            std::string::npos);
}

TEST(FuzzRegression, ConfigCorpusParsesOrThrows) {
  int parsed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kCorpus / "config")) {
    const std::vector<std::uint8_t> bytes = read_all(entry.path());
    try {
      runtime::parse_config(
          std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
      ++parsed;
    } catch (const std::exception&) {
    }
  }
  EXPECT_GE(parsed, 1) << "the committed configs of the corpus must parse";
}

TEST(FuzzRegression, ManifestCorpusDecodesOrGivesAReason) {
  int decoded = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kCorpus / "manifest")) {
    const std::vector<std::uint8_t> bytes = read_all(entry.path());
    ASSERT_FALSE(bytes.empty());
    const auto span = std::as_bytes(std::span(bytes)).subspan(1);
    if (std::holds_alternative<tiers::DecodedManifest>(tiers::decode_manifest(span))) ++decoded;
  }
  EXPECT_GE(decoded, 2) << "the committed manifests of the corpus must decode";
}

TEST(FuzzRegression, SafetensorsCorpusParsesOrThrows) {
  int parsed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(kCorpus / "safetensors")) {
    try {
      const runtime::SafetensorsFile file = runtime::SafetensorsFile::read(entry.path());
      std::vector<float> values;
      for (const runtime::SafetensorsEntry& tensor : file.entries()) {
        values.resize(tensor.numel());
        file.read_fp32(tensor, values);
      }
      ++parsed;
    } catch (const runtime::SafetensorsError&) {
    }
  }
  EXPECT_GE(parsed, 1) << "the committed safetensors files of the corpus must parse";
}

}  // namespace
}  // namespace strata
