#pragma once

// BusyWait: whether a collective past abort_after waits on because every rank
// it waits for is busy (issue 68: busy is not hung). A rank writing a
// checkpoint, compiling or tokenizing for longer than the group's timeout is
// not hung; ending the job there (a barrier timeout killing a 35-minute
// checkpoint write, leaving truncated files) is the harm users reported.
//
// The evidence is each rank's status record (report/StatusRecord.h): its
// heartbeat, how far it has got on the group, and how long its process has
// been quiet (ProgressSampler: the main thread's CPU time, storage bytes). A
// rank the collective waits for (it has not issued the collective's seq) is
// busy when its record is fresh and it showed progress recently: its record's
// quiet time plus the record's age under kBeginQuietMs when the wait begins,
// under kQuietMs since. The
// wait goes on only while every such rank is busy, up to busy_cap; a rank that
// goes quiet, freezes (SIGSTOP: its heartbeat stops), leaves or exits ends it
// as at abort_after.
//
// Pure logic on the records read (the I/O thread reads them; Watchdog.cpp):
// tests drive it with made-up records and clocks.

#include "guard/report/Progress.h"
#include "guard/report/StatusRecord.h"

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <vector>

namespace torch_ext {

struct BusyLook {
  uint64_t seq = 0;              // the collective looked at (0: no look)
  int64_t atSteadyNs = 0;        // when the records were read
  bool waitOn = false;           // at least one rank is awaited and every awaited rank is busy
  std::vector<int> busy;         // awaited ranks that progress (group ranks)
  std::vector<int> stopped;      // awaited ranks quiet, frozen, gone or unknown
  std::vector<int64_t> quietMs;  // per busy rank: how long since it last showed progress
  int lowestArrived = -1;        // the lowest group rank that has issued seq (it says the wait goes on)
};

class BusyWait {
 public:
  // `staleNs`: a heartbeat unchanged this long (on this rank's clock) is a
  // frozen rank's; above the group's exchange period.
  explicit BusyWait(int64_t staleNs) : staleNs_(staleNs) {}

  // `records[r]`: group rank r's status as read at `nowSteadyNs` (nullopt:
  // none); `seq`: the collective that waits; `begun`: its wait past
  // abort_after has begun (a rank busy at the last look then keeps kQuietMs).
  // `nowWallNs` dates a heartbeat seen for the first time (a rank frozen
  // before the first look).
  BusyLook look(const std::vector<std::optional<StatusRecord>>& records, uint64_t seq, int64_t nowSteadyNs,
                int64_t nowWallNs, bool begun);

  // A wait goes on only for ranks that progress now (quiet, with the record's
  // age, under 1.5 s: three sample intervals); once it goes on, a rank is busy
  // until quiet this long (report/Progress.h).
  static constexpr int64_t kBeginQuietMs = 1'500;
  static constexpr int64_t kQuietMs = ProgressFacts::kStoppedAfterNs / 1'000'000;
  // A first-seen heartbeat older than this by the wall clock is stale (clocks
  // across hosts may differ by some: a wrong guess here only ends the wait).
  static constexpr int64_t kFirstSeenStaleNs = 10'000'000'000;

 private:
  struct Seen {
    int64_t heartbeatNs = 0;
    int64_t sinceSteadyNs = 0;  // when this heartbeat was first read
  };
  bool fresh(int rank, const StatusRecord& r, int64_t nowSteadyNs, int64_t nowWallNs);

  int64_t staleNs_;
  std::map<int, Seen> seen_;
  uint64_t seq_ = 0;       // the collective of the last look
  std::set<int> wasBusy_;  // the ranks busy at that look
};

}  // namespace torch_ext
