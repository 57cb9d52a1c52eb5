// A progress bar on stderr for long work (writing a model, loading, benchmarks).
// Redraws at most ~10 times a second; prints plain lines when stderr is not a terminal.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace bmoe {

class Progress {
 public:
  Progress(std::string label, uint64_t total, bool enabled = true);
  ~Progress();
  void advance(uint64_t amount) { update(done_ + amount); }
  void update(uint64_t done);
  void finish();

 private:
  void draw(bool final_draw);
  std::string label_;
  uint64_t total_;
  uint64_t done_ = 0;
  bool enabled_;
  bool tty_;
  bool finished_ = false;
  int last_percent_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
};

// Human-readable byte count: "1.50 GiB".
std::string format_bytes(uint64_t bytes);

}  // namespace bmoe
