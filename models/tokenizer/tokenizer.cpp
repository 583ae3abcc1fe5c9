#include "models/tokenizer/tokenizer.hpp"

#include "models/tokenizer/hf_tokenizer.hpp"
#include "models/tokenizer/sentencepiece_tokenizer.hpp"
#include "models/tokenizer/special_tokens_config.hpp"

namespace strata::llm {

struct Tokenizer::Impl {
  std::unique_ptr<detail::TokenizerBackend> backend;
  std::optional<std::int32_t> bos_id;
  std::optional<std::int32_t> eos_id;
};

namespace {

// A configured special token must exist: a name the vocabulary lacks is a broken folder.
std::optional<std::int32_t> id_of_configured(const detail::TokenizerBackend& backend,
                                             const std::optional<std::string>& token,
                                             std::string_view key,
                                             const std::filesystem::path& model_dir) {
  if (!token) return std::nullopt;
  const auto id = backend.token_to_id(*token);
  if (!id) {
    throw TokenizerError(model_dir.string() + ": " + std::string(key) + " '" + *token +
                         "' (tokenizer_config.json / special_tokens_map.json) is not in the "
                         "tokenizer's vocabulary");
  }
  return id;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::load(const std::filesystem::path& model_dir) {
  const detail::SpecialTokensConfig config = detail::read_special_tokens_config(model_dir);
  auto impl = std::make_unique<Impl>();
  if (std::filesystem::exists(model_dir / "tokenizer.json")) {
    impl->backend = detail::HfTokenizer::from_file(model_dir / "tokenizer.json");
  } else if (std::filesystem::exists(model_dir / "tokenizer.model")) {
    detail::SentencePieceOptions options;
    options.add_bos = config.add_bos_token.value_or(options.add_bos);
    options.add_eos = config.add_eos_token.value_or(options.add_eos);
    impl->backend =
        detail::SentencePieceTokenizer::from_file(model_dir / "tokenizer.model", options);
  } else {
    throw TokenizerError(model_dir.string() + ": neither tokenizer.json nor tokenizer.model found");
  }
  impl->bos_id = id_of_configured(*impl->backend, config.bos_token, "bos_token", model_dir);
  impl->eos_id = id_of_configured(*impl->backend, config.eos_token, "eos_token", model_dir);
  if (!impl->bos_id) impl->bos_id = impl->backend->own_bos_id();
  if (!impl->eos_id) impl->eos_id = impl->backend->own_eos_id();
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_tokenizer_json(const std::filesystem::path& file) {
  auto impl = std::make_unique<Impl>();
  impl->backend = detail::HfTokenizer::from_file(file);
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_sentencepiece(const std::filesystem::path& file) {
  auto impl = std::make_unique<Impl>();
  impl->backend = detail::SentencePieceTokenizer::from_file(file, detail::SentencePieceOptions{});
  impl->bos_id = impl->backend->own_bos_id();
  impl->eos_id = impl->backend->own_eos_id();
  return Tokenizer(std::move(impl));
}

std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->backend->encode(text, add_special_tokens);
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids, bool skip_special_tokens) const {
  return impl_->backend->decode(ids, skip_special_tokens);
}

std::optional<std::int32_t> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->backend->token_to_id(token);
}

std::string Tokenizer::id_to_token(std::int32_t id) const {
  auto token = impl_->backend->id_to_token(id);
  if (!token) throw TokenizerError("id_to_token: no token has id " + std::to_string(id));
  return *std::move(token);
}

std::size_t Tokenizer::vocab_size() const {
  return impl_->backend->vocab_size();
}
std::optional<std::int32_t> Tokenizer::bos_id() const {
  return impl_->bos_id;
}
std::optional<std::int32_t> Tokenizer::eos_id() const {
  return impl_->eos_id;
}

}  // namespace strata::llm
