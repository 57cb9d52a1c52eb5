#include "serve/native_completion.h"

#include <algorithm>
#include <chrono>
#include <mutex>

#include "serve/response.h"

namespace bmoe {

using json = nlohmann::ordered_json;

namespace {

// Why a choice ended, as llama-server names it, and the stop string that ended it (the decode
// loop's; otherwise, for a stop string a caller's hook matched, the answer's tokens decode to
// more than its text exactly when a stop string cut the text).
std::pair<std::string, std::string> stop_of(const NativeCompletion& c, const GenerateResult& r) {
  if (r.finish_reason == "length") return {"limit", ""};
  if (r.finish_reason != "stop") return {"none", ""};
  if (!r.stop_word.empty()) return {"word", r.stop_word};
  const std::string decoded = c.tokenizer->decode(r.tokens);
  if (decoded.size() > r.text.size() && decoded.starts_with(r.text)) {
    const std::string_view rest = std::string_view(decoded).substr(r.text.size());
    for (const std::string& word : c.stop) {
      if (rest.starts_with(word)) return {"word", word};
    }
  }
  return {"eos", ""};
}

const std::vector<int32_t>& prompt_of(const Job& job, int index) {
  return job.choice_prompts.empty() ? job.prompt : job.choice_prompts[static_cast<size_t>(index)];
}

}  // namespace

json native_result(const NativeCompletion& c, const Job& job, int index) {
  const GenerateResult& r = job.results[static_cast<size_t>(index)];
  const auto [stop_type, word] = stop_of(c, r);
  return {{"index", index},
          {"content", r.text},
          {"tokens", c.return_tokens ? json(r.tokens) : json::array()},
          {"id_slot", job.slot},
          {"stop", true},
          {"model", c.model},
          {"tokens_predicted", r.tokens.size()},
          {"tokens_evaluated", r.prompt_tokens},
          {"prompt", c.tokenizer->decode(prompt_of(job, index))},
          {"has_new_line", r.text.find('\n') != std::string::npos},
          {"truncated", false},
          {"stop_type", stop_type},
          {"stopping_word", word},
          {"tokens_cached", r.reused_tokens},
          {"timings", timings_of({r})}};
}

json native_result_with_probs(const NativeCompletion& c, const Job& job, int index) {
  json result = native_result(c, job, index);
  const GenerateResult& r = job.results[static_cast<size_t>(index)];
  if (c.probs && !r.logprobs.empty()) {
    result["completion_probabilities"] = probs_json(*c.tokenizer, r.logprobs, c.post_sampling_probs);
  }
  return result;
}

json native_response(const NativeCompletion& c, const Job& job) {
  if (job.results.size() == 1 && c.n == 1) return native_result_with_probs(c, job, 0);
  json all = json::array();
  for (size_t i = 0; i < job.results.size(); ++i) all.push_back(native_result_with_probs(c, job, static_cast<int>(i)));
  return all;
}

bool NativeStream::step(Job& job, const StreamSink& sink) {
  std::deque<JobEvent> events;
  const bool done = job.take_events(events);
  for (const JobEvent& e : events) {
    if (pieces_.size() <= static_cast<size_t>(e.choice)) {
      pieces_.resize(static_cast<size_t>(e.choice) + 1, 0);
      probs_.resize(static_cast<size_t>(e.choice) + 1);
    }
    // A token's probabilities come before its text; a piece carries those of its tokens.
    if (e.logprob && c_.probs) probs_[static_cast<size_t>(e.choice)].push_back(*e.logprob);
    if (e.text.empty()) continue;
    int& predicted = pieces_[static_cast<size_t>(e.choice)];
    predicted = e.timings ? e.timings->predicted_n : predicted + 1;
    json piece = {{"index", e.choice}, {"content", e.text}, {"tokens", json::array()}, {"stop", false},
                  {"id_slot", job.slot}, {"tokens_predicted", predicted}, {"tokens_evaluated", prompt_of(job, e.choice).size()}};
    if (c_.timings_per_token && e.timings) piece["timings"] = live_timings_json(*e.timings);
    if (std::vector<TokenLogprob>& lps = probs_[static_cast<size_t>(e.choice)]; !lps.empty()) {
      piece["completion_probabilities"] = probs_json(*c_.tokenizer, lps, c_.post_sampling_probs);
      lps.clear();
    }
    if (!sink.write(sse(piece))) return false;
  }
  if (!done) return events.empty() ? sink.write(": keep-alive\n\n") : true;
  if (!job.error.empty()) {
    if (!sink.write(sse(job_error(job)))) return false;
  } else {
    for (size_t i = 0; i < job.results.size(); ++i) {
      json last = native_result(c_, job, static_cast<int>(i));
      last["content"] = "";  // as llama-server: the pieces carried it
      last["tokens"] = json::array();
      // Tokens whose text never came out (a cut character at the end) keep their probabilities.
      if (i < probs_.size() && !probs_[i].empty()) {
        last["completion_probabilities"] = probs_json(*c_.tokenizer, probs_[i], c_.post_sampling_probs);
      }
      if (!sink.write(sse(last))) return false;
    }
  }
  sink.done();
  return true;
}

}  // namespace bmoe
