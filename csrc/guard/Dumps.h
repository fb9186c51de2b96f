#pragma once

// Dumps: this process's snapshot of its guarded groups (ledger windows,
// progress, the main thread's stack) and the per-rank dump files written from
// it (<dump_dir>/rank<r>.json), which `python -m torch_ext.diagnose` reads.

#include "guard/GroupState.h"
#include "guard/Snapshot.h"

#include <memory>
#include <string>
#include <vector>

namespace torch_ext {

// `maxEntries` 0: each group's whole ledger.
RankSnapshot takeSnapshot(const std::string& reason, const std::vector<std::shared_ptr<GroupState>>& states,
                          size_t maxEntries);

// Writes `snap` to <dir>/rank<r>.json atomically (temp file + rename); returns
// the path, or "" with `*error` saying why.
std::string writeDumpFile(const std::string& dir, const RankSnapshot& snap, std::string* error);

} // namespace torch_ext
