#include "guard/watchdog/BusyWait.h"

#include <algorithm>

namespace torch_ext {

bool BusyWait::fresh(int rank, const StatusRecord& r, int64_t nowSteadyNs, int64_t nowWallNs) {
  auto [it, first] = seen_.try_emplace(rank, Seen{r.heartbeatNs, nowSteadyNs});
  if (first) return nowWallNs - r.heartbeatNs < kFirstSeenStaleNs;
  if (it->second.heartbeatNs != r.heartbeatNs) {
    it->second = Seen{r.heartbeatNs, nowSteadyNs};
    return true;
  }
  return nowSteadyNs - it->second.sinceSteadyNs < staleNs_;
}

BusyLook BusyWait::look(const std::vector<std::optional<StatusRecord>>& records, uint64_t seq, int64_t nowSteadyNs,
                        int64_t nowWallNs, bool begun) {
  BusyLook out;
  out.seq = seq;
  out.atSteadyNs = nowSteadyNs;
  for (int r = 0; r < static_cast<int>(records.size()); ++r) {
    const auto& rec = records[r];
    if (rec && rec->lastSeq >= seq) {
      if (out.lowestArrived < 0) out.lowestArrived = r;
      continue;
    }
    const int64_t quietLimit = begun && seq == seq_ && wasBusy_.count(r) ? kQuietMs : kBeginQuietMs;
    // Quiet as of the record's heartbeat, plus the record's age: a record that
    // said "busy" and was not renewed since (an exchange held up, a rank that
    // just stopped) grows quiet as it ages.
    const int64_t quiet = rec ? rec->quietMs + std::max<int64_t>(0, nowWallNs - rec->heartbeatNs) / 1'000'000 : -1;
    const bool busy = rec && rec->phase == RankPhase::Running && rec->quietMs >= 0 && quiet < quietLimit &&
                      fresh(r, *rec, nowSteadyNs, nowWallNs);
    if (busy) {
      out.busy.push_back(r);
      out.quietMs.push_back(quiet);
    } else {
      out.stopped.push_back(r);
    }
  }
  out.waitOn = !out.busy.empty() && out.stopped.empty();
  seq_ = seq;
  wasBusy_ = std::set<int>(out.busy.begin(), out.busy.end());
  return out;
}

}  // namespace torch_ext
