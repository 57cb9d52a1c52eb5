#include "engine/speculative.h"

#include <algorithm>

#include "core/error.h"
#include "core/rng.h"
#include "text/sampler.h"

namespace bmoe {

std::vector<int32_t> oracle_draft(const std::vector<int32_t>& oracle, const std::vector<int32_t>& sequence, int max_tokens) {
  if (sequence.size() >= oracle.size() || !std::equal(sequence.begin(), sequence.end(), oracle.begin())) return {};
  const size_t n = std::min(oracle.size() - sequence.size(), static_cast<size_t>(std::max(0, max_tokens)));
  return std::vector<int32_t>(oracle.begin() + static_cast<std::ptrdiff_t>(sequence.size()),
                              oracle.begin() + static_cast<std::ptrdiff_t>(sequence.size() + n));
}

std::vector<int32_t> ngram_draft(const std::vector<int32_t>& sequence, int max_tokens, int ngram_max, int ngram_min) {
  std::vector<int32_t> draft;
  const int n = static_cast<int>(sequence.size());
  if (max_tokens <= 0) return draft;
  for (int g = std::min(ngram_max, n - 1); g >= std::max(1, ngram_min); --g) {
    const int32_t* suffix = sequence.data() + n - g;
    // Latest earlier occurrence first: recent text predicts the next tokens best.
    for (int start = n - g - 1; start >= 0; --start) {
      if (!std::equal(suffix, suffix + g, sequence.data() + start)) continue;
      const int from = start + g;
      const int count = std::min(max_tokens, n - from);
      draft.assign(sequence.begin() + from, sequence.begin() + from + count);
      return draft;
    }
  }
  return draft;
}

std::vector<int32_t> NgramDrafter::propose(const std::vector<int32_t>& sequence, int max_tokens) {
  return ngram_draft(sequence, max_tokens, ngram_max_, ngram_min_);
}

void corrupt_draft(std::vector<int32_t>& draft, int first_position, double accept, uint64_t seed) {
  if (accept >= 1.0) return;
  for (size_t i = 0; i < draft.size(); ++i) {
    uint64_t state = seed ^ (0x51ED2701ull * static_cast<uint64_t>(first_position + static_cast<int>(i) + 1));
    const double draw = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
    if (draw >= accept) draft[i] = draft[i] > 0 ? draft[i] - 1 : draft[i] + 1;  // any other id is wrong
  }
}

std::vector<int32_t> OracleDrafter::propose(const std::vector<int32_t>& sequence, int max_tokens) {
  std::vector<int32_t> draft = oracle_draft(oracle_, sequence, max_tokens);
  corrupt_draft(draft, static_cast<int>(sequence.size()), accept_, seed_);
  return draft;
}

std::vector<int32_t> OracleOverMtpDrafter::propose(const std::vector<int32_t>& sequence, int max_tokens) {
  const size_t proposed = mtp_.propose(sequence, max_tokens).size();
  return oracle_.propose(sequence, static_cast<int>(proposed));
}

namespace {

int32_t greedy_guess(const MtpStep& step) {
  if (step.logits.empty()) fail("MTP head: a draft step returned no logits");
  return Sampler::argmax(step.logits.data(), static_cast<int>(step.logits.size()));
}

}  // namespace

std::vector<MtpStep> mtp_steps(MtpHead& head, const std::vector<int32_t>& sequence, int max_tokens, int max_catch_up) {
  return mtp_steps_over(head, head.take_hidden_states(), sequence, max_tokens, max_catch_up);
}

std::vector<MtpStep> mtp_steps_over(MtpHead& head, std::vector<std::vector<float>> rows,
                                    const std::vector<int32_t>& sequence, int max_tokens, int max_catch_up) {
  // The trunk evaluated every position but the last (the token about to be fed); the new hidden
  // states end at the one before it.
  if (rows.size() + 1 > sequence.size()) {
    fail("MTP head: {} hidden states for a sequence of {} tokens", rows.size(), sequence.size());
  }
  if (rows.empty() || max_tokens <= 0) return {};
  if (max_catch_up > 0 && rows.size() > static_cast<size_t>(max_catch_up)) {
    rows.erase(rows.begin(), rows.end() - max_catch_up);  // the head restarts after a gap
  }
  const int first = static_cast<int>(sequence.size() - 1 - rows.size());
  // Row j is position first + j; the head pairs it with the token after it. Position 0 has no
  // hidden state before it: llama.cpp pairs its token with zeros, and so does this.
  std::vector<float> hidden;
  std::vector<int32_t> tokens;
  if (first == 0) {
    hidden.assign(rows.front().size(), 0.0f);
    tokens.push_back(sequence.front());
  }
  for (size_t j = 0; j < rows.size(); ++j) {
    hidden.insert(hidden.end(), rows[j].begin(), rows[j].end());
    tokens.push_back(sequence[static_cast<size_t>(first) + j + 1]);
  }
  std::vector<MtpStep> steps{head.draft(first == 0 ? 0 : first + 1, hidden, tokens)};
  const int next = static_cast<int>(sequence.size());  // the first guess's position
  for (int k = 1; k < max_tokens; ++k) {
    const int32_t guess = greedy_guess(steps.back());
    steps.push_back(head.draft(next + k - 1, steps.back().hidden, std::span<const int32_t>(&guess, 1)));
  }
  return steps;
}

std::vector<int32_t> MtpDrafter::propose(const std::vector<int32_t>& sequence, int max_tokens) {
  std::vector<int32_t> draft;
  // The first call catches the head up on the whole prompt; later ones on at most
  // kMtpMaxCatchUp rows (those a pause of drafting left).
  const int cap = caught_up_ ? kMtpMaxCatchUp : 0;
  for (const MtpStep& step : mtp_steps(head_, sequence, max_tokens, cap)) draft.push_back(greedy_guess(step));
  caught_up_ = caught_up_ || !draft.empty();
  return draft;
}

std::unique_ptr<Drafter> make_drafter(const DraftConfig& config, MtpHead* mtp_head) {
  if (config.mtp) {
    if (!mtp_head) {
      fail("--mtp: this model has no multi-token-prediction (nextn) block to draft with; use --draft N --ngram");
    }
    if (!config.oracle.empty()) {
      return std::make_unique<OracleOverMtpDrafter>(
          *mtp_head, OracleDrafter(config.oracle, config.oracle_accept, config.oracle_seed));
    }
    return std::make_unique<MtpDrafter>(*mtp_head);
  }
  if (!config.oracle.empty()) {
    return std::make_unique<OracleDrafter>(config.oracle, config.oracle_accept, config.oracle_seed);
  }
  return std::make_unique<NgramDrafter>(config.ngram_max, config.ngram_min);
}

namespace {
// The average is over draft tokens tried: a verification that keeps `a` of its drafts tried
// a + 1 of them when it rejected one (the tokens after the first rejection were never judged),
// a when it kept all. Counting every drafted token instead put a drafter right 70 % of the time
// near 40 % at 3 drafts, and pauses followed.
constexpr double kAverageWeight = 0.3;   // weight of the newest token while on probation
constexpr double kProvenWeight = 0.1;    // after probation: a long memory, few false pauses
constexpr int kProbationTokens = 4;      // tokens tried after a start or a resume
constexpr double kLowAcceptance = 0.25;  // below this, drafting costs more than it saves
// A drafter starts, and resumes after a pause, on probation: its average starts here, so two
// fruitless verifications in a row pause it at first and one does after a pause (a drafter that
// is right 70 % of the time keeps going with 91 % odds at first).
constexpr double kFirstAcceptance = 0.5;
constexpr double kResumedAcceptance = 0.3;
constexpr int kPauseSteps = 32;          // plain steps before trying again
constexpr int kMaxPauseSteps = 512;      // the longest pause, after many fruitless tries
}  // namespace

DraftController::DraftController(DraftConfig config)
    : config_(config), length_(1), acceptance_(kFirstAcceptance), next_pause_(kPauseSteps) {}

int DraftController::length() const { return pause_ > 0 ? 0 : length_; }

void DraftController::report(int drafted, int accepted) {
  if (drafted <= 0) {
    if (pause_ > 0) --pause_;
    return;
  }
  ++verify_steps_;
  drafted_total_ += drafted;
  accepted_total_ += accepted;
  const int tried = accepted < drafted ? accepted + 1 : accepted;
  for (int i = 0; i < tried; ++i, ++tried_since_resume_) {
    const double w = tried_since_resume_ < kProbationTokens ? kAverageWeight : kProvenWeight;
    acceptance_ = (1.0 - w) * acceptance_ + w * (i < accepted ? 1.0 : 0.0);
  }
  if (accepted == drafted) length_ = std::min(config_.max_draft, length_ + 1);
  else length_ = std::max(1, accepted + 1);
  if (accepted > 0) next_pause_ = kPauseSteps;
  if (acceptance_ < kLowAcceptance) {
    pause_ = next_pause_;
    next_pause_ = std::min(kMaxPauseSteps, 2 * next_pause_);
    acceptance_ = kResumedAcceptance;
    tried_since_resume_ = 0;
    length_ = 1;  // the cheapest try: one draft token, two rows to verify
  }
}

}  // namespace bmoe
