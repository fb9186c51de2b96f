#pragma once

// Snapshot: one rank's portable view of its groups (ledger windows, progress)
// and of its main thread, in the one JSON format used for
//  - the snapshots ranks exchange through the store during an incident,
//  - the per-rank dump files in TORCH_EXT_DUMP_DIR,
//  - the input of `python -m torch_ext.diagnose` (post-mortem).
// Entry fields follow PyTorch's Flight Recorder entries where they overlap
// (record_id, process_group, collective_seq_id, p2p_seq_id, profiling_name,
// time_created_ns, input_sizes, input_dtypes, state, frames, ...), so tools
// that read those can read these.

#include "guard/report/Frame.h"
#include "guard/report/Progress.h"
#include "guard/report/Json.h"
#include "guard/report/StoreHealth.h"
#include "guard/report/Label.h"
#include "guard/report/Op.h"
#include "guard/report/WaitGraph.h"
#include "guard/report/WaitRecord.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torch_ext {

constexpr const char* kSnapshotVersion = "torch_ext-1";

struct EntryView {
  uint64_t id = 0;
  uint64_t seq = 0;
  uint64_t p2pOrdinal = 0;
  Op op = Op::Barrier;
  std::string device;  // "cpu", "cuda": which inner backend ran it ("" in older dumps)
  std::string text;    // "all_reduce(float32[10], SUM)"
  bool isP2P = false;
  int32_t peer = -1;  // group rank of root/src/dst or p2p peer; -1 none/any
  int32_t tag = 0;
  std::string reduceOp;
  std::vector<std::string> dtypes;
  std::vector<std::vector<int64_t>> sizes;
  uint64_t hash = 0;
  uint64_t rolling = 0;
  uint64_t pairHash = 0;
  uint64_t splitSend = 0;
  uint64_t splitRecv = 0;
  EntryState state = EntryState::Scheduled;
  int64_t startNs = 0;
  int64_t endNs = 0;
  // Pending on a stream backend that says: whether its stream has begun it
  // (StreamStartAware); unknown otherwise. JSON "stream_started".
  std::optional<bool> streamStarted;
  std::vector<Frame> frames;
  Label label;  // torch_ext.label(...) active when it was issued; empty if none
  std::string error;

  // "train.py:120 in training_step", then the label if any:
  // " for metric 'val_loss' (asked for at model.py:41 in validation_step)".
  std::string where() const;
};

struct GroupView {
  std::string name;
  std::string desc;
  int rank = 0;
  int size = 1;
  std::vector<int64_t> globalRanks;
  uint64_t lastSeq = 0;
  uint64_t lastCompletedSeq = 0;
  int64_t lastCompletedNs = 0;
  uint64_t rolling = 0;
  int64_t timeoutMs = 0;
  std::vector<EntryView> entries;  // oldest first
  // This rank's closed wait windows (WaitWindows, what its status record
  // publishes) and the call sites they name, by stable key, so that a
  // post-mortem or live report applies the watchdog's own straggler rule
  // (StragglerBoard). Empty in dumps of torch_ext before they carried them.
  std::vector<WaitWindow> waitWindows;
  std::map<uint64_t, std::string> waitSites;

  int64_t globalRank(int groupRank) const {
    if (groupRank < 0 || static_cast<size_t>(groupRank) >= globalRanks.size()) return groupRank;
    return globalRanks[groupRank];
  }
  const EntryView* bySeq(uint64_t seq) const;
  const EntryView* oldestPending() const;
  std::string label() const {
    return (!desc.empty() && desc != "undefined") ? desc : name;
  }
};

// What made a rank write its dump file: the deadline or event behind it.
enum class DumpCause : uint8_t {
  WarnAfter,   // a collective waited past warn_after (a "hang" incident)
  AbortAfter,  // ... past abort_after: the group failed
  Mismatch,    // the ranks' collectives differ
  P2PCheck,    // a send/recv waited long: checked whether it can pair
  Failure,     // the inner backend failed an op (a peer died?)
  Manual,      // torch_ext.dump()
  StoreLost,   // the cross-rank store went away or stopped answering: the group failed
  Terminated,  // the launcher stopped this rank (SIGTERM under torchrun) before any verdict
};

template <>
struct EnumTable<DumpCause> {
  static constexpr NamedValue<DumpCause> kEntries[] = {
      {DumpCause::WarnAfter, "warn_after"}, {DumpCause::AbortAfter, "abort_after"}, {DumpCause::Mismatch, "mismatch"},
      {DumpCause::P2PCheck, "p2p_check"},   {DumpCause::Failure, "failure"},        {DumpCause::Manual, "manual"},
      {DumpCause::StoreLost, "store_lost"}, {DumpCause::Terminated, "terminated"},
  };
};

