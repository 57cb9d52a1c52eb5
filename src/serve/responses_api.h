// OpenAI's Responses API (POST /v1/responses) on bmoe-server: a request (input items,
// instructions, function tools, text.format, previous_response_id) is translated into the chat
// completion request it amounts to, so it runs through the same checks, template, grammar and
// decode path; the answer comes back as output items (reasoning, message, function_call), whole
// or as the documented event stream. Errors keep OpenAI's shape.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "serve/reply_stream.h"
#include "serve/request.h"

namespace bmoe {

// The conversations of earlier responses, for previous_response_id: kept for the server's life,
// the oldest dropped past `capacity`.
class ResponseStore {
 public:
  explicit ResponseStore(size_t capacity = 4096) : capacity_(capacity) {}
  void put(const std::string& id, nlohmann::ordered_json messages);
  bool get(const std::string& id, nlohmann::ordered_json& messages) const;

 private:
  size_t capacity_;
  mutable std::mutex mutex_;
  std::map<std::string, nlohmann::ordered_json> conversations_;
  std::deque<std::string> order_;
};

struct ResponsesRequest {
  CompletionRequest chat;  // what /v1/chat/completions would run
  nlohmann::ordered_json history;  // the conversation without instructions, kept for the next turn
  nlohmann::ordered_json echo;     // the request's settings, repeated in the response object
};

// Parses a Responses body; throws RequestError.
ResponsesRequest parse_responses_request(const std::string& body, const RequestContext& context, const ResponseStore& store);

// What every answer to one Responses request shares.
struct ResponsesAnswer {
  std::string id;
  int64_t created = 0;
  std::string model;
  ReplyOptions reply;
  nlohmann::ordered_json history;  // see ResponsesRequest
  nlohmann::ordered_json echo;
  ResponseStore* store = nullptr;  // where the finished conversation goes
};

// The whole response object (and its conversation into the store).
nlohmann::ordered_json responses_response(const ResponsesAnswer& a, const GenerateResult& r);
// Its event stream: response.created, in_progress, each item's added / deltas / done events,
// response.completed (or response.failed).
std::shared_ptr<JobStream> responses_stream(const ResponsesAnswer& a);

}  // namespace bmoe
