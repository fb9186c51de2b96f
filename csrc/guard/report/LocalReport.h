#pragma once

// LocalReport: what a rank can say about a group alone, when the cross-rank
// report cannot be made (the store is gone or does not answer, or the verdict
// did not come in time): its own pending operation and call site, what it
// last read of each peer's status, and the state of the store. Said plainly:
// a report made without the store is still a report.

#include "guard/report/Snapshot.h"
#include "guard/report/StatusRecord.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torch_ext {

struct LocalFacts {
  std::string groupLabel;
  int groupSize = 1;
  int groupRank = 0;
  std::vector<int64_t> globalRanks;  // group rank -> global rank; empty: identity
  SeqProgress progress;              // this rank's
  std::optional<EntryView> pending;  // its oldest pending op (with call site)
  int64_t pendingForNs = 0;
  std::optional<EntryView> lastFailed;  // its last op, when the inner backend failed it
  std::map<int, PeerState> peers;       // group rank -> last status read
  // True: `peers` was read from the store just now for every rank (one that
  // is missing has no status there). False: what the watchdog's exchanges
  // last read (its two ring neighbours), before the store was lost.
  bool everyPeerRead = false;
  int64_t storeHostRank = -1;  // global rank whose process serves the store (-1: none / unknown)
  int64_t nowWallNs = 0;
  int64_t nowSteadyNs = 0;

  int64_t globalRank(int groupRank) const {
    if (groupRank < 0 || static_cast<size_t>(groupRank) >= globalRanks.size()) return groupRank;
    return globalRanks[groupRank];
  }
  // True when every peer's last status says it left or exited.
  bool allPeersDone() const;
};

// First line: "<store> is gone: <why>; group "g" (N ranks) fails on rank R: ...",
// then this rank's pending op and one line per peer.
std::string formatStoreLost(const LocalFacts& f, const std::string& storeLoss);

// The abort deadline passed and the cross-rank verdict did not come: a
// CollectiveTimeoutError report from this rank's view; `why` says why there is
// no cross-rank report.
std::string formatLocalTimeout(const LocalFacts& f, double abortAfterS, const std::string& why);

// The hang report did not come: a warning from this rank's view.
std::string formatLocalHang(const LocalFacts& f, const std::string& why);

// Past abort_after, every rank the collective waits for is busy (issue 68):
// "<header>: the ranks it waits for are busy, so it waits on past
// abort_after=20 s: rank 0 (...); it fails once one of them stops progressing
// or at busy_cap=80 s (TORCH_EXT_BUSY_CAP)". `busy`: global ranks.
std::string formatBusyWait(const LocalFacts& f, const std::vector<int64_t>& busy, double abortAfterS, double busyCapS);

// Where this rank stands in the group when its launcher stops it before any
// verdict: "\n  group "g" (N ranks):", its pending (or failed) operation and
// one line per peer (torchrun's summary, the stopped rank's own stderr).
std::string formatStandingAtStop(const LocalFacts& f);

}  // namespace torch_ext
