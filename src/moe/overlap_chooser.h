// Chooses, forward pass by forward pass, whether the streamer overlaps reads with compute.
//
// Overlap hides compute behind flash when both take similar time, but on a machine with few
// cores the two also slow each other down: measured on a 2-core VM with the Gemma-4 shape at
// cache 0, reads took 24 % longer and compute 50 % longer while running together, and overlap
// lost 14 % against serial. Which mode wins depends on the machine, the model and the cache, so
// it is measured: a few passes in each mode, alternated (the cache warms evenly under both),
// then the faster mode by median pass time, re-checked periodically. Both modes compute the
// same experts (overlap hands out hits first and misses as they land, but each expert's result
// goes to its own slot and slots are summed in slot order), so the choice never changes the
// output.
#pragma once

#include <cstdint>
#include <vector>

namespace bmoe {

class OverlapChooser {
 public:
  // enabled = false: always serial. adapt = false: always overlap (when enabled).
  OverlapChooser(bool enabled, bool adapt);

  // A forward pass starts at `now_seconds`; returns whether it overlaps. The time since the
  // previous start is that pass's duration.
  bool start_pass(double now_seconds);

  uint64_t overlapped_passes() const { return overlapped_; }
  uint64_t serial_passes() const { return serial_; }
  // Medians of the latest probe, seconds per pass (0 until one finished).
  double probe_overlap_seconds() const { return probe_overlap_; }
  double probe_serial_seconds() const { return probe_serial_; }

  // Schedule, in passes: the first kWarmup are not measured (the prompt, a cold cache); a probe
  // alternates the modes for 2 x kProbe passes; one starts every kPeriod passes.
  static constexpr int kWarmup = 2;
  static constexpr int kProbe = 6;
  static constexpr int kPeriod = 96;

 private:
  // A pass's place in the probe (0 .. 2 kProbe - 1), or -1 outside one (warm-up included).
  static int probe_slot(uint64_t pass);
  bool mode_for(uint64_t pass) const;
  void settle_probe();

  bool enabled_, adapt_;
  uint64_t pass_ = 0;  // passes started
  double last_start_ = 0.0;
  bool last_mode_ = false;
  bool chosen_ = true;  // the mode between probes
  std::vector<double> overlap_times_, serial_times_;
  double probe_overlap_ = 0.0, probe_serial_ = 0.0;
  uint64_t overlapped_ = 0, serial_ = 0;
};

}  // namespace bmoe
