#pragma once

// Dumps: this process's snapshot of its guarded groups (ledger windows,
// progress, the main thread's stack) and the per-rank dump files written from
// it (<dump_dir>/rank<r>.json), which `python -m torch_ext.diagnose` reads.
// The live side of snapshots: it turns ledgers and group states into the pure
// views of report/Snapshot.h.

#include "guard/collective/GroupState.h"
#include "guard/report/Snapshot.h"

#include <memory>
#include <string>
#include <vector>

namespace torch_ext {

// A ledger record as reports and dumps see it (call site resolved).
EntryView entryView(const Entry& e);
// The most recent `maxEntries` records of a group, with its progress.
GroupView groupView(GroupState& state, size_t maxEntries);

// `maxEntries` 0: each group's whole ledger.
RankSnapshot takeSnapshot(const std::string& reason, const std::vector<std::shared_ptr<GroupState>>& states,
                          size_t maxEntries);

// Writes `snap` to <dir>/rank<r>.json atomically (temp file + rename); returns
// the path, or "" with `*error` saying why.
std::string writeDumpFile(const std::string& dir, const RankSnapshot& snap, std::string* error);

} // namespace torch_ext
