#pragma once

// DifferenceWords: what one rank says about the first collective where the
// ranks' histories differ, in the default check mode (Verifier). Every rank
// sends its words to every other, so that each writes the same report; this is
// the one encoder and decoder of that message.

#include "guard/report/History.h"
#include "guard/report/OpFacts.h"

#include <string>
#include <vector>

namespace torch_ext {

struct DifferenceWords {
  std::string text = "(no longer in this rank's ledger)";  // the op's fingerprint text
  std::string where;                                       // call site (and label)
  std::string caller;                                      // the line that called the call site
  std::string hint;                                        // its label's hint
  bool metricSync = false;                                 // the op itself is a metric sync
  std::vector<std::string> metrics;                        // metricRunAround's names
  std::vector<HistoryRun> history;                         // how this rank got there (History.h)
  OpFacts facts;  // what the op is, as values (its text is `text`); unknown when not in the ledger

  // Fits in `maxBytes`: the oldest history runs are left out first, then the
  // text is cut (decode reads what is left).
  std::string encode(size_t maxBytes) const;
  static DifferenceWords decode(const std::string& bytes);
};

}  // namespace torch_ext
