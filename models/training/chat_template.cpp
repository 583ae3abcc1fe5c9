#include "models/training/chat_template.hpp"

#include <stdexcept>

namespace strata::llm {
namespace {

const char* role_name(ChatMessage::Role role) {
  switch (role) {
    case ChatMessage::Role::kSystem:
      return "system";
    case ChatMessage::Role::kUser:
      return "user";
    case ChatMessage::Role::kAssistant:
      return "assistant";
  }
  return "?";
}

bool is_assistant(const ChatMessage& message) {
  return message.role == ChatMessage::Role::kAssistant;
}

std::vector<TextSegment> render_llama3(const std::vector<ChatMessage>& messages) {
  std::vector<TextSegment> segments = {{"<|begin_of_text|>", false}};
  for (const ChatMessage& message : messages) {
    segments.push_back(
        {std::string("<|start_header_id|>") + role_name(message.role) + "<|end_header_id|>\n\n",
         false});
    segments.push_back({message.content + "<|eot_id|>", is_assistant(message)});
  }
  return segments;
}

std::vector<TextSegment> render_chatml(const std::vector<ChatMessage>& messages) {
  std::vector<TextSegment> segments;
  for (const ChatMessage& message : messages) {
    segments.push_back({std::string("<|im_start|>") + role_name(message.role) + "\n", false});
    segments.push_back({message.content + "<|im_end|>", is_assistant(message)});
    segments.push_back({"\n", false});
  }
  return segments;
}

std::vector<TextSegment> render_mistral(const std::vector<ChatMessage>& messages) {
  std::vector<TextSegment> segments = {{"<s>", false}};
  std::string system;
  std::size_t first = 0;
  if (!messages.empty() && messages.front().role == ChatMessage::Role::kSystem) {
    system = messages.front().content + "\n\n";
    first = 1;
  }
  for (std::size_t i = first; i < messages.size(); ++i) {
    const bool user_turn = (i - first) % 2 == 0;
    const ChatMessage& message = messages[i];
    if (user_turn != (message.role == ChatMessage::Role::kUser) ||
        (!user_turn && !is_assistant(message))) {
      throw std::invalid_argument(
          std::string("Mistral's template needs user and assistant messages alternating "
                      "(after an optional system message); message ") +
          std::to_string(i) + " is " + role_name(message.role));
    }
    if (user_turn) {
      segments.push_back({"[INST] " + (i == first ? system : std::string()) + message.content +
                              " [/INST]",
                          false});
    } else {
      segments.push_back({message.content + "</s>", true});
    }
  }
  return segments;
}

std::vector<TextSegment> render_plain(const std::vector<ChatMessage>& messages) {
  std::vector<TextSegment> segments;
  for (const ChatMessage& message : messages) {
    segments.push_back({message.content, is_assistant(message)});
  }
  segments.push_back({"<|endoftext|>", !messages.empty() && is_assistant(messages.back())});
  return segments;
}

}  // namespace

std::vector<TextSegment> render_chat(Family family, const std::vector<ChatMessage>& messages) {
  switch (family) {
    case Family::kLlama:
      return render_llama3(messages);
    case Family::kQwen2:
      return render_chatml(messages);
    case Family::kMistral:
      return render_mistral(messages);
    case Family::kGpt2:
      return render_plain(messages);
  }
  return {};
}

std::vector<std::string> chat_special_tokens(Family family) {
  switch (family) {
    case Family::kLlama:
      return {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    case Family::kQwen2:
      return {"<|im_start|>", "<|im_end|>"};
    case Family::kMistral:
      return {"<s>", "</s>"};
    case Family::kGpt2:
      return {"<|endoftext|>"};
  }
  return {};
}

}  // namespace strata::llm
