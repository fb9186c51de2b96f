#pragma once

// Deadlines: what the age of a group's oldest pending operation calls for.
//
// Pure logic: no store, no clock of its own (the caller passes the steady
// time), so warn_after and abort_after fire on time whatever the store does,
// and tests drive it with a fake clock. The cross-rank incidents it asks for
// go through the store; when their verdict does not come in time (a store
// that answers slowly, an analyst that stalls), it asks for a local report
// instead: abort_after still fails the group, with what this rank knows.

#include "guard/Config.h"
#include "guard/report/Incident.h"
#include "guard/collective/Ledger.h"

#include <chrono>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>

namespace torch_ext {

struct DeadlineActions {
  std::optional<Incident> raise;  // hang, abort or p2p incident to raise through the store
  bool localWarn = false;         // the hang report did not come: log one from this rank's view
  bool localAbort = false;        // the abort verdict did not come: fail the group from this rank's view
  bool busyWaitBegins = false;    // past abort_after, the awaited ranks are busy: the wait goes on (say so once)
  Entry entry;                    // the op concerned (valid when any of the above is set)
  int64_t waitedNs = 0;           // how long it has waited
};

class Deadlines {
 public:
  Deadlines(std::chrono::milliseconds warnAfter, std::chrono::milliseconds abortAfter, double intervalS, bool checksP2P,
            std::chrono::milliseconds busyCap = std::chrono::milliseconds(0));

  // What the ranks the collective `e` waits for do (watchdog/BusyWait.h),
  // asked only past abort_after: all busy, not all busy, or not known yet (no
  // look at them since abort_after: the abort waits for one, kBusyLookWaitNs
  // at most).
  enum class Awaited : uint8_t { Busy, NotBusy, Unknown };
  using AwaitedBusy = std::function<Awaited(const Entry& e)>;

  // `p` is the group's progress, `groupRank` this rank's rank in it. A
  // collective past abort_after whose awaited ranks are all busy
  // (`awaitedBusy`) waits on, up to busy_cap.
  DeadlineActions check(const Progress& p, int groupRank, int64_t nowSteadyNs, const AwaitedBusy& awaitedBusy = {});
  // When the ranks a collective waits for are looked at: from abort_after on,
  // when busy_cap lies beyond it (a look before would see a rank that stopped
  // a moment ago still busy).
  int64_t busyLookAfterNs() const {
    return busyCapNs_ > abortNs_ ? abortNs_ : INT64_MAX;
  }
  int64_t busyCapNs() const {
    return busyCapNs_;
  }
  // The cross-rank hang report for incident subject `subject` arrived (no
  // local one needed).
  void reported(const IncidentSubject& subject);

  // How long a verdict may take before the local fallback fires.
  int64_t fallbackNs() const {
    return fallbackNs_;
  }
  // The hang look at an op of call site `site` comes after this long: warn_after,
  // or, where a wait past warn_after ended by itself before, a quarter more than
  // the longest such wait there (a checkpoint on rank 0 every epoch is named
  // once, not every epoch).
  int64_t warnAfterNs(uint32_t site) const;

 private:
  int64_t warnNs_, abortNs_, p2pCheckNs_, fallbackNs_, busyCapNs_;
  static constexpr int64_t kBusyLookWaitNs = 2'000'000'000;
  uint64_t busySeq_ = 0;  // the collective that waited past abort_after last
  bool checksP2P_;        // Mode::compares: a send/recv pending long is looked into
  uint64_t warnedId_ = 0, abortedId_ = 0, p2pCheckedId_ = 0;
  int64_t warnedAtNs_ = 0, abortedAtNs_ = 0;
  std::optional<IncidentSubject> warnedSubject_;
  bool warnReported_ = false, localWarned_ = false, localAborted_ = false;
  // The warned op while it is the oldest pending: its call site and how long it
  // was last seen waiting. When it ends (not aborted), that wait is the site's.
  uint32_t warnedSite_ = 0;
  int64_t warnedWaitNs_ = 0;
  bool warnedOpen_ = false;
  std::map<uint32_t, int64_t> siteLongestNs_;  // call site -> longest wait past warn_after that ended
  static constexpr size_t kMaxSites = 4096;
};

}  // namespace torch_ext
