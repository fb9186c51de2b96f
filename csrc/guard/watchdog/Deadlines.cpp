#include "guard/watchdog/Deadlines.h"

#include <algorithm>

namespace torch_ext {

namespace {

int64_t ns(std::chrono::milliseconds d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

}  // namespace

Deadlines::Deadlines(std::chrono::milliseconds warnAfter, std::chrono::milliseconds abortAfter, double intervalS,
                     bool checksP2P, std::chrono::milliseconds busyCap)
    : warnNs_(ns(warnAfter)),
      abortNs_(ns(abortAfter)),
      // A send/recv pending this long is worth a pairing check.
      p2pCheckNs_(std::max<int64_t>(1'000'000'000, static_cast<int64_t>(5 * intervalS * 1e9))),
      // Above the incident protocol's own fallbacks (a silent analyst is
      // replaced after 3 s or 12 ticks), so this fires only when the store
      // itself is too slow for the protocol.
      fallbackNs_(std::max<int64_t>(5'000'000'000, static_cast<int64_t>(25 * intervalS * 1e9))),
      busyCapNs_(ns(busyCap)),
      checksP2P_(checksP2P) {}

int64_t Deadlines::warnAfterNs(uint32_t site) const {
  auto it = siteLongestNs_.find(site);
  return it == siteLongestNs_.end() ? warnNs_ : std::max(warnNs_, it->second + it->second / 4);
}

DeadlineActions Deadlines::check(const Progress& p, int groupRank, int64_t now, const AwaitedBusy& awaitedBusy) {
  DeadlineActions out;
  if (warnedOpen_ && !(p.hasPending && p.oldestPending.id == warnedId_)) {
    // The op warned about is done. Unless it was aborted, it ended by itself:
    // a wait its call site can show again without a new report.
    warnedOpen_ = false;
    if (abortedId_ != warnedId_ && warnedSite_ != 0 &&
        (siteLongestNs_.size() < kMaxSites || siteLongestNs_.count(warnedSite_))) {
      int64_t& longest = siteLongestNs_[warnedSite_];
      longest = std::max(longest, warnedWaitNs_);
    }
  }
  if (!p.hasPending) return out;
  const Entry& e = p.oldestPending;
  out.entry = e;
  out.waitedNs = now - e.startSteadyNs;
  if (warnedOpen_) warnedWaitNs_ = out.waitedNs;
  const IncidentSubject subject = e.seq ? IncidentSubject::collective(e.seq) : IncidentSubject::p2p(groupRank, e.id);
  if (out.waitedNs > abortNs_ && abortedId_ != e.id) {
    // Busy is not hung: a collective (not a send/recv: its peer is one rank,
    // looked at by the p2p check) whose awaited ranks all progress waits on.
    const Awaited awaited = e.seq != 0 && out.waitedNs < busyCapNs_ && awaitedBusy ? awaitedBusy(e) : Awaited::NotBusy;
    if (awaited == Awaited::Busy) {
      out.busyWaitBegins = busySeq_ != e.seq;
      busySeq_ = e.seq;
      return out;
    }
    // The first look since abort_after is on its way (the I/O thread reads the records).
    if (awaited == Awaited::Unknown && busySeq_ != e.seq && out.waitedNs < abortNs_ + kBusyLookWaitNs) return out;
    BusyWaitEnd busy = BusyWaitEnd::None;
    if (busySeq_ == e.seq && e.seq != 0) {
      busy = out.waitedNs >= busyCapNs_ ? BusyWaitEnd::CapReached : BusyWaitEnd::Stopped;
    }
    abortedId_ = e.id;
    abortedAtNs_ = now;
    localAborted_ = false;
    out.raise = Incident{IncidentKind::Abort, subject, groupRank, enumName(busy)};
    return out;
  }
  if (warnedId_ != e.id && abortedId_ != e.id && out.waitedNs > warnAfterNs(e.callSite)) {
    warnedId_ = e.id;
    warnedAtNs_ = now;
    warnedSite_ = e.callSite;
    warnedWaitNs_ = out.waitedNs;
    warnedOpen_ = true;
    warnedSubject_ = subject;
    warnReported_ = localWarned_ = false;
    out.raise = Incident{IncidentKind::Hang, subject, groupRank, ""};
    return out;
  }
  if (e.seq == 0 && checksP2P_ && out.waitedNs > p2pCheckNs_ && p2pCheckedId_ != e.id) {
    p2pCheckedId_ = e.id;
    out.raise = Incident{IncidentKind::P2P, subject, groupRank, ""};
    return out;
  }
  if (abortedId_ == e.id && !localAborted_ && now - abortedAtNs_ > fallbackNs_) {
    localAborted_ = true;
    out.localAbort = true;
  } else if (warnedId_ == e.id && abortedId_ != e.id && !warnReported_ && !localWarned_ &&
             now - warnedAtNs_ > fallbackNs_) {
    localWarned_ = true;
    out.localWarn = true;
  }
  return out;
}

void Deadlines::reported(const IncidentSubject& subject) {
  if (subject == warnedSubject_) warnReported_ = true;
}

}  // namespace torch_ext
