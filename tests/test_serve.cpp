// bmoe-server's answers without HTTP (serve/response.h, serve/stream.h): OpenAI's shapes of a
// whole answer and of a stream, written from a job's events and results. The HTTP side (routes,
// the worker on a real model) is driven by tests/server.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/response.h"
#include "serve/stream.h"
#include "serve/worker.h"

namespace bmoe {
namespace {

using json = nlohmann::ordered_json;

GenerateResult result_of(const std::string& text, int tokens, const std::string& finish) {
  GenerateResult r;
  r.text = text;
  r.tokens.assign(static_cast<size_t>(tokens), 7);
  r.prompt_tokens = 10;
  r.reused_tokens = 4;
  r.finish_reason = finish;
  r.prefill_seconds = 0.5;
  r.decode_seconds = 2.0;
  return r;
}

Completion chat_completion() {
  Completion c;
  c.chat = true;
  c.id = "chatcmpl-test";
  c.created = 1234;
  c.model = "tiny";
  return c;
}

// The SSE payloads a StreamWriter writes for a job, one step at a time until the stream ends.
std::vector<std::string> stream_events(const Completion& c, Job& job) {
  std::string written;
  bool ended = false;
  const StreamSink sink{[&](const std::string& text) {
                          written += text;
                          return true;
                        },
                        [&] { ended = true; }};
  StreamWriter writer(c);
  for (int step = 0; step < 10 && !ended; ++step) EXPECT_TRUE(writer.step(job, sink));
  EXPECT_TRUE(ended);
  std::vector<std::string> events;
  for (size_t at = 0; (at = written.find("data: ", at)) != std::string::npos;) {
    const size_t end = written.find("\n\n", at);
    events.push_back(written.substr(at + 6, end - at - 6));
    at = end;
  }
  return events;
}

TEST(ServeResponse, ErrorBodyHasOpenAIsFields) {
  const json e = error_body("invalid_request_error", "bad 'n'", "n");
  EXPECT_EQ(e.dump(), R"({"error":{"message":"bad 'n'","type":"invalid_request_error","param":"n","code":null}})");
  Job job;
  job.error = "stopped";
  job.error_status = 503;
  EXPECT_EQ(job_error(job)["error"]["type"], "server_shutting_down");
  job.error_status = 500;
  EXPECT_EQ(job_error(job)["error"]["type"], "server_error");
}

TEST(ServeResponse, UsageCountsThePromptOnceAndEveryChoice) {
  const std::vector<GenerateResult> rs = {result_of("a", 3, "stop"), result_of("b", 5, "length")};
  const json u = usage_of(rs);
  EXPECT_EQ(u["prompt_tokens"], 10);
  EXPECT_EQ(u["completion_tokens"], 8);
  EXPECT_EQ(u["total_tokens"], 18);
  EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens"], 4);
  const json t = timings_of(rs);
  EXPECT_EQ(t["cache_n"], 8);     // both choices' reused rows
  EXPECT_EQ(t["prompt_n"], 12);   // 6 evaluated per choice
  EXPECT_EQ(t["predicted_n"], 8);
  EXPECT_DOUBLE_EQ(t["predicted_ms"].get<double>(), 4000.0);
  EXPECT_DOUBLE_EQ(t["predicted_per_second"].get<double>(), 2.0);
  EXPECT_FALSE(t.contains("draft_n")) << "no drafting, no draft counts";
  EXPECT_EQ(usage_of({})["total_tokens"], 0);
}

// With --draft (n-grams or --mtp), the timings report the drafts as llama-server does.
TEST(ServeResponse, TimingsCountDraftsAndKeptDrafts) {
  std::vector<GenerateResult> rs = {result_of("a", 3, "stop"), result_of("b", 5, "length")};
  rs[0].drafted = 6;
  rs[0].accepted = 4;
  rs[1].drafted = 3;
  const json t = timings_of(rs);
  EXPECT_EQ(t["draft_n"], 9);
  EXPECT_EQ(t["draft_n_accepted"], 4);
}

TEST(ServeResponse, ChatAnswerSplitsReasoningAndToolCalls) {
  Completion c = chat_completion();
  c.reply.tools = ToolFormat::Hermes;
  c.reply.tool_list = json::parse(R"([{"type": "function", "function": {"name": "get_weather"}}])");
  const std::string call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>";
  json r = full_response(c, {result_of("<think>hmm</think>" + call, 9, "stop")});
  EXPECT_EQ(r["object"], "chat.completion");
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  EXPECT_EQ(choice["message"]["reasoning_content"], "hmm");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  // Cut by max_tokens: the answer says so even after a complete call.
  r = full_response(c, {result_of(call, 9, "length")});
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  // Without tools in the request, the same text is content.
  c.reply.tools = ToolFormat::None;
  r = full_response(c, {result_of(call, 9, "stop")});
  EXPECT_EQ(r["choices"][0]["message"]["content"], call);
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
}

// Gemma 4 thinks in its thought channel: reasoning_content, whole and streamed (issue 33).
TEST(ServeResponse, Gemma4ThoughtChannelIsReasoning) {
  Completion c = chat_completion();
  c.reply.reasoning_tags = reasoning_tags(ChatFormat::Gemma4);
  const std::string answer = "<|channel>thought\nweigh it<channel|>The answer.";
  const json r = full_response(c, {result_of(answer, 6, "stop")});
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"], "weigh it");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "The answer.");
  Job job;
  for (const char* piece : {"<|chan", "nel>thought\nwei", "gh it<chan", "nel|>The ", "answer."}) job.push({0, piece, std::nullopt, {}});
  job.results = {result_of(answer, 6, "stop")};
  job.done = true;
  std::string reasoning, content;
  for (const std::string& e : stream_events(c, job)) {
    if (e == "[DONE]") continue;
    const json chunk = json::parse(e);
    if (chunk["choices"].empty()) continue;
    const json& delta = chunk["choices"][0]["delta"];
    if (delta.contains("reasoning_content")) reasoning += delta["reasoning_content"].get<std::string>();
    if (delta.contains("content") && delta["content"].is_string()) content += delta["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "weigh it");
  EXPECT_EQ(content, "The answer.");
}

TEST(ServeStream, ChatStreamIsRoleContentFinishThenDone) {
  Completion c = chat_completion();
  c.include_usage = true;
  Job job;
  job.push({0, "Hel", std::nullopt, {}});
  job.push({0, "lo", std::nullopt, {}});
  job.results = {result_of("Hello", 2, "stop")};
  job.done = true;
  const std::vector<std::string> events = stream_events(c, job);
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(json::parse(events[0])["choices"][0]["delta"], json::parse(R"({"role": "assistant", "content": ""})"));
  EXPECT_EQ(json::parse(events[1])["choices"][0]["delta"]["content"], "Hello");  // one chunk for the run
  const json end = json::parse(events[2]);
  EXPECT_EQ(end["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(end["usage"]["completion_tokens"], 2);
  EXPECT_TRUE(json::parse(events[3])["choices"].empty());  // include_usage: usage, no choices
  EXPECT_EQ(events[4], "[DONE]");
}

TEST(ServeStream, FailedJobEndsWithTheErrorAndAGoneClientStops) {
  Completion c = chat_completion();
  c.chat = false;
  Job job;
  job.error = "boom";
  job.done = true;
  const std::vector<std::string> events = stream_events(c, job);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(json::parse(events[0])["error"]["message"], "boom");
  EXPECT_EQ(events[1], "[DONE]");

  Job second;
  second.push({0, "x", std::nullopt, {}});
  const StreamSink gone{[](const std::string&) { return false; }, [] {}};
  StreamWriter writer(chat_completion());
  EXPECT_FALSE(writer.step(second, gone));  // the role chunk cannot be written
}

}  // namespace
}  // namespace bmoe
