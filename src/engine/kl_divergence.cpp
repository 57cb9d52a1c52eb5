#include "engine/kl_divergence.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace bmoe {

namespace {

constexpr char kMagic[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};
constexpr float kLogRange = 16.0f;  // log-probs more than this below the top are saved as the floor

// u16 per saved row: the row's scale and min log-prob (two floats), then one per token, even.
size_t row_words(int n_vocab) { return static_cast<size_t>(2 * ((n_vocab + 1) / 2) + 4); }

// A mean and its standard error (0 for fewer than 11 values), as llama-perplexity reports them.
std::pair<double, double> mean_and_error(double sum, double sum2, int64_t count) {
  if (count < 1) return {0.0, 0.0};
  const double mean = sum / static_cast<double>(count);
  const double var = sum2 / static_cast<double>(count) - mean * mean;
  return {mean, var > 0 && count > 10 ? std::sqrt(var / static_cast<double>(count - 1)) : 0.0};
}

double covariance(double sum_a, double sum_b, double sum_ab, int64_t count) {
  if (count < 10) return 0.0;
  const double n = static_cast<double>(count);
  return (sum_ab / n - (sum_a / n) * (sum_b / n)) / (n - 1);
}

}  // namespace

BaseLogitsWriter::BaseLogitsWriter(const std::string& path, int n_ctx, int n_vocab, int n_chunk,
                                   const std::vector<int32_t>& tokens)
    : out_(path, std::ios::binary | std::ios::trunc), path_(path), n_vocab_(n_vocab), row_(row_words(n_vocab)) {
  if (!out_) fail("cannot write {}", path);
  const uint32_t ctx = static_cast<uint32_t>(n_ctx);
  out_.write(kMagic, sizeof(kMagic));
  out_.write(reinterpret_cast<const char*>(&ctx), sizeof(ctx));
  out_.write(reinterpret_cast<const char*>(&n_vocab), sizeof(n_vocab));
  out_.write(reinterpret_cast<const char*>(&n_chunk), sizeof(n_chunk));
  out_.write(reinterpret_cast<const char*>(tokens.data()),
             static_cast<std::streamsize>(static_cast<size_t>(n_ctx) * static_cast<size_t>(n_chunk) * sizeof(int32_t)));
}

void BaseLogitsWriter::add_row(const float* logits) {
  const auto [lo, hi] = std::minmax_element(logits, logits + n_vocab_);
  const float max_logit = *hi;
  const float min_logit = std::max(*lo, max_logit - kLogRange);
  double sum_exp = 0;
  for (int i = 0; i < n_vocab_; ++i) sum_exp += std::exp(logits[i] - max_logit);
  const float head[2] = {(max_logit - min_logit) / 65535.0f,
                         min_logit - max_logit - static_cast<float>(std::log(sum_exp))};
  std::memcpy(row_.data(), head, sizeof(head));
  uint16_t* q = row_.data() + 4;
  std::fill(q, row_.data() + row_.size(), uint16_t{0});
  if (head[0] > 0) {
    const float inv = 1.0f / head[0];
    for (int i = 0; i < n_vocab_; ++i) {
      if (logits[i] > min_logit) q[i] = static_cast<uint16_t>(std::lrintf(inv * (logits[i] - min_logit)));
    }
  }
  out_.write(reinterpret_cast<const char*>(row_.data()), static_cast<std::streamsize>(row_.size() * sizeof(uint16_t)));
}

void BaseLogitsWriter::finish() {
  out_.flush();
  if (!out_) fail("writing {} failed (disk full?)", path_);
}

BaseLogitsReader::BaseLogitsReader(const std::string& path) : in_(path, std::ios::binary), path_(path) {
  if (!in_) fail("cannot read {}", path);
  char magic[8] = {};
  uint32_t ctx = 0;
  in_.read(magic, sizeof(magic));
  in_.read(reinterpret_cast<char*>(&ctx), sizeof(ctx));
  in_.read(reinterpret_cast<char*>(&n_vocab_), sizeof(n_vocab_));
  in_.read(reinterpret_cast<char*>(&n_chunk_), sizeof(n_chunk_));
  if (!in_ || std::memcmp(magic, kMagic, sizeof(magic)) != 0) fail("{} is not a file of saved logits (llama-perplexity's)", path);
  if (ctx < 4 || ctx > (1u << 24) || n_vocab_ < 1 || n_chunk_ < 1 || n_chunk_ > (1 << 24)) {
    fail("{}: implausible header (n_ctx {}, n_vocab {}, n_chunk {})", path, ctx, n_vocab_, n_chunk_);
  }
  n_ctx_ = static_cast<int>(ctx);
  tokens_.resize(static_cast<size_t>(n_ctx_) * static_cast<size_t>(n_chunk_));
  in_.read(reinterpret_cast<char*>(tokens_.data()), static_cast<std::streamsize>(tokens_.size() * sizeof(int32_t)));
  if (!in_) fail("{}: cut short in its tokens", path);
  row_.resize(row_words(n_vocab_));
}

const uint16_t* BaseLogitsReader::next_row() {
  in_.read(reinterpret_cast<char*>(row_.data()), static_cast<std::streamsize>(row_.size() * sizeof(uint16_t)));
  if (!in_) fail("{}: cut short in its saved logits", path_);
  return row_.data();
}

