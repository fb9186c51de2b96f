#include "guard/report/LocalReport.h"

#include "guard/report/Messages.h"
#include "guard/report/Progress.h"
#include "guard/report/RankList.h"

#include <cstdio>
#include <sstream>

namespace torch_ext {

namespace {

using messages::seconds;

std::string opLine(const EntryView& e) {
  std::string s = e.seq ? "collective #" + std::to_string(e.seq) + " " + e.text : e.text;
  return s + " at " + e.where();
}

void pendingLine(std::ostringstream& os, const LocalFacts& f) {
  if (f.pending) {
    os << "\n  pending here: " << opLine(*f.pending) << ", waiting " << seconds(f.pendingForNs);
  } else if (f.lastFailed) {
    const std::string& err = f.lastFailed->error;
    os << "\n  failed here: " << opLine(*f.lastFailed)
       << " (the inner backend: " << (err.empty() ? std::string("no message") : err.substr(0, err.find('\n'))) << ")";
  } else {
    os << "\n  nothing pending here (last issued #" << f.progress.lastSeq << ", completed #"
       << f.progress.lastCompletedSeq << "): the next operation on the group raises this error";
  }
}

void peerLines(std::ostringstream& os, const LocalFacts& f) {
  std::vector<int64_t> unwatched;
  for (int r = 0; r < f.groupSize; ++r) {
    if (r == f.groupRank) continue;
    const int64_t global = f.globalRank(r);
    auto it = f.peers.find(r);
    const bool host = global == f.storeHostRank;
    if (it == f.peers.end() && f.everyPeerRead) {
      os << "\n  rank " << global << (host ? " (hosts the store)" : "") << ": no status in the store";
      continue;
    }
    if (it == f.peers.end()) {
      const bool neighbour = r == (f.groupRank + 1) % f.groupSize || r == (f.groupRank + f.groupSize - 1) % f.groupSize;
      if (neighbour || host) {
        os << "\n  rank " << global << (host ? " (hosts the store)" : "")
           << ": no status read by this rank before the store was lost";
      } else {
        unwatched.push_back(global);
      }
      continue;
    }
    const StatusRecord& s = it->second.status;
    const std::string ago = seconds(f.nowWallNs - s.heartbeatNs) + " ago";
    os << "\n  rank " << global << (host ? " (hosts the store)" : "") << ": ";
    switch (s.phase) {
      case RankPhase::Left:
        os << "left the group (destroy_process_group) " << ago << " after issuing #" << s.lastSeq;
        break;
      case RankPhase::Exited:
        os << "exited " << ago << " after issuing #" << s.lastSeq << " (its process ended)";
        break;
      case RankPhase::Running:
        os << "last heartbeat " << ago << ", issued #" << s.lastSeq << ", completed #" << s.lastCompletedSeq;
        if (host && !f.everyPeerRead) os << "; its process most likely exited, was killed or froze";
        break;
    }
  }
  if (!unwatched.empty()) {
    os << "\n  " << formatRanks(unwatched) << ": not watched by this rank (each rank reads its two ring neighbours)";
  }
}

}  // namespace

bool LocalFacts::allPeersDone() const {
  if (groupSize <= 1) return false;
  for (int r = 0; r < groupSize; ++r) {
    if (r == groupRank) continue;
    auto it = peers.find(r);
    if (it == peers.end() || it->second.status.phase == RankPhase::Running) return false;
  }
  return true;
}

std::string formatStoreLost(const LocalFacts& f, const std::string& storeLoss) {
  std::ostringstream os;
  os << storeLoss << "; group \"" << f.groupLabel << "\" (" << f.groupSize << " ranks) fails on rank "
     << f.globalRank(f.groupRank) << ": without the store no cross-rank check or report can be made";
  pendingLine(os, f);
  peerLines(os, f);
  return os.str();
}

namespace {

std::string waitedHeader(const LocalFacts& f) {
  std::ostringstream os;
  if (f.pending) {
    const EntryView& e = *f.pending;
    os << (e.seq ? "collective #" + std::to_string(e.seq) + " " + e.text : e.text) << " on group \"" << f.groupLabel
       << "\" has waited " << seconds(f.pendingForNs);
  } else {
    os << "group \"" << f.groupLabel << "\"";
  }
  return os.str();
}

void waitingLine(std::ostringstream& os, const LocalFacts& f) {
  if (f.pending) os << "\n  waiting: rank " << f.globalRank(f.groupRank) << " (this rank) at " << f.pending->where();
}

}  // namespace

std::string formatLocalTimeout(const LocalFacts& f, double abortAfterS, const std::string& why) {
  std::ostringstream os;
  os << waitedHeader(f) << ": " << messages::abortReason(abortAfterS, messages::AbortScope::ThisRank)
     << "; no cross-rank report: " << why;
  waitingLine(os, f);
  peerLines(os, f);
  return os.str();
}

std::string formatStandingAtStop(const LocalFacts& f) {
  std::ostringstream os;
  os << "\n  group \"" << f.groupLabel << "\" (" << f.groupSize << " ranks):";
  pendingLine(os, f);
  peerLines(os, f);
  return os.str();
}

std::string formatBusyWait(const LocalFacts& f, const std::vector<int64_t>& busy, double abortAfterS, double busyCapS) {
  const bool one = busy.size() == 1;
  const std::string who = formatRanks(busy);
  std::ostringstream os;
  os << waitedHeader(f) << ": " << who << (one ? ", which it waits for, is" : ", which it waits for, are")
     << " busy, not hung: the wait goes on past abort_after=" << abortAfterS << " s while "
     << (one ? "it keeps" : "they keep") << " progressing, up to busy_cap=" << busyCapS
     << " s (TORCH_EXT_BUSY_CAP); it fails as a hang if " << (one ? "it stops" : "one of them stops")
     << " progressing for " << static_cast<double>(ProgressFacts::kStoppedAfterNs) / 1e9 << " s";
  return os.str();
}

std::string formatLocalHang(const LocalFacts& f, const std::string& why) {
  std::ostringstream os;
  os << waitedHeader(f) << " (no cross-rank report: " << why << ")";
  waitingLine(os, f);
  peerLines(os, f);
  return os.str();
}

}  // namespace torch_ext
