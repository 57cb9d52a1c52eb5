// A completion's server-sent events (OpenAI's streaming): per choice a role chunk (chat), its
// pieces, a finish chunk; the last finish chunk carries usage and timings; then the usage chunk
// if asked for, and [DONE]. Written to a StreamSink, so the HTTP library stays in the tool.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chat/reply.h"
#include "core/timer.h"
#include "serve/response.h"
#include "serve/worker.h"
#include "text/sampler.h"

namespace bmoe {

// Where a stream's bytes go (the HTTP library's chunked sink).
struct StreamSink {
  std::function<bool(const std::string&)> write;  // false: the client is gone
  std::function<void()> done;                     // the stream is complete
};

// timings_per_token: the running choice's figures, with timings_of's names.
nlohmann::ordered_json live_timings_json(const LiveTimings& t);

// A job's answer as a stream, written one provider call at a time.
class JobStream {
 public:
  virtual ~JobStream() = default;
  // One provider call: waits up to a second for output; false when the client is gone.
  virtual bool step(Job& job, const StreamSink& sink) = 0;
};

// Writes a job's events as server-sent events, one provider call at a time. Consecutive events
// of one choice go out as one chunk (text and the log-probabilities of its tokens).
class StreamWriter : public JobStream {
 public:
  explicit StreamWriter(const Completion& c);

  bool step(Job& job, const StreamSink& sink) override;

 private:
  bool send(const std::string& text) {
    quiet_.reset();
    return sink_->write(text);
  }
  bool open(int choice);
  bool ping();
  bool write_events(const std::deque<JobEvent>& events);
  bool write_progress(int choice, const PromptProgress& p);
  bool write_piece(int choice, const std::string& text, const std::vector<TokenLogprob>& lps, bool ending);
  bool write_delta(int choice, const ReplyDelta& d, const std::vector<TokenLogprob>& lps);
  bool write_tool_calls(int choice);
  nlohmann::ordered_json finish_chunk(int choice, const std::string& reason);
  bool finish_stream(Job& job);
  bool write_usage_chunk(const std::vector<GenerateResult>& results);

  Completion c_;
  std::vector<ReplyParser> parsers_;  // chat: one per choice
  std::vector<bool> opened_;
  std::vector<bool> called_;  // the choice ended in tool calls
  std::vector<int64_t> offsets_;  // completions' text_offset, per choice
  const StreamSink* sink_ = nullptr;
  std::optional<LiveTimings> timings_;  // the latest, sent with each piece (timings_per_token)
  Stopwatch quiet_;                      // since the last output: when to ping
};

}  // namespace bmoe
