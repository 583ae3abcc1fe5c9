#include "models/gpt/byte_corpus.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <system_error>

#include "base/assert.hpp"
#include "io/io_error.hpp"
#include "io/whole_file.hpp"

namespace strata::gpt {
namespace {

std::vector<std::filesystem::path> expand(const std::filesystem::path& path) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (error) {
    throw io::IoError("stat corpus path", path.string(), 0, 0, error.value());
  }
  if (!std::filesystem::is_directory(status)) {
    return {path};
  }
  std::vector<std::filesystem::path> files;
  std::filesystem::directory_iterator entries(path, error);
  if (error) {
    throw io::IoError("list corpus directory", path.string(), 0, 0, error.value());
  }
  for (const std::filesystem::directory_entry& entry : entries) {
    if (entry.is_regular_file() && !entry.is_symlink()) {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    throw io::IoError("find a regular file in corpus directory", path.string(), 0, 0, ENOENT);
  }
  return files;
}

std::string describe(std::span<const std::filesystem::path> paths) {
  std::string text;
  for (const std::filesystem::path& path : paths) {
    text += (text.empty() ? "" : ", ") + path.string();
  }
  return text;
}

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t x = (state += 0x9e3779b97f4a7c15ull);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

Corpus load_corpus(std::span<const std::filesystem::path> paths, const CorpusOptions& options) {
  STRATA_ASSERT(options.validation_fraction > 0.0 && options.validation_fraction < 1.0);
  Corpus corpus;
  for (const std::filesystem::path& path : paths) {
    for (std::filesystem::path& file : expand(path)) {
      corpus.files.push_back(std::move(file));
    }
  }
  std::vector<std::uint8_t> all;
  for (const std::filesystem::path& file : corpus.files) {
    const std::vector<std::uint8_t> bytes = io::read_file_bytes(file);
    all.insert(all.end(), bytes.begin(), bytes.end());
  }
  const auto validation_bytes = static_cast<std::size_t>(
      std::floor(static_cast<double>(all.size()) * options.validation_fraction));
  const std::size_t train_bytes = all.size() - validation_bytes;
  if (train_bytes < options.min_split_bytes || validation_bytes < options.min_split_bytes) {
    throw io::IoError(
        "use as corpus (" + std::to_string(all.size()) + " bytes give " +
            std::to_string(train_bytes) + " training and " + std::to_string(validation_bytes) +
            " validation bytes, each split needs " + std::to_string(options.min_split_bytes) +
            ", seq_len + 1) the files",
        describe(corpus.files.empty() ? paths
                                      : std::span<const std::filesystem::path>(corpus.files)),
        0, 0, EINVAL);
  }
  corpus.train.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(train_bytes));
  corpus.validation.assign(all.begin() + static_cast<std::ptrdiff_t>(train_bytes), all.end());
  return corpus;
}

Corpus load_default_corpus(const CorpusOptions& options) {
  const std::filesystem::path directory(kDefaultCorpusDir);
  return load_corpus(std::span(&directory, 1), options);
}

BatchSampler::BatchSampler(std::span<const std::uint8_t> tokens, std::uint32_t seq_len,
                           std::uint32_t micro_batch, std::uint64_t seed)
    : tokens_(tokens), seq_len_(seq_len), micro_batch_(micro_batch), state_(seed) {
  STRATA_ASSERT(tokens.size() >= std::size_t{seq_len} + 1);
}

void BatchSampler::next(std::span<std::int32_t> batch) {
  STRATA_ASSERT(batch.size() == batch_tokens());
  const std::size_t window = std::size_t{seq_len_} + 1;
  const std::size_t starts = tokens_.size() - window + 1;
  for (std::size_t s = 0; s < micro_batch_; ++s) {
    // Modulo bias is below starts / 2⁶⁴: irrelevant at corpus sizes.
    const std::size_t start = splitmix64(state_) % starts;
    for (std::size_t i = 0; i < window; ++i) {
      batch[s * window + i] = tokens_[start + i];
    }
  }
}

std::size_t evaluation_windows(std::size_t token_count, std::uint32_t seq_len) {
  return token_count / (std::size_t{seq_len} + 1);
}

void evaluation_batch(std::span<const std::uint8_t> tokens, std::uint32_t seq_len,
                      std::uint32_t micro_batch, std::size_t index, std::span<std::int32_t> batch) {
  const std::size_t window = std::size_t{seq_len} + 1;
  const std::size_t windows = evaluation_windows(tokens.size(), seq_len);
  STRATA_ASSERT(windows > 0 && batch.size() == micro_batch * window);
  for (std::size_t s = 0; s < micro_batch; ++s) {
    const std::size_t start = ((index * micro_batch + s) % windows) * window;
    for (std::size_t i = 0; i < window; ++i) {
      batch[s * window + i] = tokens[start + i];
    }
  }
}

}  // namespace strata::gpt
