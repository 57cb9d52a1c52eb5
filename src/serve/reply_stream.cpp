#include "serve/reply_stream.h"

#include <chrono>
#include <mutex>

#include "text/utf8.h"

namespace bmoe {

ReplyParts reply_parts(const ReplyOptions& options, const std::string& text) {
  ReplyParser parser(options);
  ReplyDelta d = parser.feed(text);
  d.append(parser.finish());
  ReplyParts parts{utf8_sanitize(d.reasoning), utf8_sanitize(d.content), {}};
  if (options.tools != ToolFormat::None) parts.calls = parser.tool_calls();
  return parts;
}

std::string stop_sequence_hit(const GenerateResult& r, const std::vector<std::string>& stops, const Tokenizer& tok) {
  if (r.finish_reason != "stop" || stops.empty()) return {};
  std::string full;  // the tokens' bytes as the decode loop matched stop strings on them
  for (int32_t t : r.tokens) full += tok.token_bytes(t, false);
  size_t best = std::string::npos;
  std::string hit;
  for (const std::string& s : stops) {
    const size_t at = full.find(s, r.text.size() > s.size() ? r.text.size() - s.size() : 0);
    if (at != std::string::npos && at < best) best = at, hit = s;
  }
  return hit;
}

std::string PartStream::named_event(const std::string& name, const std::string& data) {
  return "event: " + name + "\ndata: " + data + "\n\n";
}

bool PartStream::deliver(const ReplyDelta& d) {
  if (!d.reasoning.empty() && !reasoning(utf8_sanitize(d.reasoning))) return false;
  return d.content.empty() || text(utf8_sanitize(d.content));
}

bool PartStream::step(Job& job, const StreamSink& sink) {
  sink_ = &sink;
  if (!started_) {
    started_ = true;
    return start();  // at once: the client sees the stream begin
  }
  std::deque<JobEvent> events;
  const bool done = job.take_events(events);
  std::string pieces;
  for (const JobEvent& e : events) {
    if (e.choice == 0) pieces += e.text;
  }
  if (!pieces.empty() && !deliver(parser_.feed(pieces))) return false;
  if (!done) return !events.empty() || keep_alive();
  if (!job.error.empty()) {
    if (!fail(job)) return false;
  } else {
    if (!deliver(parser_.finish())) return false;
    if (!finish(job, parser_.tool_calls())) return false;
  }
  sink.done();
  return true;
}

}  // namespace bmoe
