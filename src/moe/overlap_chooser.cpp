#include "moe/overlap_chooser.h"

#include <algorithm>

namespace bmoe {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  return v[mid];
}

}  // namespace

OverlapChooser::OverlapChooser(bool enabled, bool adapt) : enabled_(enabled), adapt_(adapt) {}

// Pass p (counted from 0) is in a probe when (p - kWarmup) mod kPeriod < 2 kProbe.
int OverlapChooser::probe_slot(uint64_t pass) {
  if (pass < static_cast<uint64_t>(kWarmup)) return -1;
  const uint64_t in_period = (pass - kWarmup) % kPeriod;
  return in_period < 2 * static_cast<uint64_t>(kProbe) ? static_cast<int>(in_period) : -1;
}

// Probes alternate overlap, serial, overlap, ...; the warm-up overlaps.
bool OverlapChooser::mode_for(uint64_t pass) const {
  if (!enabled_) return false;
  if (!adapt_ || pass < static_cast<uint64_t>(kWarmup)) return true;
  const int slot = probe_slot(pass);
  return slot >= 0 ? slot % 2 == 0 : chosen_;
}

void OverlapChooser::settle_probe() {
  probe_overlap_ = median(overlap_times_);
  probe_serial_ = median(serial_times_);
  chosen_ = probe_overlap_ <= probe_serial_;
  overlap_times_.clear();
  serial_times_.clear();
}

bool OverlapChooser::start_pass(double now_seconds) {
  // The pass that just ended, if it was part of a probe.
  const int ended_slot = adapt_ && enabled_ && pass_ > 0 ? probe_slot(pass_ - 1) : -1;
  if (ended_slot >= 0) {
    (last_mode_ ? overlap_times_ : serial_times_).push_back(now_seconds - last_start_);
    if (ended_slot == 2 * kProbe - 1) settle_probe();
  }
  const bool mode = mode_for(pass_);
  ++pass_;
  last_start_ = now_seconds;
  last_mode_ = mode;
  ++(mode ? overlapped_ : serial_);
  return mode;
}

}  // namespace bmoe
