// llama-server's own POST /completion: the answer as one object per prompt (`content`, token
// counts, `stop_type`, timings) and, streamed, one object per piece then the final one with
// `stop` true (no [DONE]). The request is /v1/completions' (serve/request.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/stream.h"
#include "serve/worker.h"
#include "text/tokenizer.h"

namespace bmoe {

struct NativeCompletion {
  std::string model;
  const Tokenizer* tokenizer = nullptr;  // the prompt's and the answers' text
  std::vector<std::string> stop;         // the stop strings asked for (stop_type "word")
  bool return_tokens = false;            // `tokens` holds the answer's ids (else empty)
  int n = 1;                             // choices; more than one: the answer is a list
  bool timings_per_token = false;        // each streamed piece carries the timings so far
  bool probs = false;                    // n_probs > 0: the whole answer has completion_probabilities
  bool post_sampling_probs = false;      // ... the sampler chain's probabilities (prob, top_probs)
};

// The final object of choice `index` (llama-server's to_json_non_oaicompat).
nlohmann::ordered_json native_result(const NativeCompletion& c, const Job& job, int index);
// The same with completion_probabilities where asked for (the whole answer's; a stream's last
// object has none, as llama-server's).
nlohmann::ordered_json native_result_with_probs(const NativeCompletion& c, const Job& job, int index);
// The whole answer: one object, or a list of them for several choices.
nlohmann::ordered_json native_response(const NativeCompletion& c, const Job& job);

// Streams a job as /completion does; with n_probs, each piece has the completion_probabilities
// of its tokens. The job should have Job::timings_per_token set: a piece's
// tokens_predicted is then exact (else it counts pieces, as with --parallel above 1).
class NativeStream : public JobStream {
 public:
  explicit NativeStream(NativeCompletion c) : c_(std::move(c)) {}
  bool step(Job& job, const StreamSink& sink) override;

 private:
  NativeCompletion c_;
  std::vector<int> pieces_;  // per choice: pieces sent (tokens_predicted so far)
  std::vector<std::vector<TokenLogprob>> probs_;  // per choice: probabilities not yet sent
};

}  // namespace bmoe
