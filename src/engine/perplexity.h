// Perplexity of a model on a text, by llama-perplexity's method: the tokens are cut into chunks
// of n_ctx, each evaluated from an empty context (its first token replaced by BOS where the
// vocabulary adds one), and only the second half of each chunk is scored (so every scored
// token has at least n_ctx/2 tokens before it): the negative log-likelihood of token j+1 under
// the logits after token j, for j from n_ctx/2 to n_ctx-2. PPL = exp(mean NLL).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/session.h"

namespace bmoe {

struct PerplexityOptions {
  int n_ctx = 512;       // tokens per chunk (llama-perplexity's -c)
  int n_batch = 512;     // tokens per forward pass
  int max_chunks = -1;   // --chunks: at most this many (-1: all that fit)
  int32_t bos = -1;      // >= 0: each chunk's first token is replaced by it
  // Optional: sees each scored row's logits (n_vocab floats) and the token that follows, in
  // order (saving base logits, KL divergence).
  std::function<void(const float* logits, int32_t next)> on_row;
};

struct PerplexityResult {
  int chunks = 0;
  int64_t count = 0;   // tokens scored
  double nll = 0;      // sum of their negative log-likelihoods
  double nll2 = 0;     // sum of their squares
  std::vector<double> running_ppl;  // the estimate after each chunk (llama-perplexity's [i]x list)
  double ppl() const;
  double ppl_error() const;  // llama-perplexity's "+/-": the standard error carried through exp
};

// Runs on the session's state (its history is cleared). Fails (bmoe::Error) when the tokens do
// not make two chunks (as llama-perplexity refuses) or a chunk does not fit the context.
// `on_chunk` (optional) sees the result after each chunk, for a progress line.
PerplexityResult perplexity(Session& session, const std::vector<int32_t>& tokens, const PerplexityOptions& options,
                            const std::function<void(const PerplexityResult&)>& on_chunk = {});

// -log softmax(logits)[token], in double.
double token_nll(const float* logits, int n_vocab, int32_t token);

}  // namespace bmoe
