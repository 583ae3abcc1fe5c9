// Export of a model folder in the layout Hugging Face transformers' `from_pretrained` loads:
//   - config.json and the tokenizer files copied from the source folder (as they are), except that
//     config.json's torch_dtype (or transformers 5's dtype) is set to the dtype the weights are
//     stored in, as save_pretrained writes it (from_pretrained(torch_dtype="auto") loads by it);
//   - the weights as safetensors, named and shaped as the source checkpoint stores them, in the
//     chosen dtype (bf16 by default), either one `model.safetensors` or, when they exceed
//     max_shard_bytes, shards `model-0000i-of-0000N.safetensors` of at most that size (a tensor
//     larger than the limit gets a shard of its own) with `model.safetensors.index.json`
//     ({"metadata": {"total_size"}, "weight_map"}).
// Streamed: units arrive one at a time, in order, and go straight into the open shard; host
// memory stays O(one unit). Shard sizes are planned from the shapes before any data is written.
// Earlier weight files in the output folder (model.safetensors, model-*-of-*.safetensors, the
// index) are removed first so that transformers cannot pick up a stale one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "models/decoder/decoder_model.hpp"
#include "io/whole_file.hpp"
#include "runtime/config/config.hpp"

namespace strata::llm {

struct ExportOptions {
  DType dtype = DType::kBf16;
  std::uint64_t max_shard_bytes = 5'000'000'000;  // transformers' default "5GB"
  bool gpt2_prefix_stripped = false;              // HfCheckpoint::gpt2_prefix_stripped()
};

// The files a model folder carries besides its weights, copied when present (config.json must be).
const std::vector<std::string>& model_side_files();
// Creates `out_dir` (refusing `source_dir` itself) and copies the side files into it.
void prepare_export_folder(const std::filesystem::path& source_dir,
                           const std::filesystem::path& out_dir);

// Sets `config_json`'s torch_dtype / dtype (whichever it has; torch_dtype when neither) to
// `dtype`'s name ("bfloat16", "float16", "float32"); rewrites the file only when that changes it.
// Nothing when the file is missing; CheckpointError when it is not a JSON object.
void record_export_dtype(const std::filesystem::path& config_json, DType dtype);

// One tensor of the export, its shard and byte range within that shard's data.
struct PlannedTensor {
  std::string name;  // stored name
  std::vector<std::size_t> shape;
  std::size_t shard = 0;
  std::uint64_t begin_bytes = 0;
  std::uint64_t end_bytes = 0;
};

struct ShardPlan {
  std::vector<PlannedTensor> tensors;  // in unit order
  std::vector<std::string> file_names;
  std::uint64_t total_bytes = 0;
};

ShardPlan plan_shards(const std::vector<UnitSpec>& units, const ExportOptions& options);

class HfExportWriter {
 public:
  // Removes earlier weight files from `out_dir` (created if missing) and plans the shards.
  HfExportWriter(const std::filesystem::path& out_dir, std::vector<UnitSpec> units,
                 const ExportOptions& options);
  ~HfExportWriter();
  HfExportWriter(const HfExportWriter&) = delete;
  HfExportWriter& operator=(const HfExportWriter&) = delete;

  // Unit `index`'s flat fp32 values; units must come in order 0, 1, ...
  void write_unit(std::size_t index, std::span<const float> values);
  // After the last unit: commits the last shard, records the dtype in out_dir/config.json (when
  // there is one) and writes the index (sharded exports).
  void finish();
  const ShardPlan& plan() const { return plan_; }

 private:
  void open_shard(std::size_t shard);

  std::filesystem::path out_dir_;
  std::vector<UnitSpec> units_;
  ExportOptions options_;
  ShardPlan plan_;
  std::size_t next_unit_ = 0;
  std::size_t next_tensor_ = 0;
  std::optional<std::size_t> open_index_;
  std::unique_ptr<io::AtomicFileWriter> shard_;
};

}  // namespace strata::llm
