#include "engine/generate.h"

#include <algorithm>
#include <memory>
#include <optional>

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
    for (const std::string& stop : stops_) {
      if (matched_.empty() && !stop.empty() && pending_.compare(first, stop.size(), stop) == 0) matched_ = stop;
    }
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
  // Verification keeps a draft token when it is the row's argmax or the sampler's draw from the
  // raw row: penalties would move the pick with the tokens before it.
  return draft.max_draft > 0 && !sampler.penalized();
}

namespace {

// What drafting needs across the loop's steps: the controller that decides how many tokens to
// draft (the loop's) and the drafter that guesses them.
struct Drafting {
  // A constructor, not an aggregate: clang 14 (the sanitizer build) has no parenthesised
  // aggregate initialisation for make_unique.
  Drafting(DraftController c, std::unique_ptr<Drafter> d) : controller(std::move(c)), drafter(std::move(d)) {}
  DraftController controller;
  std::unique_ptr<Drafter> drafter;
  DraftProfile profile;
};

// Measures a stretch of decoding into a StepCost: wall time and the expert counters' movement.
class CostMeter {
 public:
  explicit CostMeter(const ExpertSource& experts) : experts_(experts), before_(experts.stats()) {}
  // Adds the stretch so far to `cost` as one step of `rows` rows.
  void add_to(StepCost& cost, int64_t rows) const {
    const ExpertStats now = experts_.stats();
    ++cost.steps;
    cost.rows += rows;
    cost.seconds += timer_.seconds();
    cost.lookups += now.requests - before_.requests;
    cost.hits += now.hits - before_.hits;
    cost.bytes_read += now.bytes_read - before_.bytes_read;
  }

 private:
  const ExpertSource& experts_;
  const ExpertStats before_;
  const Stopwatch timer_;
};

// The tokens drafting wants drafted after `token` now, within the answer's `budget` and the
// context's room (0: a plain step).
int draft_length(Session& session, const Drafting* drafting, int budget) {
  const int room = session.state().n_ctx() - session.state().n_past() - 1;
  return drafting ? std::min({drafting->controller.length(), budget, room}) : 0;
}

// The drafter's guesses after the session's history and `token`, at most `length`; its cost
// (an MTP head's passes and reads) into `cost`.
std::vector<int32_t> propose_draft(Session& session, Drafting& drafting, int32_t token, int length, StepCost& cost) {
  const CostMeter meter(*session.model().experts);
  std::vector<int32_t> sequence = session.history();
  sequence.push_back(token);
  std::vector<int32_t> draft = drafting.drafter->propose(sequence, length);
  // Propose's bound, enforced: a longer draft could run past the context.
  draft.resize(std::min(draft.size(), static_cast<size_t>(length)));
  meter.add_to(cost, static_cast<int64_t>(draft.size()));
  return draft;
}

// A step's cost less its drafter's part (the drafter ran inside the step): the pass's part. Time
// is clamped at 0: a batch step's records hold row shares of the pass, rounded.
StepCost less_drafter(StepCost step, const StepCost& drafter) {
  step.seconds = std::max(0.0, step.seconds - drafter.seconds);
  step.lookups -= drafter.lookups;
  step.hits -= drafter.hits;
  step.bytes_read -= drafter.bytes_read;
  return step;
}

// A drafting step into the profile and the controller: `pass` is the step less the drafter's
// part; `drafted` tokens proposed, `kept` of them kept.
void count_step(Drafting& drafting, const StepCost& pass, const StepCost& drafter, int drafted, int kept) {
  DraftProfile& profile = drafting.profile;
  (drafted == 0 ? profile.plain : profile.verify) += pass;
  if (drafter.steps > 0) profile.drafter += drafter;
  drafting.controller.report(drafted, kept);
}

// Feeds `token` (just emitted) so that the next one can be sampled. While drafting wants a draft,
// also proposes and verifies up to `budget` draft tokens; returns the kept ones, already fed, to
// be emitted in order before sampling again. The drafter runs inside the step, so its cost counts
// in the step's records.
std::vector<int32_t> feed_token(Session& session, int32_t token, Drafting* drafting, int budget) {
  const int length = draft_length(session, drafting, budget);
  if (length <= 0) {
    if (!drafting) {
      session.accept(token);
      return {};
    }
    const CostMeter step(*session.model().experts);
    StepCost pass;
    session.accept(token);
    step.add_to(pass, 1);
    count_step(*drafting, pass, StepCost{}, 0, 0);
    return {};
  }
  std::vector<int32_t> draft;
  const CostMeter step(*session.model().experts);
  StepCost drafter;
  const int kept = session.draft_and_accept(token, [&] {
    draft = propose_draft(session, *drafting, token, length, drafter);
    return draft;
  });
  StepCost step_cost;
  step.add_to(step_cost, static_cast<int64_t>(draft.size()) + 1);
  count_step(*drafting, less_drafter(step_cost, drafter), drafter, static_cast<int>(draft.size()), kept);
  draft.resize(static_cast<size_t>(kept));
  return draft;
}

// The cost a batch step's records from `first` hold (the session's rows' share of the pass, and
// the drafter's cost that the first holds), less the drafter's: the step's pass part.
StepCost batch_pass_cost(const Session& session, size_t first, const StepCost& drafter, int64_t rows) {
  StepCost pass;
  pass.steps = 1;
  pass.rows = rows;
  for (size_t k = first; k < session.records().size(); ++k) {
    const TokenRecord& r = session.records()[k];
    pass.seconds += r.wall_ms / 1e3;
    pass.lookups += r.routed;
    pass.hits += r.hits;
    pass.bytes_read += r.bytes_read;
  }
  return less_drafter(pass, drafter);
}

// One run of the decode loop: the token source (a kept draft's tokens, which the verification
// pass fed already, then the session's samples), the text on its way out, and the result.
class DecodeLoop {
 public:
  DecodeLoop(Session& session, int limit, const GenerateParams& params, const DecodeHooks& hooks)
      : session_(session), params_(params), hooks_(hooks), tok_(*session.model().tokenizer), stop_(params.stop),
        limit_(limit) {
    if (params.grammar) grammar_ = std::make_unique<GrammarFilter>(params.grammar, tok_);
    grammar_waits_ = grammar_ && !params.grammar_after.empty();
    if (drafts_with(params)) {
      drafting_ = std::make_unique<Drafting>(DraftController(params.draft),
                                             make_drafter(params.draft, session.mtp_head()));
    }
    result_.finish_reason = "length";
  }

