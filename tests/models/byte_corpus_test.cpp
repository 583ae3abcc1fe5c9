// Proves the byte corpus reads files in sorted order and splits them 90/10, that bad paths are
// errors naming the path and errno, and that batches are deterministic windows of the split.
#include "models/gpt/byte_corpus.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "io/whole_file.hpp"
#include "tests/io/io_test_support.hpp"

namespace strata::gpt {
namespace {

using io::testing::ScratchDir;

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(ByteCorpus, ReadsDirectorySortedSkipsLinksAndSplitsTheTail) {
  ScratchDir scratch;
  write_text(scratch.path() / "b", std::string(600, 'b'));
  write_text(scratch.path() / "a", std::string(400, 'a'));
  std::filesystem::create_symlink(scratch.path() / "a", scratch.path() / "c-link");
  const std::filesystem::path dir = scratch.path();
  const Corpus corpus = load_corpus(std::span(&dir, 1), CorpusOptions{0.1, 10});
  ASSERT_EQ(corpus.files.size(), 2u);
  EXPECT_EQ(corpus.files[0].filename(), "a");
  EXPECT_EQ(corpus.files[1].filename(), "b");
  ASSERT_EQ(corpus.train.size(), 900u);
  ASSERT_EQ(corpus.validation.size(), 100u);
  EXPECT_EQ(corpus.train.front(), 'a');
  EXPECT_EQ(corpus.train[400], 'b');
  EXPECT_TRUE(std::all_of(corpus.validation.begin(), corpus.validation.end(),
                          [](std::uint8_t byte) { return byte == 'b'; }));
}

TEST(ByteCorpus, DefaultCorpusIsTheDebianLicenceTexts) {
  if (!std::filesystem::is_directory(kDefaultCorpusDir)) {
    GTEST_SKIP() << kDefaultCorpusDir << " is missing (not a Debian system)";
  }
  const Corpus corpus = load_default_corpus(CorpusOptions{});
  EXPECT_GE(corpus.files.size(), 5u);
  EXPECT_TRUE(std::is_sorted(corpus.files.begin(), corpus.files.end()));
  EXPECT_GT(corpus.train.size(), 100'000u);
  const double fraction = static_cast<double>(corpus.validation.size()) /
                          static_cast<double>(corpus.train.size() + corpus.validation.size());
  EXPECT_NEAR(fraction, 0.1, 1e-3);
}

TEST(ByteCorpus, MissingFileNamesPathAndErrno) {
  ScratchDir scratch;
  const std::filesystem::path missing = scratch.path() / "no-such-file.txt";
  try {
    load_corpus(std::span(&missing, 1), CorpusOptions{});
    FAIL() << "loaded a missing file";
  } catch (const io::IoError& error) {
    EXPECT_EQ(error.code().value(), ENOENT);
    EXPECT_EQ(error.path(), missing);
    EXPECT_NE(std::string(error.what()).find(missing.string()), std::string::npos);
    EXPECT_NE(std::string(error.what()).find("No such file"), std::string::npos) << error.what();
  }
}

TEST(ByteCorpus, UnreadableFileNamesPathAndErrno) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "root reads files whatever their mode";
  }
  ScratchDir scratch;
  const std::filesystem::path locked = scratch.path() / "locked.txt";
  write_text(locked, std::string(4096, 'x'));
  std::filesystem::permissions(locked, std::filesystem::perms::none);
  try {
    load_corpus(std::span(&locked, 1), CorpusOptions{});
    FAIL() << "read a mode-000 file";
  } catch (const io::IoError& error) {
    EXPECT_EQ(error.code().value(), EACCES);
    EXPECT_EQ(error.path(), locked);
  }
}

TEST(ByteCorpus, TooSmallCorpusNamesPathAndSizes) {
  ScratchDir scratch;
  const std::filesystem::path small = scratch.path() / "small.txt";
  write_text(small, std::string(500, 'x'));
  try {
    load_corpus(std::span(&small, 1), CorpusOptions{0.1, 129});  // validation gets 50 bytes
    FAIL() << "accepted a corpus whose validation split cannot hold one sequence";
  } catch (const io::IoError& error) {
    EXPECT_EQ(error.code().value(), EINVAL);
    const std::string what = error.what();
    EXPECT_NE(what.find(small.string()), std::string::npos) << what;
    EXPECT_NE(what.find("50 validation bytes"), std::string::npos) << what;
  }
}

TEST(BatchSampler, SameSeedSameBatchesAndEveryWindowIsFromTheSplit) {
  std::vector<std::uint8_t> tokens(1000);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::uint8_t>(i % 251);
  }
  constexpr std::uint32_t kSeqLen = 16;
  constexpr std::uint32_t kMicroBatch = 4;
  BatchSampler first(tokens, kSeqLen, kMicroBatch, 42);
  BatchSampler second(tokens, kSeqLen, kMicroBatch, 42);
  BatchSampler other(tokens, kSeqLen, kMicroBatch, 43);
  std::vector<std::int32_t> a(first.batch_tokens()), b(a.size()), c(a.size());
  bool differs_from_other_seed = false;
  for (int step = 0; step < 10; ++step) {
    first.next(a);
    second.next(b);
    other.next(c);
    ASSERT_EQ(a, b) << "step " << step;
    differs_from_other_seed |= a != c;
    for (std::uint32_t s = 0; s < kMicroBatch; ++s) {
      // Consecutive tokens of one window are consecutive corpus bytes (i % 251 pattern).
      for (std::uint32_t i = 1; i <= kSeqLen; ++i) {
        const std::int32_t previous = a[s * (kSeqLen + 1) + i - 1];
        EXPECT_EQ(a[s * (kSeqLen + 1) + i], (previous + 1) % 251);
      }
    }
  }
  EXPECT_TRUE(differs_from_other_seed);
}

TEST(EvaluationBatch, TakesConsecutiveWindowsAndWraps) {
  std::vector<std::uint8_t> tokens(50);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::uint8_t>(i);
  }
  EXPECT_EQ(evaluation_windows(tokens.size(), 9), 5u);  // windows of 10
  std::vector<std::int32_t> batch(2 * 10);
  evaluation_batch(tokens, 9, 2, 2, batch);  // windows 4 and 0
  EXPECT_EQ(batch[0], 40);
  EXPECT_EQ(batch[9], 49);
  EXPECT_EQ(batch[10], 0);
}

}  // namespace
}  // namespace strata::gpt
