// The special-token settings of a Hugging Face model folder: bos_token / eos_token (a string or an
// {"content": ...} object) and add_bos_token / add_eos_token, from tokenizer_config.json, keys it
// lacks from special_tokens_map.json. Both files are optional; a file that is present but malformed
// is a TokenizerError naming it and the key.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace strata::llm::detail {

struct SpecialTokensConfig {
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
};

SpecialTokensConfig read_special_tokens_config(const std::filesystem::path& model_dir);

}  // namespace strata::llm::detail