// Where the job stood for this rank, as of `stateNs`. A dump file is written
// once per report and rewritten when its state changes (Dumps.h, DumpFile), so
// old dumps of a job that recovered do not read like a live hang.
enum class DumpState : uint8_t {
  Running,    // nothing pending on a group the dump is about (a manual dump)
  Waiting,    // an operation was waiting when the dump was written, and still is
  Failed,     // the group failed (timeout, mismatch, a rank gone)
  Recovered,  // what the rank waited in has completed since (the hang resolved)
  Finished,   // recovered (or running), then the groups were destroyed or the process exited cleanly
};

template <>
struct EnumTable<DumpState> {
  static constexpr NamedValue<DumpState> kEntries[] = {
      {DumpState::Running, "running"},     {DumpState::Waiting, "waiting"},   {DumpState::Failed, "failed"},
      {DumpState::Recovered, "recovered"}, {DumpState::Finished, "finished"},
  };
};

// What a dump waited for in one group, so that its recovery can be told: the
// collective `seq` (0: none) and/or the record `recordId` (0: none) completing.
struct DumpAwaited {
  std::string group;  // group name
  uint64_t seq = 0;
  uint64_t recordId = 0;
};

// The state part of a dump file; absent from snapshots exchanged through the
// store during an incident (and from dumps of torch_ext before it existed).
struct DumpStatus {
  DumpCause cause = DumpCause::Manual;
  DumpState state = DumpState::Running;
  int64_t stateNs = 0;      // wall clock when `state` was set
  int64_t recoveredNs = 0;  // wall clock when the rank went past what it waited in (0: never)
  std::vector<DumpAwaited> awaited;
};

// Why a rank left its last words (LastWords): the `incident` of that snapshot,
// "terminated", "exited" or "raised: <exception>".
enum class LastWordsCause : uint8_t {
  Terminated,  // std::terminate (gloo's abort on a byte-count difference)
  Exited,      // its process ended after a group of it failed
  Raised,      // its process ended on an exception the program did not catch
};

template <>
struct EnumTable<LastWordsCause> {
  static constexpr NamedValue<LastWordsCause> kEntries[] = {
      {LastWordsCause::Terminated, "terminated"},
      {LastWordsCause::Exited, "exited"},
      {LastWordsCause::Raised, "raised"},
  };
};

struct LastWordsWhy {
  LastWordsCause cause = LastWordsCause::Exited;
  std::string exception;  // Raised: "RuntimeError: ... (at train.py:30 in step)"
  std::string encode() const;
  // nullopt for an incident that is not a last words' cause.
  static std::optional<LastWordsWhy> decode(const std::string& incident);
};

struct RankSnapshot {
  std::string version = kSnapshotVersion;
  int64_t rank = 0;  // global rank
  int64_t pid = 0;
  std::string hostname;
  std::string software;  // "torch 2.13.0, torch_ext 0.1.0, Python 3.11.7" (empty: not set, or an older dump)
  int64_t timeNs = 0;
  std::string incident;  // what triggered it ("hang:57", "dump", ...)
  std::string config;
  // The cross-rank store as this rank saw it: healthy, or lost, with how it
  // was lost ("the store at H:P (hosted by rank 0's process ...) is gone: ...").
  StoreHealth storeHealth = StoreHealth::Healthy;
  std::string storeLost;
  int64_t storeHostRank = -1;  // global rank whose process hosts the store (-1: none / unknown)
  MainThreadStack main;
  // What the process did over its last seconds (busy or not progressing).
  ProgressFacts progress;
  std::vector<GroupView> groups;
  // Where this rank stands in every one of its groups (also those `groups`
  // leaves out: an incident's snapshot holds one group's window), so that a
  // report can follow a rank that has not arrived into the group where it
  // waits (WaitGraph). Empty in dumps of torch_ext before it existed.
  std::vector<GroupWait> waits;
  std::optional<DumpStatus> status;  // dump files only
  // The process's other Python threads with a Python frame (live reports
  // only; empty elsewhere, and when the main thread holds the GIL).
  std::vector<ThreadStack> threads;

  const GroupView* group(const std::string& name) const;
};

Json toJson(const Frame& f);
Json toJson(const Label& label);
Json toJson(const EntryView& e, const GroupView& g);
Json toJson(const GroupView& g);
Json toJson(const RankSnapshot& s);

// Parse and validate; throws JsonError naming the first problem (missing or
// mistyped field, wrong version) so `diagnose` can say what is wrong with a file.
RankSnapshot snapshotFromJson(const Json& j);
GroupView groupFromJson(const Json& j);
Label labelFromJson(const Json& j);

std::string hex64(uint64_t v);
uint64_t parseHex64(const std::string& s, const char* what);

}  // namespace torch_ext
