// Parsing and validating the bodies of bmoe-server's completion requests (OpenAI's
// /v1/chat/completions and /v1/completions), apart from HTTP so a fuzzer can drive it. A
// request that cannot be served raises RequestError with the HTTP status and the OpenAI error
// type, message and parameter to send back.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "chat/chat.h"
#include "chat/reply.h"
#include "engine/generate.h"
#include "serve/worker.h"
#include "text/tokenizer.h"

namespace bmoe {

struct RequestError : std::runtime_error {
  int status;
  std::string type, param, code;
  RequestError(int s, std::string t, const std::string& message, std::string p = {}, std::string c = {})
      : std::runtime_error(message), status(s), type(std::move(t)), param(std::move(p)), code(std::move(c)) {}
};

// llama-server's defaults: temperature 0.8, top-k 40, top-p 0.95, no penalties.
inline SamplerConfig server_sampling_defaults() {
  SamplerConfig c;
  c.temperature = 0.8f;
  return c;
}

// What the server fills in where a request is silent, and what it is serving.
struct RequestContext {
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // nullptr: the built-in ChatML
  int n_ctx = 4096;
  int n_predict = -1;  // default max_tokens (-1: the context for chat, 16 for completions)
  SamplerConfig sampling = server_sampling_defaults();  // defaults of the sampling fields
  bool no_think = false;
  bool ignore_eos = false;  // llama-server's ignore_eos default
  bool split_reasoning = true;  // --reasoning-format deepseek
  ToolFormat tool_format = ToolFormat::None;  // how the chat template writes tool calls
  DraftConfig draft;
  // The longest token's text in bytes (Tokenizer::longest_token_bytes): a prompt longer than
  // n_ctx such tokens cannot fit and is refused before it is tokenized (bounded memory). 0: no
  // such check.
  size_t max_token_bytes = 0;
};

struct CompletionRequest {
  std::vector<int32_t> prompt;
  GenerateParams params;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage, no choices
  ReplyOptions reply;  // chat: how the answer splits into reasoning, content and tool calls
  int n = 1;  // choices to generate per prompt, one after the other, choice i seeded params.sampler.seed + i
  // Completions with a list of prompts: the prompt of every choice (n per prompt, in order),
  // and how many prompts; empty and 1 otherwise (every choice answers `prompt`).
  std::vector<std::vector<int32_t>> choice_prompts;
  int prompts = 1;
  bool return_tokens = false;  // llama-server's: each choice also lists its token ids
  int64_t t_max_predict_ms = 0;  // llama-server's: > 0 ends an answer at a line break past it
  // llama-server's streaming extras: prompt_progress chunks, timings in every chunk, and the
  // seconds of silence before a keep-alive comment (sse_ping_interval; <= 0: none).
  bool return_progress = false, timings_per_token = false;
  double ping_seconds = 1;
  ReasoningBudget reasoning_budget;  // reasoning_budget_tokens > 0 (serve/worker.h)
  // Log-probabilities asked for (params.logprobs is the number of alternatives, -1 for none).
  bool logprobs() const { return params.logprobs >= 0; }
};

// Parses a request body; throws RequestError (4xx) for anything it cannot serve.
CompletionRequest parse_completion_request(const std::string& body, bool chat, const RequestContext& context);

// llama-server's POST /tokenize: {"content": text, "add_special": false, "with_pieces": false}.
struct TokenizeRequest {
  std::string content;
  bool add_special = false;  // add BOS where the vocabulary does
  bool with_pieces = false;  // answer [{"id", "piece"}] instead of ids
};
TokenizeRequest parse_tokenize_request(const std::string& body);
// llama-server's POST /detokenize: {"tokens": [ids]}; ids outside [0, vocab_size) are refused.
std::vector<int32_t> parse_detokenize_request(const std::string& body, int vocab_size);

}  // namespace bmoe
