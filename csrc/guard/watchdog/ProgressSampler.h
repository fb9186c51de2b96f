#pragma once

// ProgressSampler: this process's progress over its last seconds (issue 68:
// busy is not hung), sampled by the watchdog thread on its ticks: the CPU
// time of the main thread (Linux: /proc/self/task/<pid>/schedstat, to the ns, or stat in clock ticks; the thread whose
// id is the process's) and the storage bytes the process read and wrote
// (/proc/self/task/<pid>/io: the main thread's own, so the guard's dump writes
// and code pages other threads fault in are not counted). A snapshot carries what it says (report/Progress.h), so a
// report tells a rank that has not arrived because it works from one that
// waits on nothing. Elsewhere (no /proc) nothing is known and nothing is said.

#include "guard/report/Progress.h"

#include <cstdint>
#include <deque>
#include <mutex>

namespace torch_ext {

class ProgressSampler {
 public:
  static ProgressSampler& instance();

  // Takes a sample if the last is at least kEveryNs old (`nowNs`: steady clock).
  void sample(int64_t nowNs);
  // What this process does now: a fresh sample (unless the last is under
  // kFreshNs old), then facts(nowNs). What a snapshot says.
  ProgressFacts now(int64_t nowNs);
  // What the samples say at `nowNs` (known: at least two samples).
  ProgressFacts facts(int64_t nowNs) const;

  struct Sample {
    int64_t atNs = 0;
    int64_t cpuNs = 0;     // the main thread's CPU time so far
    int64_t ioBytes = -1;  // storage bytes read and written so far (-1: not known)
  };
  // The rule, on given samples (tests): adds `s`, keeping kWindowNs of them.
  void add(const Sample& s);

 private:
  void take(int64_t nowNs, int64_t minAgeNs);

  static constexpr int64_t kEveryNs = 500'000'000;
  static constexpr int64_t kFreshNs = 200'000'000;

  mutable std::mutex mu_;
  std::deque<Sample> samples_;
  int64_t lastProgressNs_ = 0;     // 0: no interval showed progress yet
  bool latestProgressed_ = false;  // the latest interval showed progress
  bool readable_ = true;           // /proc answered
};

}  // namespace torch_ext
