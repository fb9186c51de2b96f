#pragma once

// Report: turns the snapshots of all ranks of a group into "who is where" text
// and JSON. The same analysis serves live incidents (snapshots exchanged through
// the store) and post-mortem `diagnose` (snapshots read from dump files), so a
// report never depends on where its inputs came from.

#include "guard/report/Incident.h"
#include "guard/report/Json.h"
#include "guard/report/RankList.h"
#include "guard/report/Snapshot.h"
#include "guard/report/StatusRecord.h"
#include "guard/report/WaitGraph.h"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torch_ext {

// One rank's view of one collective, for mismatch reports.
struct RankOp {
  int64_t globalRank = 0;
  bool issued = true;  // false: the rank has not reached this seq
  std::string text;    // fingerprint text, or "has not issued #57 yet (last #56)"
  std::string where;   // call site (and label, if any)
  uint64_t hash = 0;
  std::string hint;    // the hint of the op's label, if any
};

// "collective #57 on group "default_pg" (4 ranks) differs across ranks:" and one
// line per distinct (fingerprint, call site), ranks grouped; `more` (lines, each
// starting with "\n  ") goes after them, before the labels' hints.
std::string formatMismatch(const std::string& groupLabel, int groupSize, uint64_t seq,
                           const std::vector<RankOp>& ops, const std::string& note = std::string(),
                           const std::string& more = std::string());

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

struct RankInput {
  int groupRank = 0;
  int64_t globalRank = 0;
  bool responded = false;
  // A live report narrowed to some ranks (`torch-ext-diagnose live --ranks`)
  // did not ask this one: it is neither waiting, late nor gone, just not shown.
  bool notAsked = false;
  RankSnapshot snapshot;  // valid if responded or lastWords
  // It did not answer, but something terminated its process after it left
  // its ledger window in the store (LastWords: gloo's abort on a byte-count
  // difference): what it issued is known, whether it lives is not.
  bool lastWords = false;
  // From its last status in the store, for ranks that did not respond.
  bool statusKnown = false;
  RankPhase phase = RankPhase::Running;  // Left: destroy_process_group; Exited: its process ended
  int64_t heartbeatNs = 0;               // when it last published (0: unknown)
  uint64_t lastSeq = 0;                  // the last collective it issued
  const GroupView* group() const;        // this group's view inside snapshot, or null
  std::string groupName;
  // Where the rank stands in each of its groups (WaitGraph): `snapshot.waits`,
  // unless `sharedWaits` points to them (the post-mortem shares one list per
  // dump among all the groups it analyses, instead of a copy per group).
  const std::vector<GroupWait>* sharedWaits = nullptr;
  const std::vector<GroupWait>& waits() const {
    return sharedWaits != nullptr ? *sharedWaits : snapshot.waits;
  }
};

struct Verdict {
  enum class Kind : uint8_t { None, Mismatch, Hang, Failure };
  Kind kind = Kind::None;
  std::string text;
  int64_t reporter = -1;  // global rank that logs the report
  uint64_t seq = 0;
  std::string group;     // group label
  std::string incident;  // incident id
  std::string op;        // hang/failure: the stuck op's text
  // Hang/failure: global ranks by where they are.
  std::vector<int64_t> waiting, notArrived, gone, completed;
  // Mismatch: what each rank issued at `seq`.
  std::vector<RankOp> ops;
  // Hang/failure: what the waits across groups form (WaitGraph): a cycle
  // (a deadlock across `cycleGroups`, by label) or a chain ending at `waitsFor`.
  WaitShape shape = WaitShape::None;
  std::vector<std::string> cycleGroups;
  // Cycle: every rank of the loop blocks in its wait (WaitFinding::certain):
  // a deadlock that can never resolve, ended at once (Config::endCertain).
  bool certain = false;
  std::vector<int64_t> waitsFor;
  // Cycle or chain: its sites, each waiting for ranks of the next (the
  // HTML view draws them).
  std::vector<WaitSite> sites;

  static const char* kindName(Kind k);
  Json toJson() const;
  static Verdict fromJson(const Json& j);
};

template <>
struct EnumTable<Verdict::Kind> {
  static constexpr NamedValue<Verdict::Kind> kEntries[] = {
      {Verdict::Kind::None, "none"},
      {Verdict::Kind::Mismatch, "mismatch"},
      {Verdict::Kind::Hang, "hang"},
      {Verdict::Kind::Failure, "failure"},
  };
};

inline const char* Verdict::kindName(Kind k) {
  return enumName(k);
}

// "left the group (destroy_process_group) 1.0 s ago after issuing #25: ...",
// "exited 0.3 s ago after issuing #2: ...", "no heartbeat for 4.0 s (process
// gone or frozen)": what a report says of a rank that did not answer.
std::string describeAbsent(const RankInput& r, int64_t nowNs);
// For a rank known by its last words: how its process ended, "then its process
// was terminated" / "then its process exited" / "..., raising RuntimeError: ...".
std::string lastWordsNote(const RankInput& r);

// Where ranks outside the group stand (global rank -> its positions), when the
// caller knows: the post-mortem reads every rank's dump, so it can follow a
// wait out of the group; a live incident knows only the group's own ranks.
using OtherWaits = std::map<int64_t, const std::vector<GroupWait>*>;

// Analyses one group. `ranks` has one input per group rank, in order.
Verdict analyze(const std::string& groupLabel, const std::vector<RankInput>& ranks, const Incident& incident,
                int64_t nowNs, const OtherWaits* others = nullptr);

} // namespace torch_ext
