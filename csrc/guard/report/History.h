#pragma once

// History: how each rank reached a collective where the ranks differ (issue 39).
//
// A mismatch report names the first collective that differs; the cause is often
// older: one rank ran fewer iterations of a loop (uneven data per rank), or took
// a branch the others did not. Each rank's collectives before the difference,
// folded into runs from one call site ("26 x all_reduce at train.py:67"), show
// where the histories part, and a reading says what that pattern usually means.
//
// Pure (no torch, no clock): the verifier builds runs from its ledger, the
// post-mortem from snapshot windows; both render with formatHistories().

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace torch_ext {

// One collective of a rank's history: its seq, op name ("all_reduce") and call site.
struct HistoryItem {
  uint64_t seq = 0;
  std::string op;
  std::string where;
};

// Consecutive collectives with the same op name and call site.
struct HistoryRun {
  uint64_t firstSeq = 0;
  uint64_t lastSeq = 0;
  uint64_t count = 0;
  std::string op;
  std::string where;

  bool sameSite(const HistoryRun& o) const {
    return op == o.op && where == o.where;
  }
  bool operator==(const HistoryRun&) const = default;
};

// The runs of `items` (ascending seq), oldest first; only the newest `maxRuns` kept.
std::vector<HistoryRun> historyRuns(const std::vector<HistoryItem>& items, size_t maxRuns);

// One line per run, fields separated by '\t' (op and where hold no tab or newline:
// callers' texts are sanitised by encode). decode(encode(r)) == r.
std::string encodeHistory(const std::vector<HistoryRun>& runs);
std::vector<HistoryRun> decodeHistory(const std::string& text);

// Runs of each rank's history a report shows.
constexpr size_t kHistoryRuns = 4;

struct RankHistory {
  int64_t globalRank = 0;
  bool known = false;            // false: nothing tells how it got there
  std::vector<HistoryRun> runs;  // up to (and including) the differing collective
};

// "\n  how each rank got to #27 (...):" and one line per distinct history (ranks
// grouped), then "\n  reading: ..." where the pattern is one this knows: ranks
// that ended a run at a call site earlier than the others (fewer iterations of a
// loop, or a branch they took). "" when fewer than two histories are known or all
// are the same.
// `lookAlike`: every rank issued the same signature at `seq` (the ranks
// compare call paths: strict, or call_paths=on), so where their lines differ
// there, that is where the histories part.
std::string formatHistories(const std::vector<RankHistory>& ranks, uint64_t seq, bool lookAlike = false);

}  // namespace torch_ext
