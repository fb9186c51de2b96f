#pragma once

// Messages: the sentences users read in more than one report, each built in
// one place, so the live check, the watchdog and the post-mortem say the same
// thing in the same words (and tests can match one text).

#include <cstdint>
#include <string>

namespace torch_ext::messages {

// "1.5 s": a duration in reports (negative clamps to 0).
std::string seconds(int64_t ns);
// seconds(toNs - fromNs) without overflow: times read from a dump may be anything.
std::string secondsBetween(int64_t fromNs, int64_t toNs);

// The note of an all-to-all whose splits do not add up across ranks.
extern const char* const kSplitsDoNotPair;

// `send/recv on group "<label>" do not pair (dtype, element count or tag differ):`
std::string p2pDoNotPair(const std::string& groupLabel);

// One side of a send/recv pair, as a report names it.
struct P2PSide {
  int64_t rank = -1;  // global rank
  std::string text;   // "send(float32[4], dst=1, tag=0)"
  uint64_t ordinal = 0;
  std::string where;  // its call site
};
// The line under p2pDoNotPair for a pair that differs, whichever path found it
// (the watchdog's analysis, strict's exchange, verify's pairing words):
// "rank 0: send(...) (#1) at a.py:3 in f\n    but rank 1 has recv(...) (#1) at a.py:9 in g".
std::string p2pUnpaired(const P2PSide& one, const P2PSide& other);

// Where the abort deadline's failure lands.
enum class AbortScope : uint8_t { EveryLiveRank, ThisRank };
// "timeout after abort_after=30 s (TORCH_EXT_ABORT_AFTER), the collective fails
// on every live rank": the first line says "timeout" in so many words, since
// retry logic (and torch's own tests) grep for it in gloo's and NCCL's errors.
std::string abortReason(double abortAfterS, AbortScope scope);
// How a wait that went on past abort_after while the awaited ranks were busy
// ended (watchdog/BusyWait.h): at busy_cap, or when one stopped progressing.
struct BusyWaitEnd {
  double busyCapS = 0;
  bool capReached = false;
};
// abortReason, for a wait that went on past abort_after: "timeout after
// busy_cap=80 s (TORCH_EXT_BUSY_CAP): the ranks it waited for were busy past
// abort_after=20 s, the collective fails on every live rank", or "timeout after
// abort_after=20 s (TORCH_EXT_ABORT_AFTER) and a wait on while the ranks it
// waited for were busy, until one stopped progressing, ...".
std::string abortReason(double abortAfterS, AbortScope scope, const BusyWaitEnd& busy);

}  // namespace torch_ext::messages
