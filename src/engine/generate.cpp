#include "engine/generate.h"

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "core/timer.h"
#include "text/tag_scan.h"
#include "text/utf8.h"

namespace bmoe {

std::string StopMatcher::push(const std::string& text) {
  if (stopped_) return {};
  pending_ += text;
  const size_t first = first_tag(pending_, stops_);
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  const size_t hold = partial_tag_length(pending_, stops_);  // could still become a stop string
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  std::string out = stopped_ ? std::string() : pending_;
  pending_.clear();
  return out;
}

bool drafting_possible(const DraftConfig& draft, const SamplerConfig& sampler) {
  // Verification keeps a draft token when it is the raw logits' argmax: penalties move the pick.
  return draft.max_draft > 0 && sampler.temperature <= 0.0f && !sampler.penalized();
}

std::vector<int32_t> feed_token(Session& session, int32_t token, DraftController* drafts, int budget) {
  const int room = session.state().n_ctx() - session.state().n_past() - 1;
  const int length = drafts ? std::min({drafts->length(), budget, room}) : 0;
  if (length <= 0) {
    session.accept(token);
    if (drafts) drafts->report(0, 0);
    return {};
  }
  std::vector<int32_t> sequence = session.history();
  sequence.push_back(token);
  const DraftConfig& c = drafts->config();
  std::vector<int32_t> draft = c.oracle.empty() ? ngram_draft(sequence, length, c.ngram_max, c.ngram_min)
                                                : oracle_draft(c.oracle, sequence, length);
  const int kept = session.accept_draft(token, draft);
  drafts->report(static_cast<int>(draft.size()), kept);
  draft.resize(static_cast<size_t>(kept));
  return draft;
}

int32_t DecodeCursor::next(bool& fed) {
  fed = next_known_ < known_.size();
  return fed ? known_[next_known_++] : session_.sample(filter_);
}

void DecodeCursor::feed(int32_t token, int budget) {
  known_ = feed_token(session_, token, drafts_, budget);
  next_known_ = 0;
}

GrammarFilter::GrammarFilter(std::shared_ptr<const Grammar> grammar, const Tokenizer& tok)
    : constraint_(std::move(grammar), tok.token_texts(), tok.end_of_generation_tokens()) {}

GenerateResult generate(Session& session, const std::vector<int32_t>& prompt, const GenerateParams& params,
                        const PieceCallback& on_piece, const std::atomic<bool>* cancel,
                        const LogprobCallback& on_logprob) {
  GenerateResult result;
  const int n_ctx = session.state().n_ctx();
  if (prompt.empty()) fail("the prompt is empty");
  if (static_cast<int>(prompt.size()) >= n_ctx) {
    fail("the prompt has {} tokens, more than the context of {}", prompt.size(), n_ctx);
  }
  result.prompt_tokens = static_cast<int>(prompt.size());
  session.set_sampler(params.sampler);
  PrefillRecord pre;
  result.reused_tokens = session.prefill_reusing(prompt, &pre);
  result.prefill_seconds = pre.seconds;

  const Tokenizer& tok = *session.model().tokenizer;
  Utf8Stream utf8;
  StopMatcher stop(params.stop);
  bool keep_going = true;
  auto emit = [&](const std::string& text) {
    if (text.empty() || !keep_going) return;
    result.text += text;
    if (on_piece && !on_piece(text)) keep_going = false;
  };
  Stopwatch decode;
  result.finish_reason = "length";
  const int limit = std::min(params.max_tokens, n_ctx - static_cast<int>(prompt.size()));
  std::unique_ptr<GrammarFilter> grammar;
  if (params.grammar) grammar = std::make_unique<GrammarFilter>(params.grammar, tok);
  std::unique_ptr<DraftController> drafts;
  if (drafting_possible(params.draft, params.sampler) && params.logprobs < 0 && !grammar) {
    drafts = std::make_unique<DraftController>(params.draft);
  }
  DecodeCursor cursor(session, drafts.get(), grammar.get());
  const int n_vocab = session.model().transformer->config().n_vocab;
  // Emits one token; false when generation ends with it (end token or stop string).
  auto take = [&](int32_t token) {
    if ((!params.ignore_eos || grammar) && tok.is_end_of_generation(token)) {
      result.finish_reason = "stop";
      return false;
    }
    if (grammar) grammar->accept(token);
    result.tokens.push_back(token);
    if (params.logprobs >= 0) {  // the logits it was sampled from are still the session's
      result.logprobs.push_back(token_logprob(session.logits().data(), n_vocab, token, params.logprobs));
      if (on_logprob) on_logprob(result.logprobs.back());
    }
    emit(stop.push(utf8.push(tok.token_bytes(token, params.show_special))));
    if (stop.stopped()) {
      result.finish_reason = "stop";
      return false;
    }
    return true;
  };
  for (int i = 0; i < limit; ++i) {
    if ((cancel && cancel->load()) || !keep_going) {
      result.finish_reason = "cancelled";
      break;
    }
    bool fed = false;
    const int32_t token = cursor.next(fed);
    if (!take(token)) break;
    if (fed || i + 1 >= limit) continue;  // the last token of the budget is not fed
    cursor.feed(token, limit - i - 2);
  }
  if (drafts) {
    result.drafted = drafts->drafted_total();
    result.accepted = drafts->accepted_total();
  }
  if (!keep_going) result.finish_reason = "cancelled";
  if (!stop.stopped()) emit(stop.push(utf8.flush()) + stop.flush());
  result.decode_seconds = decode.seconds();
  return result;
}

}  // namespace bmoe