void KlDivergence::add(const float* logits, int n_vocab, const uint16_t* base_row, int32_t next) {
  const float* top = std::max_element(logits, logits + n_vocab);
  const float max_logit = *top;
  double sum_exp = 0;
  for (int i = 0; i < n_vocab; ++i) sum_exp += std::exp(logits[i] - max_logit);
  const float log_norm = max_logit + static_cast<float>(std::log(sum_exp));  // log-prob = logit - log_norm
  float head[2];
  std::memcpy(head, base_row, sizeof(head));
  const uint16_t* q = base_row + 4;
  const float nll = log_norm - logits[next];
  const float nll_base = -(head[0] * q[next] + head[1]);
  sum_nll += nll;
  sum_nll2 += static_cast<double>(nll) * nll;
  sum_nll_base += nll_base;
  sum_nll_base2 += static_cast<double>(nll_base) * nll_base;
  sum_nll_nll_base += static_cast<double>(nll) * nll_base;
  double kld = 0;
  int top_base = 0;
  float top_base_log_p = 0;
  for (int i = 0; i < n_vocab; ++i) {
    const float log_p_base = head[0] * q[i] + head[1];
    if (i == 0 || log_p_base > top_base_log_p) {
      top_base_log_p = log_p_base;
      top_base = i;
    }
    if (log_p_base > -kLogRange) kld += std::exp(log_p_base) * (log_p_base - (logits[i] - log_norm));
  }
  sum_kld += kld;
  sum_kld2 += kld * kld;
  max_kld = std::max(max_kld, static_cast<float>(kld));
  same_top += (top - logits) == top_base;
  ++count;
  const double p_diff = std::exp(-nll) - std::exp(-nll_base);
  sum_p_diff += p_diff;
  sum_p_diff2 += p_diff * p_diff;
  sum_p_diff4 += p_diff * p_diff * p_diff * p_diff;
  max_p_diff = std::max(max_p_diff, static_cast<float>(std::fabs(p_diff)));
}

std::string KlDivergence::chunk_line(int chunk) const {
  const auto ln_ppl = mean_and_error(sum_nll, sum_nll2, count);
  const auto ln_base = mean_and_error(sum_nll_base, sum_nll_base2, count);
  const double cov = covariance(sum_nll, sum_nll_base, sum_nll_nll_base, count);
  const double ratio_error = std::sqrt(std::max(0.0, ln_ppl.second * ln_ppl.second + ln_base.second * ln_base.second - 2 * cov));
  const auto kl = mean_and_error(sum_kld, sum_kld2, count);
  const auto p_mse = mean_and_error(sum_p_diff2, sum_p_diff4, count);
  const double rms = std::sqrt(p_mse.first);
  const double top = count ? static_cast<double>(same_top) / static_cast<double>(count) : 0.0;
  const double top_error = count > 1 ? std::sqrt(top * (1 - top) / static_cast<double>(count - 1)) : 0.0;
  return fmt::format("{:4d}    {:9.4f} ± {:9.4f}    {:10.5f} ± {:10.5f}    {:10.5f} ± {:10.5f}    {:6.3f} ± {:6.3f} %    "
                     "{:6.3f} ± {:6.3f} %\n",
                     chunk, std::exp(ln_ppl.first), std::exp(ln_ppl.first) * ln_ppl.second, ln_ppl.first - ln_base.first,
                     ratio_error, kl.first, kl.second, 100 * rms, rms > 0 ? 100 * 0.5 / rms * p_mse.second : 0.0, 100 * top,
                     100 * top_error);
}

std::string KlDivergence::summary() const {
  const auto ln_ppl = mean_and_error(sum_nll, sum_nll2, count);
  const auto ln_base = mean_and_error(sum_nll_base, sum_nll_base2, count);
  const double cov = covariance(sum_nll, sum_nll_base, sum_nll_nll_base, count);
  const double ratio = ln_ppl.first - ln_base.first;
  const double ratio_error = std::sqrt(std::max(0.0, ln_ppl.second * ln_ppl.second + ln_base.second * ln_base.second - 2 * cov));
  const auto kl = mean_and_error(sum_kld, sum_kld2, count);
  const auto p_mse = mean_and_error(sum_p_diff2, sum_p_diff4, count);
  const double rms = std::sqrt(p_mse.first);
  const double top = count ? static_cast<double>(same_top) / static_cast<double>(count) : 0.0;
  std::string s = "====== Perplexity statistics ======\n";
  s += fmt::format("Mean PPL(Q)                   : {:10.6f} ± {:10.6f}\n", std::exp(ln_ppl.first), std::exp(ln_ppl.first) * ln_ppl.second);
  s += fmt::format("Mean PPL(base)                : {:10.6f} ± {:10.6f}\n", std::exp(ln_base.first), std::exp(ln_base.first) * ln_base.second);
  s += fmt::format("Mean ln(PPL(Q)/PPL(base))     : {:10.6f} ± {:10.6f}\n", ratio, ratio_error);
  s += fmt::format("Mean PPL(Q)/PPL(base)         : {:10.6f} ± {:10.6f}\n\n", std::exp(ratio), std::exp(ratio) * ratio_error);
  s += "====== KL divergence statistics ======\n";
  s += fmt::format("Mean    KLD: {:10.6f} ± {:10.6f}\n", kl.first, kl.second);
  s += fmt::format("Maximum KLD: {:10.6f}\n\n", max_kld);
  s += "====== Token probability statistics ======\n";
  s += fmt::format("Maximum |Δp|: {:6.3f}%\n", 100.0 * max_p_diff);
  s += fmt::format("RMS Δp    : {:6.3f} ± {:5.3f} %\n", 100 * rms, rms > 0 ? 100 * 0.5 / rms * p_mse.second : 0.0);
  s += fmt::format("Same top p: {:6.3f} ± {:5.3f} %\n", 100 * top,
                   count > 1 ? 100 * std::sqrt(top * (1 - top) / static_cast<double>(count - 1)) : 0.0);
  return s;
}

}  // namespace bmoe
