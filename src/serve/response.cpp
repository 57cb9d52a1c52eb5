#include "serve/response.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <random>

#include "text/utf8.h"

namespace bmoe {
namespace {

using json = nlohmann::ordered_json;  // keys in the order OpenAI writes them

// A masked token's logprob is -inf, which JSON cannot carry: OpenAI reports -9999 for those.
double finite_logprob(float lp) { return std::max(static_cast<double>(lp), -9999.0); }

// Chat: {token, logprob, bytes} (bytes: the token's raw bytes, which may be part of a character).
json chat_token(const Tokenizer& tok, int32_t id, float logprob) {
  const std::string bytes = tok.token_bytes(id, true);
  json raw = json::array();
  for (char b : bytes) raw.push_back(static_cast<unsigned char>(b));
  return {{"token", utf8_sanitize(bytes)}, {"logprob", finite_logprob(logprob)}, {"bytes", raw}};
}

// Chat's choices[].logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}.
json chat_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& lps) {
  json content = json::array();
  for (const TokenLogprob& lp : lps) {
    json entry = chat_token(tok, lp.token, lp.logprob);
    entry["top_logprobs"] = json::array();
    for (const auto& [id, logprob] : lp.top) entry["top_logprobs"].push_back(chat_token(tok, id, logprob));
    content.push_back(std::move(entry));
  }
  return {{"content", content}, {"refusal", nullptr}};
}

// One token of llama-server's list: its id, text, raw bytes and (log-)probability.
json llama_token(const Tokenizer& tok, int32_t id, float logprob, bool probabilities) {
  const std::string bytes = tok.token_bytes(id, true);
  json raw = json::array();
  for (char b : bytes) raw.push_back(static_cast<unsigned char>(b));
  json entry = {{"id", id}, {"token", utf8_sanitize(bytes)}, {"bytes", raw}};
  if (probabilities) entry["prob"] = std::exp(static_cast<double>(logprob));
  else entry["logprob"] = finite_logprob(logprob);
  return entry;
}

// Completions' legacy object: tokens, token_logprobs, top_logprobs ({text: logprob}) and
// text_offset, the character offset of each token in the choice's text. `offset` carries the
// count on from one streamed chunk to the next.
json completion_logprobs(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, int64_t& offset) {
  json tokens = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob& lp : lps) {
    const std::string bytes = tok.token_bytes(lp.token, true);
    tokens.push_back(utf8_sanitize(bytes));
    logprobs.push_back(finite_logprob(lp.logprob));
    json top = json::object();
    for (const auto& [id, logprob] : lp.top) top[utf8_sanitize(tok.token_bytes(id, true))] = finite_logprob(logprob);
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    // Characters begin at bytes that are not UTF-8 continuation bytes (10xxxxxx).
    for (char b : bytes) offset += (static_cast<unsigned char>(b) & 0xC0) != 0x80;
  }
  return {{"tokens", tokens}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

// The seed of a tool call's random id: a fresh one per call, so ids never repeat across answers.
uint64_t fresh_seed() {
  std::random_device device;
  return static_cast<uint64_t>(device()) << 32 | device();
}

// A chat choice's message: the text split into reasoning, content and tool calls.
json chat_choice(const Completion& c, const GenerateResult& r, json choice) {
  ReplyParser parser(c.reply);
  ReplyDelta d = parser.feed(r.text);
  d.append(parser.finish());
  const json calls = tool_calls_json(c, parser.tool_calls());
  choice["message"] = {{"role", "assistant"}, {"content", d.content.empty() && !calls.empty() ? json(nullptr) : json(utf8_sanitize(d.content))}};
  if (!d.reasoning.empty()) choice["message"]["reasoning_content"] = utf8_sanitize(d.reasoning);
  if (!calls.empty()) {
    choice["message"]["tool_calls"] = calls;
    // An answer cut by max_tokens says so, even after a complete call (a later one was lost).
    if (r.finish_reason != "length") choice["finish_reason"] = "tool_calls";
  }
  return choice;
}

json full_choice(const Completion& c, const GenerateResult& r, int index) {
  json choice = {{"index", index}, {"finish_reason", finish_reason(r.finish_reason)}};
  int64_t offset = 0;
  choice["logprobs"] = logprobs_of(c, r.logprobs, offset);
  if (c.return_tokens) choice["tokens"] = r.tokens;
  if (c.chat) return chat_choice(c, r, std::move(choice));
  choice["text"] = utf8_sanitize(r.text);
  return choice;
}

}  // namespace

std::string new_response_id(const char* prefix) {
  static std::atomic<uint64_t> counter{0};
  const auto now = std::chrono::system_clock::now().time_since_epoch().count();
  return fmt::format("{}-{:x}{:04x}", prefix, static_cast<uint64_t>(now) & 0xffffffffffull, counter.fetch_add(1) & 0xffff);
}

json error_body(const std::string& type, const std::string& message, const std::string& param, const std::string& code) {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (!param.empty()) e["param"] = param;
  if (!code.empty()) e["code"] = code;
  return {{"error", e}};
}

json job_error(const Job& job) {
  return error_body(job.error_status == 503 ? "server_shutting_down" : "server_error", job.error);
}

json usage_of(const std::vector<GenerateResult>& rs, int prompts) {
  const size_t per_prompt = std::max<size_t>(1, rs.size() / static_cast<size_t>(std::max(prompts, 1)));
  int prompt = 0, cached = 0, completion = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    if (i % per_prompt == 0) {
      prompt += rs[i].prompt_tokens;
      cached += rs[i].reused_tokens;
    }
    completion += static_cast<int>(rs[i].tokens.size());
  }
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

// Prompt tokens evaluated (cache_n came from the kept prefix) and generated, with their times
// and rates; each choice after the first evaluates the prompt's last token again.
json timings_of(const std::vector<GenerateResult>& rs) {
  int reused = 0, evaluated = 0, generated = 0;
  int64_t drafted = 0, accepted = 0;
  double prompt_ms = 0, predicted_ms = 0;
  for (const GenerateResult& r : rs) {
    drafted += r.drafted;
    accepted += r.accepted;
    reused += r.reused_tokens;
    evaluated += r.prompt_tokens - r.reused_tokens;
    generated += static_cast<int>(r.tokens.size());
    prompt_ms += r.prefill_seconds * 1e3;
    predicted_ms += r.decode_seconds * 1e3;
  }
  json t = {{"cache_n", reused},
          {"prompt_n", evaluated},
          {"prompt_ms", prompt_ms},
          {"prompt_per_token_ms", evaluated > 0 ? prompt_ms / evaluated : 0.0},
          {"prompt_per_second", prompt_ms > 0 ? evaluated * 1e3 / prompt_ms : 0.0},
          {"predicted_n", generated},
          {"predicted_ms", predicted_ms},
          {"predicted_per_token_ms", generated > 0 ? predicted_ms / generated : 0.0},
          {"predicted_per_second", predicted_ms > 0 ? generated * 1e3 / predicted_ms : 0.0}};
  if (drafted > 0) {  // speculative decoding (--draft): llama-server's names
    t["draft_n"] = drafted;
    t["draft_n_accepted"] = accepted;
  }
  return t;
}

std::string finish_reason(const std::string& reason) { return reason == "length" ? "length" : "stop"; }

// Calls appear only when the request gave tools (a harmony answer may call a function unasked:
// dropped). A format whose model writes its own ids (Mistral's) keeps them.
json tool_calls_json(const Completion& c, const std::vector<ToolCall>& calls, bool with_index) {
  json out = json::array();
  if (c.reply.tools == ToolFormat::None) return out;
  for (size_t i = 0; i < calls.size(); ++i) {
    json call = with_index ? json{{"index", i}} : json::object();
    call["id"] = calls[i].id.empty() ? new_tool_call_id(c.reply.tools, fresh_seed()) : calls[i].id;
    call["type"] = "function";
    call["function"] = {{"name", utf8_sanitize(calls[i].name)}, {"arguments", utf8_sanitize(calls[i].arguments)}};
    out.push_back(std::move(call));
  }
  return out;
}

json probs_json(const Tokenizer& tok, const std::vector<TokenLogprob>& lps, bool probabilities) {
  json out = json::array();
  for (const TokenLogprob& lp : lps) {
    json entry = llama_token(tok, lp.token, lp.logprob, probabilities);
    json& top = entry[probabilities ? "top_probs" : "top_logprobs"] = json::array();
    for (const auto& [id, logprob] : lp.top) top.push_back(llama_token(tok, id, logprob, probabilities));
    out.push_back(std::move(entry));
  }
  return out;
}

json logprobs_of(const Completion& c, const std::vector<TokenLogprob>& lps, int64_t& offset) {
  if (!c.logprobs) return nullptr;
  if (c.post_sampling_probs) return {{"content", probs_json(*c.tokenizer, lps, true)}};
  return c.chat ? chat_logprobs(*c.tokenizer, lps) : completion_logprobs(*c.tokenizer, lps, offset);
}

json full_response(const Completion& c, const std::vector<GenerateResult>& rs) {
  json choices = json::array();
  for (size_t i = 0; i < rs.size(); ++i) choices.push_back(full_choice(c, rs[i], static_cast<int>(i)));
  return {{"id", c.id}, {"object", c.chat ? "chat.completion" : "text_completion"}, {"created", c.created},
          {"model", c.model}, {"choices", choices}, {"usage", usage_of(rs, c.prompts)}, {"timings", timings_of(rs)}};
}

std::string sse(const json& j) { return "data: " + j.dump() + "\n\n"; }

json chunk(const Completion& c, int index, const std::string* text, const std::string* finish) {
  json choice = {{"index", index}, {"finish_reason", finish ? json(*finish) : json(nullptr)}};
  if (c.chat) {
    choice["delta"] = text ? json{{"content", *text}} : json::object();
  } else {
    choice["text"] = text ? *text : "";
    choice["logprobs"] = nullptr;
  }
  return {{"id", c.id}, {"object", c.chat ? "chat.completion.chunk" : "text_completion"}, {"created", c.created},
          {"model", c.model}, {"choices", json::array({choice})}};
}

}  // namespace bmoe
