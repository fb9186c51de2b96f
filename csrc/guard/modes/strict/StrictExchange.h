#pragma once

// StrictExchange: after strict's check collective saw different hashes,
// every rank publishes its full fingerprint through the store and reads all
// others', so every rank raises the same report. The waits are the group's
// bounded ones (collective/StoreExchange.h): a group failure ends them.

#include "guard/collective/Fingerprint.h"
#include "guard/collective/GroupState.h"
#include "guard/report/OpWords.h"
#include "guard/report/Report.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch_ext {

// Every rank's words (OpWords) about its op at `seq`, as report rows, given
// this rank's `mine` (its metric syncs around `seq` in `metrics` and
// `metricSync`); throws the group's error if it fails meanwhile (e.g. the
// store is lost). `metrics` (optional): on return, every rank's metric syncs,
// in group-rank order (`known`: that rank's op at `seq` is a metric sync).
std::vector<RankOp> exchangeStrictFingerprints(GroupState& st, const OpWords& mine, uint64_t seq,
                                               std::vector<RankMetrics>* metrics = nullptr);

}  // namespace torch_ext
