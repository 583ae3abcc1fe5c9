#include "models/checkpoint/hf_export.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "base/assert.hpp"
#include "base/float16.hpp"
#include "models/checkpoint/file_io.hpp"
#include "io/whole_file.hpp"
#include "models/checkpoint/hf_checkpoint.hpp"
#include "runtime/checkpoint/safetensors.hpp"

namespace strata::llm {
namespace {

// Elements converted per write: bounds the conversion buffer whatever the tensor's size.
constexpr std::size_t kChunkElements = 1 << 16;

std::string shard_file_name(std::size_t shard, std::size_t shards) {
  if (shards == 1) return kSingleFileName;
  return fmt::format("model-{:05}-of-{:05}.safetensors", shard + 1, shards);
}

bool is_weight_file(const std::string& name) {
  if (name == kSingleFileName || name == kIndexFileName) return true;
  return name.starts_with("model-") && name.find("-of-") != std::string::npos &&
         name.ends_with(".safetensors");
}

// The shard's header, padded with spaces to a multiple of 8 bytes as transformers writes it.
std::string shard_header(const ShardPlan& plan, std::size_t shard, DType dtype) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  for (const PlannedTensor& tensor : plan.tensors) {
    if (tensor.shard != shard) continue;
    header[tensor.name] = {{"dtype", runtime::safetensors_dtype_name(dtype)},
                           {"shape", tensor.shape},
                           {"data_offsets", {tensor.begin_bytes, tensor.end_bytes}}};
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  return text;
}

void write_converted(io::AtomicFileWriter& file, std::span<const float> values, DType dtype) {
  if (dtype == DType::kFp32) {
    file.append(std::as_bytes(values));
    return;
  }
  std::vector<std::uint16_t> halves;
  for (std::size_t begin = 0; begin < values.size(); begin += kChunkElements) {
    const std::span<const float> chunk =
        values.subspan(begin, std::min(kChunkElements, values.size() - begin));
    halves.resize(chunk.size());
    for (std::size_t i = 0; i < chunk.size(); ++i) {
      halves[i] = dtype == DType::kBf16 ? to_bf16(chunk[i]).bits
                                                 : to_fp16(chunk[i]).bits;
    }
    file.append(std::as_bytes(std::span<const std::uint16_t>(halves)));
  }
}

// config.json's name of an export dtype (ExportOptions holds bf16, fp16 or fp32).
const char* config_dtype_name(DType dtype) {
  if (dtype == DType::kBf16) return "bfloat16";
  if (dtype == DType::kFp16) return "float16";
  return "float32";
}

}  // namespace

void record_export_dtype(const std::filesystem::path& config_json, DType dtype) {
  if (!std::filesystem::exists(config_json)) return;
  nlohmann::ordered_json config =
      nlohmann::ordered_json::parse(read_text_file(config_json), nullptr, false);
  if (!config.is_object()) {
    throw CheckpointError(config_json.string() + ": not a JSON object; cannot record the dtype");
  }
  const std::string name = config_dtype_name(dtype);
  // transformers 5 writes `dtype`, earlier versions `torch_dtype`: update whichever is there.
  bool changed = false;
  bool present = false;
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (!config.contains(key)) continue;
    present = true;
    if (config[key] == name) continue;
    config[key] = name;
    changed = true;
  }
  if (!present) {
    config["torch_dtype"] = name;
    changed = true;
  }
  if (changed) io::write_file_atomically(config_json, config.dump(2) + "\n");
}

const std::vector<std::string>& model_side_files() {
  static const std::vector<std::string> kFiles = {
      "config.json",         "generation_config.json", "tokenizer.json",
      "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
      "vocab.json",          "merges.txt",             "added_tokens.json"};
  return kFiles;
}

