// Proves docs/config.md tells the truth: every documented key is accepted, its documented default
// equals the loader's default, and every key the loader accepts is documented.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "runtime/config/config.hpp"

namespace strata::runtime {
namespace {

struct DocumentedKey {
  std::string section;
  std::string key;
  std::string default_literal;
};

std::vector<DocumentedKey> read_documented_keys() {
  std::ifstream docs(std::filesystem::path(STRATA_SOURCE_DIR) / "docs/config.md");
  EXPECT_TRUE(docs.good()) << "docs/config.md is missing";
  const std::regex heading(R"(^## \[([a-z._]+)\]\s*$)");
  const std::regex row(R"(^\| `([a-z_0-9]+)` \| [^|]+ \| `([^`]*)` \|)");
  std::vector<DocumentedKey> keys;
  std::string section;
  std::string line;
  std::smatch match;
  while (std::getline(docs, line)) {
    if (std::regex_match(line, match, heading)) {
      section = match[1];
    } else if (!section.empty() && std::regex_search(line, match, row)) {
      keys.push_back({section, match[1], match[2]});
    }
  }
  return keys;
}

// The "allowed: ..." list of an unknown-key error in `section` is the loader's own key list.
std::set<std::string> loader_keys(const std::string& section) {
  const std::string text =
      (section.empty() ? std::string() : "[" + section + "]\n") + "zz_not_a_key = 1\n";
  try {
    parse_config(text);
  } catch (const ConfigError& error) {
    std::set<std::string> keys;
    const std::string& message = error.message();
    const std::regex quoted("\"([a-z_0-9]+)\"");
    const std::string allowed = message.substr(message.find("allowed:"));
    for (auto it = std::sregex_iterator(allowed.begin(), allowed.end(), quoted);
         it != std::sregex_iterator(); ++it) {
      keys.insert((*it)[1]);
    }
    return keys;
  }
  ADD_FAILURE() << "unknown key accepted in [" << section << "]";
  return {};
}

TEST(ConfigDocs, EveryDocumentedKeyIsAcceptedWithItsDefault) {
  const std::vector<DocumentedKey> keys = read_documented_keys();
  ASSERT_GE(keys.size(), 40u);
  const Config defaults = parse_config("");
  for (const DocumentedKey& documented : keys) {
    const std::string text = "[" + documented.section + "]\n" + documented.key + " = " +
                             documented.default_literal + "\n";
    Config config;
    ASSERT_NO_THROW(config = parse_config(text)) << text;
    config.source = defaults.source;
    EXPECT_TRUE(config == defaults) << "documented default differs from the loader's:\n" << text;
  }
}

TEST(ConfigDocs, EveryLoaderKeyIsDocumented) {
  std::map<std::string, std::set<std::string>> documented;
  for (const DocumentedKey& key : read_documented_keys()) {
    documented[key.section].insert(key.key);
  }
  for (const auto& [section, keys] : documented) {
    EXPECT_EQ(loader_keys(section), keys) << "[" << section << "]";
  }
  EXPECT_EQ(loader_keys(""), (std::set<std::string>{"run", "tiers", "comm", "zero", "optimizer",
                                                    "precision", "checkpoint", "trace", "model"}));
  EXPECT_EQ(loader_keys("tiers"), (std::set<std::string>{"device", "host", "nvme"}));
}

}  // namespace
}  // namespace strata::runtime
