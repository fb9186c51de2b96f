#pragma once

// Difference: what the ranks issued that does not agree, as a value (issue
// 67). A check mode that finds one (strict's exchange, verify's gather, a
// send/recv pair whose prints or words do not pair) hands it, unrendered, to
// the failure desk (collective/IncidentSink.h, GroupFailure::difference);
// the desk renders it here, one renderer per kind, and is the only code that
// does. The watchdog's own cross-rank analysis (Report.cpp) renders its
// collective differences through the same differenceVerdict.

#include "guard/report/History.h"
#include "guard/report/Messages.h"
#include "guard/report/MetricSyncs.h"
#include "guard/report/Verdict.h"

#include <cstdint>
#include <string>
#include <vector>

namespace torch_ext {

struct Difference {
  enum class Kind : uint8_t {
    Collective,  // the ranks' ops at `seq` differ (or their all-to-all splits do not pair: `note`)
    Range,       // the ranks' histories differ somewhere in #seq..#last, past what was scanned
    SendRecv,    // a receive that does not pair with what its sender sent
  };
  Kind kind = Kind::Collective;
  std::string group;  // the group's label
  int groupSize = 0;
  uint64_t seq = 0;
  uint64_t last = 0;  // Range
  // Collective: each rank's op at `seq` (OpWords::rankOp), a note under the
  // rows, each rank's metric syncs around it and how each got there (either
  // empty: not shown).
  std::vector<RankOp> ops;
  std::string note;
  std::vector<RankMetrics> metrics;
  std::vector<RankHistory> histories;
  // SendRecv: the sender's side and the receiver's (its reporter).
  messages::P2PSide sender, receiver;

  // Found by one rank alone (SendRecv: its receiver): the desk publishes the
  // verdict for every rank before failing the group here. The others are
  // found alike on every rank, from every rank's words.
  bool foundAlone() const {
    return kind == Kind::SendRecv;
  }
  // The collective whose incident every rank dumps (0: none).
  uint64_t dumpAt() const {
    return kind == Kind::SendRecv ? 0 : seq;
  }
};

// The report of `d`: its text and facts.
Verdict renderDifference(const Difference& d);

}  // namespace torch_ext