void prepare_export_folder(const std::filesystem::path& source_dir,
                           const std::filesystem::path& out_dir) {
  if (!std::filesystem::exists(source_dir / "config.json")) {
    throw CheckpointError((source_dir / "config.json").string() +
                          ": missing (the export copies it)");
  }
  std::filesystem::create_directories(out_dir);
  if (std::filesystem::equivalent(source_dir, out_dir)) {
    throw CheckpointError("export folder " + out_dir.string() +
                          " is the model folder it reads from; choose another");
  }
  for (const std::string& name : model_side_files()) {
    if (!std::filesystem::exists(source_dir / name)) continue;
    std::filesystem::copy_file(source_dir / name, out_dir / name,
                               std::filesystem::copy_options::overwrite_existing);
  }
}

ShardPlan plan_shards(const std::vector<UnitSpec>& units, const ExportOptions& options) {
  ShardPlan plan;
  const std::uint32_t width = dtype_bytes(options.dtype);
  std::size_t shard = 0;
  std::uint64_t used = 0;
  for (const UnitSpec& unit : units) {
    for (const TensorSpec& spec : unit.tensors) {
      const std::uint64_t bytes = std::uint64_t{spec.numel()} * width;
      if (used > 0 && used + bytes > options.max_shard_bytes) {
        ++shard;
        used = 0;
      }
      plan.tensors.push_back({stored_name(spec.hf_name, options.gpt2_prefix_stripped), spec.shape,
                              shard, used, used + bytes});
      used += bytes;
      plan.total_bytes += bytes;
    }
  }
  const std::size_t shards = plan.tensors.empty() ? 1 : shard + 1;
  for (std::size_t s = 0; s < shards; ++s) plan.file_names.push_back(shard_file_name(s, shards));
  return plan;
}

HfExportWriter::HfExportWriter(const std::filesystem::path& out_dir, std::vector<UnitSpec> units,
                               const ExportOptions& options)
    : out_dir_(out_dir), units_(std::move(units)), options_(options) {
  std::filesystem::create_directories(out_dir_);
  for (const auto& entry : std::filesystem::directory_iterator(out_dir_)) {
    if (is_weight_file(entry.path().filename().string())) std::filesystem::remove(entry.path());
  }
  plan_ = plan_shards(units_, options_);
}

HfExportWriter::~HfExportWriter() = default;

void HfExportWriter::open_shard(std::size_t shard) {
  if (shard_) shard_->commit();
  shard_ = std::make_unique<io::AtomicFileWriter>(io::AtomicFileWriter::create(out_dir_ / plan_.file_names[shard]));
  const std::string header = shard_header(plan_, shard, options_.dtype);
  const std::uint64_t length = header.size();
  shard_->append(std::as_bytes(std::span<const std::uint64_t>(&length, 1)));
  shard_->append(std::as_bytes(std::span<const char>(header)));
  open_index_ = shard;
}

void HfExportWriter::write_unit(std::size_t index, std::span<const float> values) {
  STRATA_ASSERT(index == next_unit_, "units must be exported in order");
  const UnitSpec& unit = units_[index];
  STRATA_ASSERT(values.size() == unit.numel);
  for (const TensorSpec& spec : unit.tensors) {
    const PlannedTensor& planned = plan_.tensors[next_tensor_++];
    if (open_index_ != planned.shard) open_shard(planned.shard);
    write_converted(*shard_, values.subspan(spec.offset, spec.numel()), options_.dtype);
  }
  ++next_unit_;
}

void HfExportWriter::finish() {
  STRATA_ASSERT(next_unit_ == units_.size(), "finish() before the last unit");
  if (!shard_) open_shard(0);  // a model without tensors still gets its (empty) file
  shard_->commit();
  shard_.reset();
  record_export_dtype(out_dir_ / "config.json", options_.dtype);
  if (plan_.file_names.size() == 1) return;
  nlohmann::json index;
  index["metadata"] = {{"total_size", plan_.total_bytes}};
  index["weight_map"] = nlohmann::json::object();
  for (const PlannedTensor& tensor : plan_.tensors) {
    index["weight_map"][tensor.name] = plan_.file_names[tensor.shard];
  }
  io::write_file_atomically(out_dir_ / kIndexFileName, index.dump(2) + "\n");
}

}  // namespace strata::llm
