// bmoe-server's answers in OpenAI's shapes: error bodies, whole completions (chat.completion,
// text_completion) and the chunks of a stream, with usage, llama-server's timings, tool calls
// and log-probabilities. Pure functions of a job's results: HTTP is the tool's business.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat/reply.h"
#include "chat/tool_calls.h"
#include "engine/generate.h"
#include "serve/worker.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

namespace bmoe {

// What every response to one completion request shares.
struct Completion {
  bool chat = false;
  ReplyOptions reply;  // chat: reasoning, harmony channels and tool calls (serve/request.h)
  bool include_usage = false;    // stream_options.include_usage
  std::string id;
  int64_t created = 0;
  std::string model;
  int n = 1;                           // choices
  bool logprobs = false;               // report log-probabilities
  const Tokenizer* tokenizer = nullptr;  // for the tokens' text in logprobs
  int prompts = 1;             // completions with a list of prompts: n / prompts choices each
  bool return_tokens = false;  // each whole choice lists its token ids (llama-server's "tokens")
  double ping_seconds = 1;     // a stream's keep-alive comment after this long silent (<= 0: none)
  // llama-server's post_sampling_probs: the log-probabilities are the sampler chain's, reported
  // as llama-server does (probs_json below) instead of OpenAI's shapes.
  bool post_sampling_probs = false;
};

// A new response id: "<prefix>-" and hex digits from the clock and a counter.
std::string new_response_id(const char* prefix);

// OpenAI's error object: {"error": {message, type, param, code}} (param and code null if empty).
nlohmann::ordered_json error_body(const std::string& type, const std::string& message, const std::string& param = {},
                                  const std::string& code = {});
// The error object for a job that failed (type by status: 503 is the shutdown).
nlohmann::ordered_json job_error(const Job& job);

// Usage over all choices: each prompt once (as OpenAI; `prompts` of them, each answered by an
// equal run of choices), the completion tokens of every choice.
nlohmann::ordered_json usage_of(const std::vector<GenerateResult>& rs, int prompts = 1);
// llama-server's "timings", summed over the choices.
nlohmann::ordered_json timings_of(const std::vector<GenerateResult>& rs);
// OpenAI's finish_reason for a GenerateResult's: "length", else "stop".
std::string finish_reason(const std::string& reason);

// OpenAI's tool_calls list, each call with a new id (`index` for stream deltas).
nlohmann::ordered_json tool_calls_json(const Completion& c, const std::vector<ToolCall>& calls, bool with_index = false);
// choices[].logprobs of the tokens `lps` (null unless asked for); `offset` carries
// completions' text_offset from one streamed chunk to the next.
nlohmann::ordered_json logprobs_of(const Completion& c, const std::vector<TokenLogprob>& lps, int64_t& offset);

// llama-server's list of per-token probabilities: {id, token, bytes, logprob, top_logprobs:
// [{id, token, bytes, logprob}]}, or with `probabilities` (post_sampling_probs) the same with
// prob and top_probs. /completion's completion_probabilities; the OpenAI endpoints' logprobs
// content with post_sampling_probs.
nlohmann::ordered_json probs_json(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, bool probabilities);

// The whole answer: one choice per result.
nlohmann::ordered_json full_response(const Completion& c, const std::vector<GenerateResult>& rs);
// A stream chunk of choice `index`: its text (or none) and finish reason (or null).
nlohmann::ordered_json chunk(const Completion& c, int index, const std::string* text, const std::string* finish);
// A server-sent event carrying `j`.
std::string sse(const nlohmann::ordered_json& j);

}  // namespace bmoe
