#pragma once

// MetricSyncs: which metrics each rank synced around a collective, and the
// lines that say where they differ.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace torch_ext {

// Metric syncs per rank (Lightning#19106: self.log_dict keys that differ across
// ranks). A metric sync is a collective whose label has a "metric" field.
//
// The metrics of the run of consecutive metric syncs around collective `seq`
// (ending at the rank's last issued one, `lastSeq`, if it has not issued `seq`;
// never past `upTo`), in order, each once. `metricAt(s)`: the metric collective
// #s synced, if it is a metric sync the caller can see.
std::vector<std::string> metricRunAround(uint64_t seq, uint64_t lastSeq, uint64_t upTo,
                                         const std::function<std::optional<std::string>(uint64_t)>& metricAt);

struct RankMetrics {
  int64_t globalRank = 0;
  bool known = false;              // false: nothing tells what it synced there
  std::vector<std::string> names;  // metricRunAround's
  int64_t readFrom = -1;           // >= 0: read from this rank's ledger (it sent none)
};

// "\n  metric syncs here: rank 0 synced val_loss, val_acc_c3; ranks 1,2 synced
// val_loss only" and, per metric not synced everywhere, "\n  val_acc_c3 is synced
// on rank 0 only: ranks 1,2 never synced it here"; "" when every rank known
// synced the same.
std::string formatMetricSyncs(const std::vector<RankMetrics>& ranks);

}  // namespace torch_ext
