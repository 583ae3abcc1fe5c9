// Unicode Normalization Form C through ICU (Debian's libicu), the "NFC" normalizer of
// tokenizer.json (Qwen2 sets it). Contract: the input is valid UTF-8; the output is too.
#pragma once

#include <string>
#include <string_view>

namespace strata::llm::detail {

std::string to_nfc(std::string_view text);

}  // namespace strata::llm::detail
