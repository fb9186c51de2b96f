#include "guard/report/Messages.h"

#include <algorithm>
#include <cstdio>

namespace torch_ext::messages {

std::string seconds(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", static_cast<double>(std::max<int64_t>(ns, 0)) / 1e9);
  return buf;
}

std::string secondsBetween(int64_t fromNs, int64_t toNs) {
  int64_t ns = 0;
  if (__builtin_sub_overflow(toNs, fromNs, &ns)) ns = toNs > fromNs ? INT64_MAX : 0;
  return seconds(ns);
}

const char* const kSplitsDoNotPair =
    "all-to-all splits do not pair: what ranks send differs from what their peers expect to receive";

std::string p2pDoNotPair(const std::string& groupLabel) {
  return "send/recv on group \"" + groupLabel + "\" do not pair (dtype, element count or tag differ):";
}

std::string p2pUnpaired(const P2PSide& one, const P2PSide& other) {
  return "rank " + std::to_string(one.rank) + ": " + one.text + " (#" + std::to_string(one.ordinal) + ") at " +
         one.where + "\n    but rank " + std::to_string(other.rank) + " has " + other.text + " (#" +
         std::to_string(other.ordinal) + ") at " + other.where;
}

std::string abortReason(double abortAfterS, AbortScope scope) {
  char limit[64];
  std::snprintf(limit, sizeof(limit), "%g", abortAfterS);
  return std::string("timeout after abort_after=") + limit + " s (TORCH_EXT_ABORT_AFTER), the collective fails on " +
         (scope == AbortScope::EveryLiveRank ? "every live rank" : "this rank");
}

std::string abortReason(double abortAfterS, AbortScope scope, const BusyWaitEnd& busy) {
  char abort[64], cap[64];
  std::snprintf(abort, sizeof(abort), "%g", abortAfterS);
  std::snprintf(cap, sizeof(cap), "%g", busy.busyCapS);
  const std::string where = scope == AbortScope::EveryLiveRank ? "every live rank" : "this rank";
  if (busy.capReached) {
    return std::string("timeout after busy_cap=") + cap +
           " s (TORCH_EXT_BUSY_CAP): the ranks it waited for were busy " + "past abort_after=" + abort +
           " s, the collective fails on " + where;
  }
  return std::string("timeout after abort_after=") + abort + " s (TORCH_EXT_ABORT_AFTER) and a wait on while the " +
         "ranks it waited for were busy, until one stopped progressing, the collective fails on " + where;
}

}  // namespace torch_ext::messages
