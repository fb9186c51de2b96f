#pragma once

// Dumps: this process's snapshot of its guarded groups (ledger windows,
// progress, the main thread's stack) and the per-rank dump files written from
// it (<dump_dir>/rank<r>.json), which `python -m torch_ext.diagnose` reads.
// The live side of snapshots: it turns ledgers and group states into the pure
// views of report/Snapshot.h.

#include "guard/collective/GroupState.h"
#include "guard/report/Snapshot.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torch_ext {

// A ledger record as reports and dumps see it (call site resolved).
// This machine's name ("" when it has none).
std::string hostname();

EntryView entryView(const Entry& e);
// Whether a snapshot carries each group's wait windows (GroupView::
// waitWindows, up to WaitWindows::kHistory per level, a few KB): dump files
// and live snapshots do, for their straggler section; an incident's
// snapshots, exchanged by every rank through the store, do not.
enum class WithWaitWindows : bool { No, Yes };

// The most recent `maxEntries` records of a group, with its progress.
GroupView groupView(GroupState& state, size_t maxEntries, WithWaitWindows windows = WithWaitWindows::No);

// Where this rank stands in a group: the last collective issued and the
// oldest pending operation (RankSnapshot::waits).
GroupWait groupWait(GroupState& state);

// `maxEntries` 0: each group's whole ledger. `waitsOf`: the groups whose
// positions go into `waits` (every group of the process; `states` when empty).
RankSnapshot takeSnapshot(const std::string& reason, const std::vector<std::shared_ptr<GroupState>>& states,
                          size_t maxEntries, const std::vector<std::shared_ptr<GroupState>>& waitsOf = {},
                          WithWaitWindows windows = WithWaitWindows::No);

// Writes `snap` to <dir>/rank<r>.json atomically (temp file + rename); returns
// the path, or "" with `*error` saying why.
std::string writeDumpFile(const std::string& dir, const RankSnapshot& snap, std::string* error);

// What a dump waits for in one live group: the collective `seq` (0: none)
// and/or the record `recordId` (0: none) completing there.
struct DumpWatch {
  std::weak_ptr<GroupState> group;
  uint64_t seq = 0;
  uint64_t recordId = 0;
};

// The dump file this process wrote last, kept so that its state follows the
// job (docs/diagnostics.md, "Dump states"):
//   waiting   -> recovered  every watched group went past what it waited in
//   waiting   -> failed     a watched group failed (e.g. a local abort)
//   recovered -> finished   a clean end: the last guarded group destroyed
//   running   -> finished   without a failure, or the interpreter exits
// Each change rewrites the file (the same snapshot, the new state), so the
// ledgers keep showing the moment of the report. Thread-safe. Only the last
// dump is followed: a later one (another report, torch_ext.dump()) replaces it.
class DumpFile {
 public:
  // Writes `snap` to <dir>/rank<r>.json with its status: `cause`, `awaited`
  // (what the watches wait for), and the state: failed when `failed` is set
  // (or the cause is a failure), else waiting while something is watched, else
  // running. Returns the path, or "" with `*error` saying why. A dump that
  // holds a failure stays: later automatic writes keep it (only Manual
  // replaces it), as the first failure's state is what the post-mortem needs.
  std::string write(const std::string& dir, RankSnapshot snap, DumpCause cause, std::vector<DumpWatch> watches,
                    bool failed, std::string* error);
  // Re-evaluates a waiting dump's watches (cheap otherwise); rewrites the file
  // when the state changes. Called every watchdog tick and before a group is
  // removed (it may have recovered since the last tick).
  void update();
  // A clean end of the job on this rank: recovered or running -> finished.
  void finish();

 private:
  // A waiting dump's watches: failed or recovered rewrites it (mu_ held).
  void evaluateLocked();
  void rewriteLocked(DumpState state, int64_t nowNs);

  std::mutex mu_;
  std::atomic<bool> waiting_{false};  // lock-free check for update()
  bool have_ = false;
  std::string dir_;
  RankSnapshot snap_;
  std::vector<DumpWatch> watches_;
};

}  // namespace torch_ext
