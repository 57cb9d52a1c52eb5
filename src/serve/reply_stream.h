// For the APIs whose answers are typed parts rather than OpenAI's choices (Anthropic Messages,
// Responses): one choice's text split into reasoning, text and tool calls, whole or as it
// streams, and whether a stop sequence ended it.
#pragma once

#include <string>
#include <vector>

#include "chat/reply.h"
#include "chat/tool_calls.h"
#include "serve/stream.h"
#include "serve/worker.h"
#include "text/tokenizer.h"

namespace bmoe {

struct ReplyParts {
  std::string reasoning, text;
  std::vector<ToolCall> calls;
};
// A whole answer's parts (its calls only where the request offered tools).
ReplyParts reply_parts(const ReplyOptions& options, const std::string& text);

// The stop string that ended an answer ("" when none did): the first one its tokens' full text
// holds at or after the end of the answer's text.
std::string stop_sequence_hit(const GenerateResult& r, const std::vector<std::string>& stops, const Tokenizer& tok);

// A stream of one job's first choice as parts: subclasses write each API's events.
class PartStream : public JobStream {
 public:
  explicit PartStream(ReplyOptions options) : parser_(std::move(options)) {}
  bool step(Job& job, const StreamSink& sink) final;

 protected:
  virtual bool start() = 0;                            // the opening events, before any output
  virtual bool reasoning(const std::string& text) = 0;  // a piece of reasoning
  virtual bool text(const std::string& text) = 0;       // a piece of the answer's text
  // The job is done: its calls, then the closing events.
  virtual bool finish(const Job& job, const std::vector<ToolCall>& calls) = 0;
  virtual bool fail(const Job& job) = 0;  // the job failed: the error event
  virtual bool keep_alive() = 0;
  bool send(const std::string& s) { return sink_->write(s); }
  // A server-sent event with a name (Anthropic's and the Responses API's streams name theirs).
  static std::string named_event(const std::string& name, const std::string& data);

 private:
  bool deliver(const ReplyDelta& d);

  ReplyParser parser_;
  bool started_ = false;
  const StreamSink* sink_ = nullptr;
};

}  // namespace bmoe
