// The built-in chat templates, one per family, rendering JSONL training examples into text
// segments, each marked as trained (its tokens count in the loss) or not. docs/llm.md shows each
// template written out.
//   Llama (3.x): <|begin_of_text|> then per message
//                <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
//   Qwen2 (ChatML): per message <|im_start|>{role}\n{content}<|im_end|>\n
//   Mistral: <s>[INST] {system}\n\n{user} [/INST]{assistant}</s>[INST] {user} [/INST]...
//            (a system message is prepended to the first user message)
//   GPT-2: the contents concatenated, then <|endoftext|> (GPT-2 has no chat format)
// Trained: the content of every assistant message and the token that closes it (<|eot_id|>,
// <|im_end|>, </s>; GPT-2: the final <|endoftext|> after an assistant message).
#pragma once

#include <string>
#include <vector>

#include "models/decoder/hf_config.hpp"

namespace strata::llm {

struct ChatMessage {
  enum class Role : std::uint8_t { kSystem, kUser, kAssistant };
  Role role = Role::kUser;
  std::string content;
};

struct TextSegment {
  std::string text;
  bool trained = false;
};

// Throws std::invalid_argument for a conversation the template cannot express (Mistral: roles
// must alternate user / assistant after an optional leading system message).
std::vector<TextSegment> render_chat(Family family, const std::vector<ChatMessage>& messages);

// The special tokens the family's template writes; the tokenizer must know each of them.
std::vector<std::string> chat_special_tokens(Family family);

}  // namespace strata::llm
