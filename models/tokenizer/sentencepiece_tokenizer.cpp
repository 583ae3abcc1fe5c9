#include "models/tokenizer/sentencepiece_tokenizer.hpp"

#include <sentencepiece_processor.h>

#include <algorithm>

#include "models/tokenizer/tokenizer.hpp"

namespace strata::llm::detail {

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::from_file(
    const std::filesystem::path& file, SentencePieceOptions options) {
  auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = processor->Load(file.string());
  if (!status.ok()) {
    throw TokenizerError(file.string() +
                         ": not a loadable SentencePiece model: " + status.ToString());
  }
  return std::unique_ptr<SentencePieceTokenizer>(
      new SentencePieceTokenizer(std::move(processor), options, file));
}

SentencePieceTokenizer::SentencePieceTokenizer(
    std::unique_ptr<sentencepiece::SentencePieceProcessor> processor, SentencePieceOptions options,
    std::filesystem::path file)
    : processor_(std::move(processor)), options_(options), file_(std::move(file)) {
  for (int id = 0; id < processor_->GetPieceSize(); ++id) {
    if (processor_->IsControl(id) && !processor_->IdToPiece(id).empty()) control_ids_.push_back(id);
  }
  std::stable_sort(control_ids_.begin(), control_ids_.end(), [this](int a, int b) {
    return processor_->IdToPiece(a).size() > processor_->IdToPiece(b).size();
  });
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

void SentencePieceTokenizer::encode_text(std::string_view text,
                                         std::vector<std::int32_t>& ids) const {
  if (text.empty()) return;
  std::vector<int> piece_ids;
  const auto status = processor_->Encode(text, &piece_ids);
  if (!status.ok()) throw TokenizerError(file_.string() + ": encode failed: " + status.ToString());
  ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
}

std::vector<std::int32_t> SentencePieceTokenizer::encode(std::string_view text,
                                                         bool add_special_tokens) const {
  std::vector<std::int32_t> ids;
  if (add_special_tokens && options_.add_bos && processor_->bos_id() >= 0) {
    ids.push_back(processor_->bos_id());
  }
  std::size_t emitted = 0;
  for (std::size_t pos = 0; pos < text.size();) {
    const auto control = std::find_if(control_ids_.begin(), control_ids_.end(), [&](int id) {
      return text.substr(pos).starts_with(processor_->IdToPiece(id));
    });
    if (control == control_ids_.end()) {
      ++pos;
      continue;
    }
    encode_text(text.substr(emitted, pos - emitted), ids);
    ids.push_back(*control);
    pos += processor_->IdToPiece(*control).size();
    emitted = pos;
  }
  encode_text(text.substr(emitted), ids);
  if (add_special_tokens && options_.add_eos && processor_->eos_id() >= 0) {
    ids.push_back(processor_->eos_id());
  }
  return ids;
}

std::string SentencePieceTokenizer::decode_run(std::span<const std::int32_t> ids) const {
  std::string text;
  const auto status = processor_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  if (!status.ok()) throw TokenizerError(file_.string() + ": decode failed: " + status.ToString());
  return text;
}

std::string SentencePieceTokenizer::decode(std::span<const std::int32_t> ids,
                                           bool skip_special_tokens) const {
  for (const std::int32_t id : ids) {
    if (id < 0 || id >= processor_->GetPieceSize()) {
      throw TokenizerError("decode: no token has id " + std::to_string(id) + " (vocabulary of " +
                           std::to_string(processor_->GetPieceSize()) + ")");
    }
  }
  // The library itself drops control pieces when decoding.
  if (skip_special_tokens) return decode_run(ids);
  std::string text;
  std::size_t run_begin = 0;
  for (std::size_t i = 0; i <= ids.size(); ++i) {
    if (i < ids.size() && !processor_->IsControl(ids[i])) continue;
    text += decode_run(ids.subspan(run_begin, i - run_begin));
    if (i < ids.size()) text += processor_->IdToPiece(ids[i]);
    run_begin = i + 1;
  }
  return text;
}

std::optional<std::int32_t> SentencePieceTokenizer::token_to_id(std::string_view token) const {
  const int id = processor_->PieceToId(token);
  // PieceToId answers the unknown id for strings that are not pieces.
  if (processor_->IsUnknown(id) && processor_->IdToPiece(id) != token) return std::nullopt;
  return id;
}

std::optional<std::string> SentencePieceTokenizer::id_to_token(std::int32_t id) const {
  if (id < 0 || id >= processor_->GetPieceSize()) return std::nullopt;
  return processor_->IdToPiece(id);
}

std::size_t SentencePieceTokenizer::vocab_size() const {
  return static_cast<std::size_t>(processor_->GetPieceSize());
}

std::optional<std::int32_t> SentencePieceTokenizer::own_bos_id() const {
  const int id = processor_->bos_id();
  return id >= 0 ? std::optional<std::int32_t>(id) : std::nullopt;
}

std::optional<std::int32_t> SentencePieceTokenizer::own_eos_id() const {
  const int id = processor_->eos_id();
  return id >= 0 ? std::optional<std::int32_t>(id) : std::nullopt;
}

}  // namespace strata::llm::detail
