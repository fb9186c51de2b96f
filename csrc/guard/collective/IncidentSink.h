#pragma once

// IncidentSink: what the per-collective path tells the layer above it.
//
// The checks, the verifier and the works find differences and failures while a
// collective is issued or completes; turning one into a cross-rank verdict, a
// report or a dump is the watchdog's job (watchdog/), one layer up. This
// interface is the arrow between them pointing down: the collective layer
// speaks to an IncidentSink, the watchdog implements it and attaches itself to
// every group it watches (Watchdog::add, before the group's first collective).
//
// It is also the one way a group fails: whatever finds that a group cannot go
// on (a difference every rank's words show, a check's transport gone, abort())
// hands a GroupFailure to failGroup, and the watchdog's desk dumps, logs and
// fails the group (GroupState::fail is called in watchdog/FailureDesk.cpp and,
// for a detached group, in GroupState.cpp; tests/python/test_layout.py holds it).
//
// A group never attached (a unit test's bare GroupState) speaks to a detached
// sink: nothing is published or dumped, the failure report is the inner error
// as given, and failGroup fails the group.

#include "guard/Errors.h"
#include "guard/Runtime.h"
#include "guard/report/Difference.h"
#include "guard/report/Incident.h"
#include "guard/report/Verdict.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace torch_ext {

class GroupState;

// Who tells a group's failure where it is filed (watchdog/FailureDesk), once
// it is set there: a later failure of the same group is its consequence, told
// by nobody.
struct Telling {
  enum class Who : uint8_t {
    Nobody,         // the error raised on every rank carries the report
    GroupRankZero,  // found with every rank's words: logged once, by the group's rank 0
    ThisRank,       // found here alone (a deadline, the store, the inner backend)
  };
  Who who = Who::Nobody;
  LogLevel level = LogLevel::Error;
  std::string line;  // what is logged; "" for the report itself
};

// A group failure found on the per-collective path, as it is told.
struct GroupFailure {
  GuardErrorKind kind = GuardErrorKind::Failure;
  std::string report;  // "" where `difference` is set: the desk renders it
  // A difference a check mode found, as a value (report/Difference.h): the
  // desk renders it (its report and facts), publishes one found by this rank
  // alone for every rank, has every rank dump a collective's under its
  // incident (with dump_dir set) while the ledgers still show it, and fails
  // the group, as an incident's verdict is told.
  std::optional<Difference> difference;
  // The report's facts, where it has them (kind None: the group's failure
  // then carries its kind, group and text alone). GuardError.report in Python.
  Verdict facts;
  // Who logs it (a difference found with every rank's words: the group's rank 0).
  Telling tell;

  static GroupFailure of(Difference d, Telling tell = Telling{}) {
    GroupFailure f;
    f.kind = GuardErrorKind::Mismatch;
    f.difference = std::move(d);
    f.tell = std::move(tell);
    return f;
  }
};

class IncidentSink {
 public:
  virtual ~IncidentSink() = default;

  // Asks the group's ranks to look at `inc` together (posted by the next store
  // exchange); the verdict follows through the incident protocol.
  virtual void requestIncident(const std::shared_ptr<GroupState>& state, const Incident& inc) = 0;
  // A verdict this rank reached alone (a difference seen in a check): published
  // for every rank, applied here. Returns false if the incident was raised already.
  virtual bool publishVerdict(const std::shared_ptr<GroupState>& state, const Incident& inc,
                              const Verdict& verdict) = 0;
  // The report for an operation the inner backend failed (`error`: its text),
  // naming gone ranks where the group knows of any.
  virtual std::string failureReport(const std::shared_ptr<GroupState>& state, uint64_t entryId,
                                    const std::string& error) = 0;
  // This process's snapshot written for incident `reason` about `about`'s group,
  // into `dir` ("": the configured dump dir); returns the path, "" for none.
  virtual std::string writeDump(const std::string& reason, const std::string& dir, const GroupState* about) = 0;
  // Fails `state`'s group with `failure` (dumped and logged as it says); false
  // when the group had failed already (its first failure stands).
  virtual bool failGroup(GroupState& state, const GroupFailure& failure) = 0;
};

// The sink of a group no watchdog watches: publishes nothing, fails the group
// (defined in GroupState.cpp, beside GroupState::fail).
IncidentSink& detachedIncidentSink();

}  // namespace torch_ext
