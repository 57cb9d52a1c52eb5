// Anthropic's Messages API (POST /v1/messages and /v1/messages/count_tokens) on bmoe-server: a
// request is translated into the chat completion request it amounts to, so it runs through the
// same checks, template, grammar and decode path; the answer comes back as Anthropic's content
// blocks (thinking, text, tool_use), whole or as its stream of events, and errors in its shape.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/reply_stream.h"
#include "serve/request.h"

namespace bmoe {

struct MessagesRequest {
  CompletionRequest chat;  // what /v1/chat/completions would run
  std::vector<std::string> stop_sequences;
};

// Parses a Messages body; throws RequestError. `count_only` (count_tokens): max_tokens is not
// required.
MessagesRequest parse_messages_request(const std::string& body, const RequestContext& context, bool count_only);

// The OpenAI chat body a Messages body amounts to (exposed for the tests).
nlohmann::ordered_json messages_to_chat_body(const nlohmann::ordered_json& body, bool count_only);

// {"type": "error", "error": {"type": ..., "message": ...}}, the type from the HTTP status.
nlohmann::ordered_json anthropic_error(int status, const std::string& message);

// What every answer to one Messages request shares.
struct MessagesAnswer {
  std::string id;
  std::string model;
  ReplyOptions reply;
  std::vector<std::string> stop_sequences;
  const Tokenizer* tokenizer = nullptr;
};

// The whole message: content blocks, stop_reason, usage.
nlohmann::ordered_json messages_response(const MessagesAnswer& a, const GenerateResult& r);
// Its event stream: message_start, each block's start, deltas and stop, message_delta,
// message_stop (or an error event).
std::shared_ptr<JobStream> messages_stream(const MessagesAnswer& a, int input_tokens);

}  // namespace bmoe
