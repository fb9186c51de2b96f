#pragma once

// StragglerBoard: who the other ranks of a group wait for, from the waits
// every rank publishes (WaitRecord), before anything is stuck.
//
// The group's rank 0 looks at every rank's status record now and then
// (Watchdog). For each window of collectives that every rank shows, a rank is
// a straggler when the median wait of the other ranks exceeds its own by at
// least `threshold` of the window's median span: it arrived late and they
// waited for it. The others' heaviest call site tells where (a phase: the
// training step's gradient all_reduce, a validation metric sync, ...).
//
// Windows shorter than kMinWindowNs (a few of DDP's overlapping bucket
// all_reduces, a fraction of a step) are left for a coarser level: their
// differences are noise. One window proves little on a noisy host either, so
// a rank is named only when it was the straggler at a call site in at least
// kMinWindows of the last kHistory windows and in at least half of the
// windows whose waits were heaviest there. A rank slow only in validation is
// named for validation's call site, even though most windows (training) name
// nobody.
//
// Pure arithmetic: no store, no clock, no Python (the caller resolves call
// site keys and hosts into words).

#include "guard/report/WaitRecord.h"
#include "guard/report/Json.h"

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torch_ext {

// A group's first collectives are set-up (DDP's broadcasts of parameters and
// buffers), not steps: the straggler rule and the step pattern skip them, live
// (WatchdogStragglers.cpp) and in dumps (DumpStragglers.cpp) alike.
constexpr uint64_t kSetupCollectives = 8;

// One window that every rank showed, as analysed.
struct StragglerWindow {
  uint8_t level = 0;
  uint64_t firstSeq = 0;
  uint64_t lastSeq = 0;
  std::vector<int64_t> waitNs;  // by group rank
  std::vector<int64_t> spanNs;  // by group rank
  int64_t medianSpanNs = 0;
  uint64_t siteKey = 0;          // where the non-straggling ranks waited most
  uint32_t siteCollectives = 0;  // their collectives there in this window (median)
  struct Late {
    int rank = 0;        // group rank
    int64_t lostNs = 0;  // the other ranks' mean wait minus its own
  };
  std::vector<Late> late;  // the window's stragglers, latest first
};

// A rank named: what the others lost to it, where.
struct Straggler {
  int rank = 0;  // group rank
  std::string host;
  uint64_t siteKey = 0;
  int windows = 0;         // windows in which it was the straggler at that site
  int siteWindows = 0;     // windows whose waits were heaviest at that site
  int historyWindows = 0;  // windows the board remembers (at most kHistory)
  // Whether its site is the job's main loop (it holds half the windows or
  // more): only then is "per step" meaningful; a validation-only straggler
  // is given per collective of its phase.
  bool mainLoop() const {
    return 2 * siteWindows >= historyWindows;
  }
  // Per collective of the main loop's windows, or, for a phase, per
  // collective at its site (the others lose nothing at the rest of them).
  double lostNsPerCollective() const {
    const int64_t n = mainLoop() || siteCollectives == 0 ? collectives : siteCollectives;
    return n > 0 ? static_cast<double>(lostNs) / static_cast<double>(n) : 0.0;
  }
  uint64_t firstSeq = 0;  // the first and last collective of those windows
  uint64_t lastSeq = 0;
  int64_t collectives = 0;      // collectives in those windows
  int64_t siteCollectives = 0;  // of which at its site
  int64_t lostNs = 0;           // summed over them: the other ranks' mean wait minus its own
  int64_t spanNs = 0;           // summed over them: the windows' median spans
  double ownWaitShare = 0;      // its wait / its span, over those windows
  double othersWaitShare = 0;   // the same, median of the other ranks
  double share() const {
    return spanNs > 0 ? static_cast<double>(lostNs) / static_cast<double>(spanNs) : 0.0;
  }
};

class StragglerBoard {
 public:
  static constexpr size_t kHistory = 32;
  static constexpr int kMinWindows = 3;
  // The shortest window analysed while a coarser level exists (median span).
  static constexpr int64_t kMinWindowNs = 100'000'000;

  explicit StragglerBoard(double threshold) : threshold_(threshold) {}

  // One look at every rank's published waits, by group rank (nullopt: none,
  // or the rank is not running: nothing is analysed then). Analyses the
  // windows every rank shows and this board has not seen, at the finest
  // level that has any; returns how many.
  size_t look(const std::vector<std::optional<RankWaits>>& ranks);

  // The ranks named now, most lost time first.
  std::vector<Straggler> named() const;
  const std::deque<StragglerWindow>& history() const {
    return history_;
  }
  double threshold() const {
    return threshold_;
  }
  uint64_t analysedUpTo() const {
    return lastSeq_;
  }

  // The smallest period of `symbols` (a step's pattern of collectives: call
  // site and fingerprint), when at least 80% of them repeat at it; 0 when
  // none up to half their length does.
  static size_t period(const std::vector<uint64_t>& symbols);

 private:
  StragglerWindow analyse(const std::vector<const WaitWindow*>& windows) const;

  double threshold_;
  uint64_t lastSeq_ = 0;
  std::vector<std::string> hosts_;
  std::deque<StragglerWindow> history_;
};

// What turns a board's findings into words: the group, global ranks and call
// sites as this process knows them.
struct StragglerContext {
  std::string group;                      // the group's label
  std::vector<int64_t> globalRanks;       // group rank -> global rank; empty: identity
  std::map<uint64_t, std::string> sites;  // call site key -> "train.py:40 in step"
  double collectivesPerStep = 0;          // 0: unknown
  int64_t globalRank(int groupRank) const {
    return groupRank >= 0 && static_cast<size_t>(groupRank) < globalRanks.size() ? globalRanks[groupRank] : groupRank;
  }
  std::string site(uint64_t key) const;
};

// The warning for one named straggler: who, how much the others lost, where,
// and what to do.
std::string stragglerText(const Straggler& s, size_t groupSize, const StragglerContext& ctx);
// What torch_ext.stragglers() returns: `named` (board.named()) and the last
// `maxWindows` windows.
Json stragglersJson(const StragglerBoard& board, const std::vector<Straggler>& named, size_t groupSize,
                    const StragglerContext& ctx, size_t maxWindows = 8);

}  // namespace torch_ext