  GenerateResult run() {
    while (const std::optional<int32_t> token = next_to_feed()) feed(*token);
    return finish();
  }
  // Emits tokens up to the next one the model must be fed and returns it, or nothing once the
  // answer has ended (end token, stop string, limit, full context, cancelled).
  std::optional<int32_t> next_to_feed();
  // Feeds next_to_feed's token here (and drafts, when drafting).
  void feed(int32_t token);
  // next_to_feed's token was fed by the caller; its record starts at first_record.
  void fed(size_t first_record) {
    if (hooks_.on_step && !pending_forced_) hooks_.on_step(first_record);
  }
  // A batch's step (ParallelDecode): the draft to verify with next_to_feed's token (empty: a
  // plain row), its drafter's cost into `drafter`; then batch_fed with what the pass kept.
  std::vector<int32_t> batch_draft(int32_t token, StepCost& drafter) {
    const int length = draft_length(session_, drafting_.get(), pending_budget_);
    return length > 0 ? propose_draft(session_, *drafting_, token, length, drafter) : std::vector<int32_t>{};
  }
  void batch_fed(size_t first_record, std::vector<int32_t> draft, int kept, const StepCost& drafter) {
    if (drafting_) {
      const StepCost pass = batch_pass_cost(session_, first_record, drafter, static_cast<int64_t>(draft.size()) + 1);
      count_step(*drafting_, pass, drafter, static_cast<int>(draft.size()), kept);
    }
    draft.resize(static_cast<size_t>(kept));
    known_ = std::move(draft);
    next_known_ = 0;
    fed(first_record);
  }
  GenerateResult finish();
  Session& session() { return session_; }

 private:
  Stopwatch clock_;  // the decode time, from before the grammar's matcher is built
  // The next token; `fed` says whether the model has seen it already (a kept draft token).
  int32_t next(bool& fed) {
    fed = next_known_ < known_.size();
    return fed ? known_[next_known_++] : session_.sample(grammar_waits_ ? nullptr : grammar_.get());
  }
  bool take(int32_t token);
  int32_t force(int step, int32_t pick);
  void emit(const std::string& text);
  bool stopped() const { return (hooks_.cancel && hooks_.cancel->load()) || !keep_going_; }
  void watch_for_grammar_start(int32_t token);

