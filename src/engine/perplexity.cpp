#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace bmoe {

double PerplexityResult::ppl() const { return count > 0 ? std::exp(nll / static_cast<double>(count)) : 0.0; }

double PerplexityResult::ppl_error() const {
  if (count < 2) return 0.0;
  const double mean = nll / static_cast<double>(count);
  double variance = nll2 / static_cast<double>(count) - mean * mean;
  if (variance <= 0) return 0.0;
  return ppl() * std::sqrt(variance / static_cast<double>(count - 1));
}

double token_nll(const float* logits, int n_vocab, int32_t token) {
  const float max = *std::max_element(logits, logits + n_vocab);
  double sum = 0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  return std::log(sum) - (static_cast<double>(logits[token]) - max);
}

namespace {

// One chunk from an empty context: adds the scored tokens' NLL to `result`.
void score_chunk(InferenceState& state, std::vector<int32_t> chunk, const PerplexityOptions& o, int n_vocab,
                 PerplexityResult& result) {
  if (o.bos >= 0) chunk[0] = o.bos;
  state.truncate(0);
  state.set_prefill(true);
  const int first = o.n_ctx / 2;
  for (int start = 0; start < o.n_ctx; start += o.n_batch) {
    const int n = std::min(o.n_batch, o.n_ctx - start);
    const std::vector<float>& logits = state.eval(chunk.data() + start, n, /*all_logits=*/true);
    // Row i predicts token start+i+1; scored from `first` to the chunk's second-last token.
    for (int i = std::max(0, first - start); i < n && start + i + 1 < o.n_ctx; ++i) {
      const float* row = logits.data() + static_cast<size_t>(i) * n_vocab;
      if (o.on_row) o.on_row(row, chunk[start + i + 1]);
      const double nll = token_nll(row, n_vocab, chunk[start + i + 1]);
      result.nll += nll;
      result.nll2 += nll * nll;
      ++result.count;
    }
  }
  state.set_prefill(false);
}

}  // namespace

PerplexityResult perplexity(Session& session, const std::vector<int32_t>& tokens, const PerplexityOptions& o,
                            const std::function<void(const PerplexityResult&)>& on_chunk) {
  session.reset();
  InferenceState& state = session.state();
  if (o.n_ctx < 4 || o.n_batch < 1) fail("perplexity needs a context of at least 4 tokens and a batch of at least 1");
  if (o.n_ctx > state.n_ctx()) fail("perplexity: chunks of {} tokens do not fit the context of {}", o.n_ctx, state.n_ctx());
  if (tokens.size() < 2 * static_cast<size_t>(o.n_ctx)) {
    fail("the text has {} tokens; perplexity with a context of {} needs at least {} (two chunks)", tokens.size(), o.n_ctx,
         2 * o.n_ctx);
  }
  const int available = static_cast<int>(tokens.size() / static_cast<size_t>(o.n_ctx));
  const int chunks = o.max_chunks < 0 ? available : std::min(o.max_chunks, available);
  const int n_vocab = session.model().transformer->config().n_vocab;
  PerplexityResult result;
  for (int c = 0; c < chunks; ++c) {
    const auto begin = tokens.begin() + static_cast<std::ptrdiff_t>(c) * o.n_ctx;
    score_chunk(state, std::vector<int32_t>(begin, begin + o.n_ctx), o, n_vocab, result);
    result.chunks = c + 1;
    result.running_ppl.push_back(result.ppl());
    if (on_chunk) on_chunk(result);
  }
  session.reset();
  return result;
}

}  // namespace bmoe
