#pragma once

// OpWords: what one rank tells the others about an operation it issued, in
// the one wire form every channel that carries it uses (issue 67): verify's
// gather at the first collective where the ranks' histories differ, strict's
// exchange after its check collective saw a difference, and the send/recv
// prints strict publishes and verify's pairing reads (their numeric pairing
// words carry only the hashes the pairing compares). This is the one encoder
// and decoder of that message, and rankOp() the one way a report reads it.

#include "guard/report/History.h"
#include "guard/report/OpFacts.h"
#include "guard/report/Verdict.h"

#include <cstdint>

#include <string>
#include <vector>

namespace torch_ext {

struct OpWords {
  std::string text = "(no longer in this rank's ledger)";  // the op's fingerprint text
  std::string where;                                       // call site (and label)
  std::string caller;                                      // the line that called the call site
  std::string hint;                                        // its label's hint
  uint64_t hash = 0;                                       // what the ranks compare (a p2p print: its pair hash)
  bool metricSync = false;                                 // the op itself is a metric sync
  std::vector<std::string> metrics;                        // metricRunAround's names
  std::vector<HistoryRun> history;                         // how this rank got there (History.h)
  OpFacts facts;  // what the op is, as values (its text is `text`); unknown when not in the ledger

  // Fits in `maxBytes`: the oldest history runs are left out first, then the
  // text is cut (decode reads what is left).
  std::string encode(size_t maxBytes) const;
  static OpWords decode(const std::string& bytes);
  // The report's row for `globalRank`'s op (the metrics and history go to
  // their own sections).
  RankOp rankOp(int64_t globalRank) const;
};

}  // namespace torch_ext
