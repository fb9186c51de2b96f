#pragma once

// Report: turns the snapshots of all ranks of a group into "who is where" text
// and JSON. The same analysis serves live incidents (snapshots exchanged through
// the store) and post-mortem `diagnose` (snapshots read from dump files), so a
// report never depends on where its inputs came from.

#include "guard/report/Incident.h"
#include "guard/report/Json.h"
#include "guard/report/MetricSyncs.h"
#include "guard/report/RankList.h"
#include "guard/report/Snapshot.h"
#include "guard/report/StatusRecord.h"
#include "guard/report/Verdict.h"
#include "guard/report/WaitGraph.h"

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torch_ext {

// "collective #57 on group "default_pg" (4 ranks) differs across ranks:" and one
// line per distinct (fingerprint, call site), ranks grouped; `more` (lines, each
// starting with "\n  ") goes after them, before the labels' hints.
std::string formatMismatch(const std::string& groupLabel, int groupSize, uint64_t seq, const std::vector<RankOp>& ops,
                           const std::string& note = std::string(), const std::string& more = std::string());
// A collective that differs across ranks as a verdict: formatMismatch's text
// and its facts (each rank's op; the ops' facts, once per text). Every mode
// that finds a difference (strict's exchange, verify's gather, the ranks'
// windows) tells it through this one function.
Verdict differenceVerdict(const std::string& groupLabel, int groupSize, uint64_t seq, std::vector<RankOp> ops,
                          const std::string& note = std::string(), const std::string& more = std::string());

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
  // Its process hosts the cross-rank store, and the ranks that dumped lost
  // that store: how they lost it (post-mortem only; empty otherwise).
  std::string storeLost;
  const GroupView* group() const;  // this group's view inside snapshot, or null
  std::string groupName;
  // Where the rank stands in each of its groups (WaitGraph): `snapshot.waits`,
  // unless `sharedWaits` points to them (the post-mortem shares one list per
  // dump among all the groups it analyses, instead of a copy per group).
  const std::vector<GroupWait>* sharedWaits = nullptr;
  const std::vector<GroupWait>& waits() const {
    return sharedWaits != nullptr ? *sharedWaits : snapshot.waits;
  }
};

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

}  // namespace torch_ext
