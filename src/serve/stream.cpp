#include "serve/stream.h"

#include <algorithm>
#include <chrono>
#include <mutex>

namespace bmoe {

using json = nlohmann::ordered_json;

json live_timings_json(const LiveTimings& t) {
  return {{"cache_n", t.cache_n},
          {"prompt_n", t.prompt_n},
          {"prompt_ms", t.prompt_ms},
          {"prompt_per_token_ms", t.prompt_n > 0 ? t.prompt_ms / t.prompt_n : 0.0},
          {"prompt_per_second", t.prompt_ms > 0 ? t.prompt_n * 1e3 / t.prompt_ms : 0.0},
          {"predicted_n", t.predicted_n},
          {"predicted_ms", t.predicted_ms},
          {"predicted_per_token_ms", t.predicted_n > 0 ? t.predicted_ms / t.predicted_n : 0.0},
          {"predicted_per_second", t.predicted_ms > 0 ? t.predicted_n * 1e3 / t.predicted_ms : 0.0}};
}

StreamWriter::StreamWriter(const Completion& c)
    : c_(c), opened_(static_cast<size_t>(c.n), false), called_(static_cast<size_t>(c.n), false),
      offsets_(static_cast<size_t>(c.n), 0) {
  for (int i = 0; i < c.n; ++i) parsers_.emplace_back(c.reply);
}

bool StreamWriter::step(Job& job, const StreamSink& sink) {
  sink_ = &sink;
  if (!opened_[0]) return open(0);  // at once: the client sees the stream start
  std::deque<JobEvent> events;
  const bool done = job.take_events(events);
  if (!write_events(events)) return false;
  if (!done) return events.empty() ? ping() : true;
  if (!finish_stream(job)) return false;
  sink.done();
  return true;
}

// The chat role chunk that starts a choice.
bool StreamWriter::open(int choice) {
  opened_[static_cast<size_t>(choice)] = true;
  if (!c_.chat) return true;
  json first = chunk(c_, choice, nullptr, nullptr);
  first["choices"][0]["delta"] = {{"role", "assistant"}, {"content", ""}};
  return send(sse(first));
}

// A comment line after c.ping_seconds without output keeps proxies from closing the stream
// (llama-server's sse_ping_interval; <= 0: none).
bool StreamWriter::ping() {
  if (c_.ping_seconds <= 0 || quiet_.seconds() < c_.ping_seconds) return true;
  return send(": keep-alive\n\n");
}

bool StreamWriter::write_events(const std::deque<JobEvent>& events) {
  std::string text;
  std::vector<TokenLogprob> lps;
  for (size_t i = 0; i < events.size(); ++i) {
    const JobEvent& e = events[i];
    if (e.progress) {  // comes before the choice's first piece: nothing is held back
      if (!write_progress(e.choice, *e.progress)) return false;
      continue;
    }
    text += e.text;
    if (e.logprob) lps.push_back(*e.logprob);
    if (e.timings) timings_ = e.timings;
    const bool last_of_run = i + 1 == events.size() || events[i + 1].choice != e.choice || !e.finish.empty() ||
                             events[i + 1].progress;
    if (!last_of_run) continue;
    if (!write_piece(e.choice, text, lps, !e.finish.empty())) return false;
    if (!e.finish.empty() && !send(sse(finish_chunk(e.choice, e.finish)))) return false;
    text.clear();
    lps.clear();
  }
  return true;
}

// llama-server's prompt_progress chunk: an empty delta (chat) or text, with the progress.
bool StreamWriter::write_progress(int choice, const PromptProgress& p) {
  json out = chunk(c_, choice, nullptr, nullptr);
  out["prompt_progress"] = {{"total", p.total}, {"cache", p.cache}, {"processed", p.processed}, {"time_ms", p.time_ms}};
  return send(sse(out));
}

// A choice's text (chat: split into reasoning, content and tool calls) with its tokens'
// log-probabilities; `ending` flushes what the parser held and sends the tool calls.
bool StreamWriter::write_piece(int choice, const std::string& text, const std::vector<TokenLogprob>& lps, bool ending) {
  const size_t k = static_cast<size_t>(choice);
  if (!opened_[k] && !open(choice)) return false;
  ReplyDelta d{std::string(), text};
  if (c_.chat) {
    d = parsers_[k].feed(text);
    if (ending) d.append(parsers_[k].finish());
  }
  // The text first (what the parser released at the end included), then the calls.
  if (!write_delta(choice, d, lps)) return false;
  return !ending || !c_.chat || write_tool_calls(choice);
}

bool StreamWriter::write_delta(int choice, const ReplyDelta& d, const std::vector<TokenLogprob>& lps) {
  const size_t k = static_cast<size_t>(choice);
  if (d.empty() && lps.empty()) return true;
  json out = chunk(c_, choice, c_.chat ? nullptr : &d.content, nullptr);
  json& choice_json = out["choices"][0];
  if (c_.chat) {
    if (!d.reasoning.empty()) choice_json["delta"]["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) choice_json["delta"]["content"] = d.content;
  }
  if (c_.logprobs) choice_json["logprobs"] = logprobs_of(c_, lps, offsets_[k]);
  if (timings_) out["timings"] = live_timings_json(*timings_);
  return send(sse(out));
}

// The calls of a finished chat choice, in one delta (each call whole: id, name, arguments).
bool StreamWriter::write_tool_calls(int choice) {
  const json calls = tool_calls_json(c_, parsers_[static_cast<size_t>(choice)].tool_calls(), true);
  if (calls.empty()) return true;
  called_[static_cast<size_t>(choice)] = true;
  json out = chunk(c_, choice, nullptr, nullptr);
  out["choices"][0]["delta"]["tool_calls"] = calls;
  return send(sse(out));
}

json StreamWriter::finish_chunk(int choice, const std::string& reason) {
  const bool called = called_[static_cast<size_t>(choice)] && reason != "length";
  const std::string r = called ? "tool_calls" : finish_reason(reason);
  return chunk(c_, choice, nullptr, &r);
}

// The job is done: the last choice's end, with usage and timings, or the error event.
bool StreamWriter::finish_stream(Job& job) {
  if (!job.error.empty()) return send(sse(job_error(job))) && send("data: [DONE]\n\n");
  const int last = static_cast<int>(job.results.size()) - 1;
  if (last >= 0 && !write_piece(last, {}, {}, true)) return false;
  json end = finish_chunk(std::max(last, 0), last >= 0 ? job.results.back().finish_reason : "stop");
  end["usage"] = usage_of(job.results, c_.prompts);
  end["timings"] = timings_of(job.results);
  if (!send(sse(end))) return false;
  if (c_.include_usage && !write_usage_chunk(job.results)) return false;
  return send("data: [DONE]\n\n");
}

// As OpenAI: one more chunk, with usage and no choices.
bool StreamWriter::write_usage_chunk(const std::vector<GenerateResult>& results) {
  json usage = chunk(c_, 0, nullptr, nullptr);
  usage["choices"] = json::array();
  usage["usage"] = usage_of(results, c_.prompts);
  return send(sse(usage));
}

}  // namespace bmoe
