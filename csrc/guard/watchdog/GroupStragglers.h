#pragma once

// GroupStragglers: one group's straggler analysis, on its rank 0. Every few
// exchanges (stragglerLookEvery) it reads every rank's closed wait windows
// from their statuses (StragglerBoard), names who keeps the others waiting,
// warns once per rank and call site (again after 5 min), and publishes the
// analysis for the other ranks and torch_ext.stragglers().
//
// Owned by the watchdog's context of the group; look() runs on the store's
// I/O thread only, latest() on any thread.

#include "guard/collective/GroupState.h"
#include "guard/report/StragglerBoard.h"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace torch_ext {

class GroupStragglers {
 public:
  // After each exchange of `st`'s group: looks when it is due (group rank 0,
  // more than one rank, stragglers on, the group not failed).
  void afterExchange(GroupState& st);
  // The analysis (StragglerBoard JSON): rank 0's own, else the one rank 0
  // published in the store (bounded); "" when there is none yet.
  std::string latest(GroupState& st);

 private:
  void look(GroupState& st);

  uint64_t exchanges_ = 0;
  bool allStatusSeen_ = false;
  std::unique_ptr<StragglerBoard> board_;
  std::map<std::pair<int, uint64_t>, int64_t> warnedNs_;  // (group rank, site) -> steady ns
  int64_t publishedNs_ = 0;
  std::string publishedWho_;
  std::map<uint64_t, std::string> siteNames_;  // call site key -> its description
  std::mutex jsonMu_;
  std::string json_;  // the last analysis, for latest()
};

}  // namespace torch_ext
