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

// Where the abort deadline's failure lands.
enum class AbortScope : uint8_t { EveryLiveRank, ThisRank };
// "timeout after abort_after=30 s (TORCH_EXT_ABORT_AFTER), the collective fails
// on every live rank": the first line says "timeout" in so many words, since
// retry logic (and torch's own tests) grep for it in gloo's and NCCL's errors.
std::string abortReason(double abortAfterS, AbortScope scope);

}  // namespace torch_ext::messages
