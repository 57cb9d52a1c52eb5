// KL divergence of a model against saved base logits, in llama-perplexity's file format and
// with its statistics: `--kl-divergence-base FILE` without `--kl-divergence` saves the scored
// rows of a perplexity run; with it, a later run (the lossy model or knob) reads the tokens
// from the file, scores the same rows and compares its distributions with the saved ones.
//
// File (little-endian, as llama.cpp writes it): "_logits_", n_ctx (u32), n_vocab (i32),
// n_chunk (i32), the n_chunk * n_ctx token ids (i32), then per chunk and scored row nv =
// 2 * ((n_vocab + 1) / 2) + 4 u16: a float scale and a float min log-prob (in the first 4),
// then each token's log-prob as round((logit - min_logit) / scale), where min_logit is the
// row's smallest logit but at least max - 16 (smaller ones are 0).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace bmoe {

class BaseLogitsWriter {
 public:
  // Writes the header and the chunks' tokens; fails (bmoe::Error) when the file cannot be written.
  BaseLogitsWriter(const std::string& path, int n_ctx, int n_vocab, int n_chunk, const std::vector<int32_t>& tokens);
  void add_row(const float* logits);
  void finish();  // fails when a write failed

 private:
  std::ofstream out_;
  std::string path_;
  int n_vocab_;
  std::vector<uint16_t> row_;
};

class BaseLogitsReader {
 public:
  // Reads the header and tokens; fails (bmoe::Error, one line) on a file that is not one.
  explicit BaseLogitsReader(const std::string& path);
  int n_ctx() const { return n_ctx_; }
  int n_vocab() const { return n_vocab_; }
  int n_chunk() const { return n_chunk_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const uint16_t* next_row();  // the next saved row; fails past the end

 private:
  std::ifstream in_;
  std::string path_;
  int n_ctx_ = 0, n_vocab_ = 0, n_chunk_ = 0;
  std::vector<int32_t> tokens_;
  std::vector<uint16_t> row_;
};

// llama-perplexity's KL sums over the scored rows.
struct KlDivergence {
  double sum_nll = 0, sum_nll2 = 0, sum_nll_base = 0, sum_nll_base2 = 0, sum_nll_nll_base = 0;
  double sum_kld = 0, sum_kld2 = 0, sum_p_diff = 0, sum_p_diff2 = 0, sum_p_diff4 = 0;
  float max_kld = 0, max_p_diff = 0;
  int64_t same_top = 0, count = 0;

  void add(const float* logits, int n_vocab, const uint16_t* base_row, int32_t next);
  // The statistics as llama-perplexity prints them (one "chunk" line, the closing tables).
  std::string chunk_line(int chunk) const;
  std::string summary() const;
};

}  // namespace bmoe