  Session& session_;
  const GenerateParams& params_;
  const DecodeHooks& hooks_;
  const Tokenizer& tok_;
  std::unique_ptr<GrammarFilter> grammar_;
  bool grammar_waits_ = false;    // params.grammar_after not written yet: the grammar is off
  std::string before_grammar_;    // the answer's last bytes while the grammar waits
  std::unique_ptr<Drafting> drafting_;
  std::vector<int32_t> known_;  // the kept draft tokens still to emit
  size_t next_known_ = 0;
  Utf8Stream utf8_;
  StopMatcher stop_;
  bool keep_going_ = true;  // false once on_piece asked to stop
  const int limit_;
  int step_ = 0;
  bool ended_ = false;
  int pending_budget_ = 0;      // next_to_feed's token: the draft budget after it
  bool pending_forced_ = false;  // and whether it is a teacher-forced one
  GenerateResult result_;
};

std::optional<int32_t> DecodeLoop::next_to_feed() {
  while (!ended_ && step_ < limit_) {
    const int i = step_++;
    if (stopped()) {
      result_.finish_reason = "cancelled";
      break;
    }
    bool fed = false;
    const int32_t pick = next(fed);
    const bool forced = static_cast<size_t>(i) < params_.forced.size();
    const int32_t token = forced ? force(i, pick) : pick;
    if (!forced && !take(token)) break;
    if (fed) continue;
    // The last token of the budget is not fed, nor one sampled with the context full.
    if (i + 1 >= limit_ || session_.state().n_past() >= session_.state().n_ctx()) break;
    pending_budget_ = limit_ - i - 2;
    pending_forced_ = forced;
    return token;
  }
  ended_ = true;
  return std::nullopt;
}

GenerateResult DecodeLoop::finish() {
  if (drafting_) {
    const DraftController& c = drafting_->controller;
    result_.drafted = c.drafted_total();
    result_.accepted = c.accepted_total();
    result_.verify_steps = c.verify_steps();
    result_.draft_profile = drafting_->profile;
  }
  if (!keep_going_) result_.finish_reason = "cancelled";
  if (!stop_.stopped()) emit(stop_.push(utf8_.flush()) + stop_.flush());
  result_.decode_seconds = clock_.seconds();
  return std::move(result_);
}

void DecodeLoop::feed(int32_t token) {
  const size_t first_record = session_.records().size();
  known_ = feed_token(session_, token, drafting_.get(), pending_budget_);
  next_known_ = 0;
  fed(first_record);
}

// Emits one token; false when generation ends with it (end token or stop string).
bool DecodeLoop::take(int32_t token) {
  if ((!params_.ignore_eos || grammar_) && tok_.is_end_of_generation(token)) {
    result_.finish_reason = "stop";
    return false;
  }
  if (grammar_waits_) watch_for_grammar_start(token);
  else if (grammar_) grammar_->accept(token);
  result_.tokens.push_back(token);
  if (params_.logprobs >= 0) {  // the logits it was sampled from are still the session's
    const int n_vocab = session_.model().transformer->config().n_vocab;
    result_.logprobs.push_back(params_.post_sampling_probs
                                   ? session_.sampler().last_distribution(token, params_.logprobs)
                                   : token_logprob(session_.logits().data(), n_vocab, token, params_.logprobs));
    if (hooks_.on_logprob) hooks_.on_logprob(result_.logprobs.back());
  }
  emit(stop_.push(utf8_.push(tok_.token_bytes(token, params_.show_special))));
  if (stop_.stopped()) {
    result_.finish_reason = "stop";
    result_.stop_word = stop_.matched();
    return false;
  }
  return true;
}

// Switches the grammar on once the answer has written params.grammar_after; only the tag's
// length less one byte is kept between tokens (enough to find a tag split across tokens).
void DecodeLoop::watch_for_grammar_start(int32_t token) {
  const std::string& tag = params_.grammar_after;
  before_grammar_ += tok_.token_bytes(token, true);
  if (before_grammar_.find(tag) != std::string::npos) {
    grammar_waits_ = false;
    return;
  }
  if (before_grammar_.size() >= tag.size()) before_grammar_.erase(0, before_grammar_.size() - (tag.size() - 1));
}

// A teacher-forced step: the model's pick is what the answer reports, the reference token is
// what the model is fed.
int32_t DecodeLoop::force(int step, int32_t pick) {
  const int32_t reference = params_.forced[static_cast<size_t>(step)];
  result_.tokens.push_back(pick);
  ++result_.forced_steps;
  result_.forced_equal += pick == reference;
  return reference;
}

void DecodeLoop::emit(const std::string& text) {
  if (text.empty() || !keep_going_) return;
  result_.text += text;
  if (hooks_.on_piece && !hooks_.on_piece(text)) keep_going_ = false;
}

}  // namespace

bool drafts_with(const GenerateParams& params) {
  return drafting_possible(params.draft, params.sampler) && params.logprobs < 0 && !params.grammar && params.forced.empty();
}

GrammarFilter::GrammarFilter(std::shared_ptr<const Grammar> grammar, const Tokenizer& tok)
    : constraint_(std::move(grammar), tok.token_texts(), tok.end_of_generation_tokens()) {}

