// Byte-level training data: text files read as bytes (token = byte value, vocab 256), split into
// a training part and a validation tail, and deterministic batches of micro_batch sequences of
// seq_len + 1 tokens (inputs, then the same window shifted by one as targets).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace strata::gpt {

// The licence texts every Debian system ships: ~240 KB of English prose.
inline constexpr const char* kDefaultCorpusDir = "/usr/share/common-licenses";

struct Corpus {
  std::vector<std::filesystem::path> files;  // in the order they were concatenated
  std::vector<std::uint8_t> train;
  std::vector<std::uint8_t> validation;
};

struct CorpusOptions {
  double validation_fraction = 0.1;   // the last fraction of the bytes
  std::size_t min_split_bytes = 129;  // each split must hold one sequence: seq_len + 1
};

// Reads `paths` in order; a directory stands for its regular files sorted by name (symbolic
// links are skipped: /usr/share/common-licenses links GPL -> GPL-3, which would duplicate text).
// Throws io::IoError (path + errno text) for a missing or unreadable path, and for a corpus whose
// train or validation part is smaller than options.min_split_bytes (EINVAL, naming the paths).
Corpus load_corpus(std::span<const std::filesystem::path> paths, const CorpusOptions& options);
Corpus load_default_corpus(const CorpusOptions& options);

// Random windows of a split, from a seeded counter-based generator: the same seed gives the same
// batches on every platform.
class BatchSampler {
 public:
  // Asserts `tokens` holds at least seq_len + 1 bytes (load_corpus guarantees it).
  BatchSampler(std::span<const std::uint8_t> tokens, std::uint32_t seq_len,
               std::uint32_t micro_batch, std::uint64_t seed);
  // Fills micro_batch × (seq_len + 1) tokens.
  void next(std::span<std::int32_t> batch);
  std::size_t batch_tokens() const { return std::size_t{micro_batch_} * (seq_len_ + 1); }

 private:
  std::span<const std::uint8_t> tokens_;
  std::uint32_t seq_len_;
  std::uint32_t micro_batch_;
  std::uint64_t state_;
};

// Evaluation windows: consecutive, non-overlapping seq_len + 1 windows from the start of
// `tokens`; batch `index` takes windows [index·micro_batch, (index + 1)·micro_batch), wrapping
// around. Fixed, so validation losses of different steps compare.
std::size_t evaluation_windows(std::size_t token_count, std::uint32_t seq_len);
void evaluation_batch(std::span<const std::uint8_t> tokens, std::uint32_t seq_len,
                      std::uint32_t micro_batch, std::size_t index, std::span<std::int32_t> batch);

}  // namespace strata::gpt
