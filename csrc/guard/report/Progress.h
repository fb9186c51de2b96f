#pragma once

// Progress: what a rank's process did over its last seconds, as the watchdog
// sampled it (watchdog/ProgressSampler.h): the CPU time its main thread ran
// and the bytes it read from and wrote to storage (issue 68: busy is not
// hung). A rank that has not arrived at a collective while its main thread
// runs (torch.compile, tokenizing, writing a checkpoint) is busy; one whose
// main thread has run nothing and that moved no bytes for seconds (asleep,
// blocked in a lock, a socket or another collective) is not progressing.
//
// Its limits: a main thread in a busy loop looks busy; work done only by other
// threads or child processes while the main thread waits for them (a data
// pipeline, a pool, an asynchronous checkpoint's writer) does not count: the
// figures are the main thread's own.

#include <cstdint>
#include <string>

namespace torch_ext {

struct ProgressFacts {
  bool known = false;    // sampled (Linux /proc); nothing is said otherwise
  int64_t windowNs = 0;  // the span the figures cover (the last samples, at most kWindowNs)
  int64_t cpuNs = 0;     // CPU time of the main thread in the window
  int64_t ioBytes = -1;  // storage bytes read and written in the window (-1: not known)
  int64_t quietNs = 0;   // since the last sample that showed progress (the whole sampled span if none did)
  // Progressing now: the latest sample interval, which ends when the facts
  // are read, showed progress. A sample interval shows progress when the
  // main thread ran at least kCpuShare of it, or it moved at least
  // kIoBytes of storage.
  bool busy = false;

  static constexpr int64_t kWindowNs = 30'000'000'000;
  static constexpr double kCpuShare = 0.05;
  static constexpr int64_t kIoBytes = 256 * 1024;
  // Quiet this long, a rank a collective waits for past abort_after has
  // stopped progressing (watchdog/BusyWait.h): above the pauses of a busy
  // rank's own work (a checkpoint's flush), far below a stuck rank's silence.
  static constexpr int64_t kStoppedAfterNs = 5'000'000'000;
};

// "busy, not hung: in the last 10.0 s its main thread ran 9.8 s of CPU and the
// moved 1.2 GB to and from storage" or "not progressing for 12.0 s: its main thread idle, no
// storage I/O"; "" when not known.
std::string describeProgress(const ProgressFacts& p);

}  // namespace torch_ext
