#pragma once

// WaitWindows: how long this rank waited in its collectives, summed over
// windows of consecutive sequence numbers.
//
// A collective's wait is its completion minus its issue, on this rank's own
// monotonic clock, less what an earlier collective still pending covered
// already: a window's wait is the time the rank had a collective of the group
// pending (DDP's bucket all_reduces overlap; their time counts once), never
// more than the window's span. The rank that arrives last waits least; the
// others wait for it. Windows are defined by seq, not by time, so ranks
// compare the same collectives without any clock agreeing across hosts.
//
// Windows come in levels of 4, 32, 256 and 2,048 collectives (each aligned
// to its size), and the last three closed windows of each level are kept and
// published in the rank's status record. Ranks publish at their own exchange
// times, so at any moment they show windows a little apart; the analyst uses
// the finest level at which every rank shows the same window, which exists
// whatever the collective rate: a coarser window lasts longer than the skew
// between two ranks' publications.
//
// add() runs on the thread that completes the collective (the inner
// backend's), under the ledger's lock: a few additions to the finest level,
// no allocation. A closed window feeds the next level, so every level's
// window is exactly the union of the finer ones.

#include "guard/report/WaitRecord.h"

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

namespace torch_ext {

class WaitWindows {
 public:
  static constexpr const auto& kSizes = kWaitWindowSizes;
  static constexpr size_t kKept = 3;  // closed windows published per level (the status record)
  // Closed windows kept per level for dumps and live snapshots: as many as the
  // watchdog's StragglerBoard remembers, so a post-mortem sees what it saw.
  static constexpr size_t kHistory = 32;
  static constexpr size_t kSiteSlots = 4;  // call sites tracked per window (the heaviest win)

  // Collective `seq` (from 1), issued at `startNs` and completed at `endNs`
  // (steady clock), from call site `site`.
  void add(uint64_t seq, int64_t startNs, int64_t endNs, uint32_t site);
  // The last `perLevel` (at most kHistory) closed windows of each level,
  // level by level, oldest first.
  std::vector<WaitWindow> closed(size_t perLevel = kKept) const;

 private:
  struct Open {
    bool used = false;
    uint64_t index = 0;
    uint64_t n = 0;
    int64_t waitNs = 0;
    int64_t firstStartNs = 0;
    int64_t lastEndNs = 0;
    struct Site {
      uint32_t id = 0;
      int64_t waitNs = 0;
      uint32_t count = 0;
    };
    std::array<Site, kSiteSlots> sites{};
  };
  struct Level {
    std::array<Open, 2> open;  // by index % 2: completions may run a little out of order
    std::array<WaitWindow, kHistory> closed{};
    size_t closedCount = 0;  // total closed so far (ring position)
    bool hasLast = false;
    uint64_t lastIndex = 0;  // the last closed window, for the next one's span
    int64_t lastEndNs = 0;
  };
  // The open window `index` of `lv` (taking over a stale slot); null when
  // that window was given up already.
  static Open* slotFor(Level& lv, uint64_t index);
  static void addSite(Open& w, uint32_t site, int64_t waitNs, uint32_t count);
  // Publishes `w` and feeds it into the next level's window.
  void close(uint8_t level, Open& w);
  std::array<Level, kSizes.size()> levels_{};
  int64_t coveredUntilNs_ = 0;  // the latest completion so far
};

}  // namespace torch_ext