GenerateResult decode_tokens(Session& session, int limit, const GenerateParams& params, const DecodeHooks& hooks) {
  return DecodeLoop(session, limit, params, hooks).run();
}

// One sequence of a ParallelDecode: its parameters and hooks outlive the loop that reads them.
struct ParallelDecode::Sequence {
  Sequence(Session& session, int limit, GenerateParams p, DecodeHooks h)
      : params(std::move(p)), hooks(std::move(h)), loop(session, limit, params, hooks) {}
  GenerateParams params;
  DecodeHooks hooks;
  DecodeLoop loop;
  bool ended = false;
  GenerateResult result;
};

ParallelDecode::ParallelDecode(LoadedModel& model, ThreadPool& pool)
    : batch_(std::make_unique<SessionBatch>(model, pool)) {}
ParallelDecode::~ParallelDecode() = default;

void ParallelDecode::set_routing_options(const RoutingOptions& options) { batch_->set_routing_options(options); }
const SessionBatch& ParallelDecode::batch() const { return *batch_; }

int ParallelDecode::add(Session& session, int limit, GenerateParams params, DecodeHooks hooks) {
  for (const auto& q : sequences_) {
    if (q && !q->ended && &q->loop.session() == &session) fail("internal: a session decodes twice in one batch");
  }
  sequences_.push_back(std::make_unique<Sequence>(session, limit, std::move(params), std::move(hooks)));
  return static_cast<int>(sequences_.size()) - 1;
}

int ParallelDecode::running() const {
  int n = 0;
  for (const auto& q : sequences_) n += q && !q->ended;
  return n;
}

std::vector<int> ParallelDecode::step(const PromptChunk* chunk) {
  std::vector<int> ended;
  std::vector<Sequence*> fed;
  std::vector<DecodeRows> rows;
  std::vector<StepCost> drafters;
  for (size_t id = 0; id < sequences_.size(); ++id) {
    Sequence* q = sequences_[id].get();
    if (!q || q->ended) continue;
    if (const std::optional<int32_t> token = q->loop.next_to_feed()) {
      fed.push_back(q);
      drafters.emplace_back();
      // Each sequence drafts for itself (its own history, drafter and controller), before the
      // pass that verifies every sequence's draft at once.
      std::vector<int32_t> draft = q->loop.batch_draft(*token, drafters.back());
      const StepCost& d = drafters.back();
      const PassPart drafter{0, 0, d.seconds, d.lookups, d.hits, d.bytes_read, 0};
      rows.push_back(DecodeRows{&q->loop.session(), *token, std::move(draft), drafter});
      continue;
    }
    q->ended = true;
    q->result = q->loop.finish();
    ended.push_back(static_cast<int>(id));
  }
  if (rows.empty() && !chunk) return ended;
  std::vector<size_t> first_records;
  for (const DecodeRows& r : rows) first_records.push_back(r.session->records().size());
  batch_->accept(rows, chunk);
  for (size_t i = 0; i < fed.size(); ++i) fed[i]->loop.batch_fed(first_records[i], std::move(rows[i].draft), rows[i].kept, drafters[i]);
  return ended;
}

GenerateResult ParallelDecode::take(int id) {
  if (id < 0 || static_cast<size_t>(id) >= sequences_.size() || !sequences_[static_cast<size_t>(id)] ||
      !sequences_[static_cast<size_t>(id)]->ended) {
    fail("internal: sequence {} has no answer to take", id);
  }
  GenerateResult r = std::move(sequences_[static_cast<size_t>(id)]->result);
  sequences_[static_cast<size_t>(id)].reset();
  return r;
}

GenerateResult generate(Session& session, const std::vector<int32_t>& prompt, const GenerateParams& params,
                        const PieceCallback& on_piece, const std::atomic<bool>* cancel,
                        const LogprobCallback& on_logprob, const PrefillProgress& on_prefill,
                        const StepCallback& on_step) {
  const int n_ctx = session.state().n_ctx();
  if (prompt.empty()) fail("the prompt is empty");
  if (static_cast<int>(prompt.size()) >= n_ctx) {
    fail("the prompt has {} tokens, more than the context of {}", prompt.size(), n_ctx);
  }
  session.set_sampler(params.sampler);
  PrefillRecord pre;
  const int reused = session.prefill_reusing(prompt, &pre, on_prefill);
  const int limit = std::min(params.max_tokens, n_ctx - static_cast<int>(prompt.size()));
  GenerateResult result = decode_tokens(session, limit, params, {on_piece, on_logprob, on_step, cancel});
  result.prompt_tokens = static_cast<int>(prompt.size());
  result.reused_tokens = reused;
  result.prefill_seconds = pre.seconds;
  return result;
}

}  // namespace bmoe
