#include "models/tokenizer/special_tokens_config.hpp"

#include "models/tokenizer/json_location.hpp"

namespace strata::llm::detail {
namespace {

std::optional<std::string> token_text(const JsonLocation& config, std::string_view key) {
  if (!config.has(key)) return std::nullopt;
  const JsonLocation value = config.at(key);
  if (value.node().is_object()) return value.at("content").string();
  return value.string();
}

void fill_from(const std::filesystem::path& file, SpecialTokensConfig& config) {
  if (!std::filesystem::exists(file)) return;
  const nlohmann::json json = read_json_file(file);
  const JsonLocation root(json, file);
  if (!json.is_object()) root.fail("expected a JSON object");
  if (!config.bos_token) config.bos_token = token_text(root, "bos_token");
  if (!config.eos_token) config.eos_token = token_text(root, "eos_token");
  if (!config.add_bos_token && root.has("add_bos_token")) {
    config.add_bos_token = root.at("add_bos_token").boolean();
  }
  if (!config.add_eos_token && root.has("add_eos_token")) {
    config.add_eos_token = root.at("add_eos_token").boolean();
  }
}

}  // namespace

SpecialTokensConfig read_special_tokens_config(const std::filesystem::path& model_dir) {
  SpecialTokensConfig config;
  fill_from(model_dir / "tokenizer_config.json", config);
  fill_from(model_dir / "special_tokens_map.json", config);
  return config;
}

}  // namespace strata::llm::detail
