#include "models/checkpoint/hf_checkpoint.hpp"

#include <algorithm>
#include <set>

#include <nlohmann/json.hpp>

#include "base/assert.hpp"

namespace strata::llm {
namespace {

constexpr std::string_view kGpt2Prefix = "transformer.";

bool ends_with(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The shard files named by the index, in first-mention order, and the file of each tensor.
std::vector<std::string> index_shards(const std::filesystem::path& index_path,
                                      std::map<std::string, std::string>& weight_map) {
  const std::string where = index_path.string();
  const nlohmann::json index =
      nlohmann::json::parse(read_text_file(index_path), nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) {
    throw CheckpointError(where + ": not a JSON object");
  }
  if (!index.contains("weight_map") || !index["weight_map"].is_object()) {
    throw CheckpointError(where + ": key 'weight_map' missing or not an object");
  }
  std::vector<std::string> shards;
  for (const auto& [tensor, file] : index["weight_map"].items()) {
    if (!file.is_string()) {
      throw CheckpointError(where + ": weight_map['" + tensor + "'] is not a file name");
    }
    const std::string name = file.get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
      throw CheckpointError(where + ": weight_map['" + tensor + "'] = '" + name +
                            "' is not a file name in the model folder");
    }
    if (std::find(shards.begin(), shards.end(), name) == shards.end()) shards.push_back(name);
    weight_map[tensor] = name;
  }
  return shards;
}

}  // namespace

bool is_known_buffer(const std::string& stored_name) {
  return ends_with(stored_name, "rotary_emb.inv_freq") || ends_with(stored_name, ".attn.bias") ||
         ends_with(stored_name, ".attn.masked_bias");
}

HfCheckpoint HfCheckpoint::open(const std::filesystem::path& model_dir) {
  HfCheckpoint checkpoint;
  checkpoint.dir_ = model_dir;
  std::map<std::string, std::string> weight_map;
  if (std::filesystem::exists(model_dir / kIndexFileName)) {
    checkpoint.sharded_ = true;
    for (const std::string& shard : index_shards(model_dir / kIndexFileName, weight_map)) {
      checkpoint.paths_.push_back(model_dir / shard);
    }
  } else if (std::filesystem::exists(model_dir / kSingleFileName)) {
    checkpoint.paths_.push_back(model_dir / kSingleFileName);
  } else {
    throw CheckpointError(model_dir.string() + ": no " + kSingleFileName + " nor " +
                          kIndexFileName + " (a Hugging Face model folder in safetensors format)");
  }
  checkpoint.files_.reserve(checkpoint.paths_.size());
  for (std::size_t f = 0; f < checkpoint.paths_.size(); ++f) {
    checkpoint.files_.push_back(runtime::SafetensorsReader::open(
        checkpoint.paths_[f], runtime::SafetensorsRules::kAnyCheckpoint));
    const std::string file_name = checkpoint.paths_[f].filename().string();
    for (const runtime::SafetensorsEntry& tensor : checkpoint.files_.back().entries()) {
      if (checkpoint.sharded_) {
        const auto mapped = weight_map.find(tensor.name);
        if (mapped == weight_map.end() || mapped->second != file_name) {
          throw CheckpointError(checkpoint.paths_[f].string() + ": tensor '" + tensor.name +
                                "' is not mapped to this file by " + kIndexFileName);
        }
      }
      const auto [at, inserted] = checkpoint.tensors_.emplace(tensor.name, Location{f, &tensor});
      if (!inserted) {
        throw CheckpointError(checkpoint.paths_[f].string() + ": tensor '" + tensor.name +
                              "' also stored in " + checkpoint.paths_[at->second.file].string());
      }
    }
  }
  for (const auto& [tensor, file] : weight_map) {
    if (checkpoint.tensors_.count(tensor) == 0) {
      throw CheckpointError((model_dir / kIndexFileName).string() + ": tensor '" + tensor +
                            "' mapped to " + file + ", which does not hold it");
    }
  }
  // GPT-2 without the "transformer." prefix: its embedding is stored as plain "wte.weight".
  checkpoint.gpt2_prefix_stripped_ =
      checkpoint.tensors_.count("wte.weight") != 0 &&
      checkpoint.tensors_.count("transformer.wte.weight") == 0;
  return checkpoint;
}

std::string stored_name(const std::string& hf_name, bool gpt2_prefix_stripped) {
  if (gpt2_prefix_stripped && hf_name.starts_with(kGpt2Prefix)) {
    return hf_name.substr(kGpt2Prefix.size());
  }
  return hf_name;
}

std::string HfCheckpoint::stored_name(const std::string& hf_name) const {
  return llm::stored_name(hf_name, gpt2_prefix_stripped_);
}

const HfCheckpoint::Location& HfCheckpoint::locate(const std::string& hf_name) const {
  const auto found = tensors_.find(stored_name(hf_name));
  STRATA_ASSERT(found != tensors_.end(), "read before check()");
  return found->second;
}

void HfCheckpoint::check(const std::vector<UnitSpec>& units) const {
  const std::string where =
      sharded_ ? (dir_ / kIndexFileName).string() : paths_.front().string();
  std::set<std::string> expected;
  for (const UnitSpec& unit : units) {
    for (const TensorSpec& spec : unit.tensors) {
      const std::string name = stored_name(spec.hf_name);
      expected.insert(name);
      const auto found = tensors_.find(name);
      if (found == tensors_.end()) {
        throw CheckpointError("tensor '" + name + "' missing from " + where);
      }
      const runtime::SafetensorsEntry& stored = *found->second.tensor;
      const std::string file = paths_[found->second.file].string();
      if (stored.shape != spec.shape) {
        throw CheckpointError("tensor '" + name + "' in " + file + " has shape " +
                              runtime::shape_text(stored.shape) + ", the model expects " +
                              runtime::shape_text(spec.shape));
      }
      if (!stored.dtype) {
        throw CheckpointError("tensor '" + name + "' in " + file + " has dtype " +
                              stored.dtype_name + " (supported: F32, BF16, F16)");
      }
    }
  }
  for (const auto& [name, location] : tensors_) {
    if (expected.count(name) != 0 || is_known_buffer(name)) continue;
    if (name == "lm_head.weight") continue;  // the model's head is tied: it is the embedding
    throw CheckpointError("unexpected tensor '" + name + "' in " +
                          paths_[location.file].string() + ": the model has no such parameter");
  }
}

void HfCheckpoint::read_unit_range(const UnitSpec& unit, std::size_t first,
                                   std::span<float> out) const {
  STRATA_ASSERT(first + out.size() <= unit.numel);
  const std::size_t last = first + out.size();
  for (const TensorSpec& spec : unit.tensors) {
    const std::size_t begin = std::max(first, spec.offset);
    const std::size_t end = std::min(last, spec.offset + spec.numel());
    if (begin >= end) continue;
    const Location& location = locate(spec.hf_name);
    files_[location.file].read_fp32(*location.tensor, begin - spec.offset,
                                    out.subspan(begin - first, end - begin));
    *bytes_read_ += (end - begin) * dtype_bytes(*location.tensor->dtype);
  }
}

}  // namespace strata::llm
