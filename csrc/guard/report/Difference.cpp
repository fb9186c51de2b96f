#include "guard/report/Difference.h"

#include "guard/report/Report.h"

#include <algorithm>
#include <sstream>

namespace torch_ext {

Verdict renderDifference(const Difference& d) {
  switch (d.kind) {
    case Difference::Kind::Collective: {
      const bool lookAlike =
          std::all_of(d.ops.begin(), d.ops.end(), [&](const RankOp& o) { return o.text == d.ops.front().text; });
      std::string more = d.metrics.empty() ? std::string() : formatMetricSyncs(d.metrics);
      if (!d.histories.empty()) more += formatHistories(d.histories, d.seq, lookAlike);
      return differenceVerdict(d.group, d.groupSize, d.seq, d.ops, d.note, more);
    }
    case Difference::Kind::Range: {
      std::ostringstream os;
      os << "collectives #" << d.seq << "..#" << d.last << "+ on group \"" << d.group << "\" (" << d.groupSize
         << " ranks) differ across ranks: the check before their results were released found different histories";
      Verdict v;
      v.kind = Verdict::Kind::Mismatch;
      v.group = d.group;
      v.seq = d.seq;
      v.text = os.str();
      return v;
    }
    case Difference::Kind::SendRecv: {
      Verdict v;
      v.kind = Verdict::Kind::Mismatch;
      v.text = messages::p2pDoNotPair(d.group) + "\n  " + messages::p2pUnpaired(d.sender, d.receiver);
      v.reporter = d.receiver.rank;
      return v;
    }
  }
  return Verdict();
}

}  // namespace torch_ext
