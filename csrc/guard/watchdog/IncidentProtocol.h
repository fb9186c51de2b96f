#pragma once

// IncidentProtocol: how the ranks of a group answer an Incident ("who is
// where?") together, through the store.
//
// The rank that raises an incident wins a compare-set on guard/once/<id>, bumps
// guard/alerts and writes guard/alert/<k>; it is the analyst. Every rank that
// sees the alert answers with a snapshot under guard/snap/<id>/<rank> (its
// ledger window and main-thread stack). The analyst waits until all ranks
// answered or a short deadline passed (ranks that did not answer are gone),
// analyses (Report) and publishes the verdict under guard/report/<id>; every
// rank acts on it. Ranks that see no verdict in time analyse for themselves, so
// a dead analyst cannot stall the others. A rank that already knows the verdict
// (a strict p2p check) publishes it before the alert, so the others act on it
// even if it exits at once.
//
// Live requests (`torch-ext-diagnose live`) come in as alerts too, so they
// cost a job that is never asked nothing beyond the alerts read each exchange
// already does: each rank answers one with its snapshot and moves on (no
// analyst, no verdict; the asker analyses).
//
// The protocol does store I/O only through GroupStore (bounded calls), takes
// the time as an argument (tests drive it with a fake clock) and calls back for
// what it cannot know: this rank's snapshot, and what to do with a verdict.
// When the store stops answering it stops making progress, without blocking;
// the watchdog then fails the group from what this rank knows alone.

#include "guard/collective/GroupState.h"
#include "guard/report/Incident.h"
#include "guard/report/Report.h"

#include <deque>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace torch_ext {

class IncidentProtocol {
 public:
  struct Hooks {
    // This rank's answer: its snapshot of the group for `inc`, as JSON text.
    std::function<std::string(const Incident& inc)> snapshot;
    // Once per incident, with its verdict (published by the analyst or made here).
    std::function<void(const Incident& inc, const Verdict& v)> act;
    // This rank's positions in all its groups, published job-wide with each
    // answer (null: not published).
    std::function<std::vector<GroupWait>()> positions;
    // This rank's answer to a live request ("live:<token>", StoreKeys.h): its
    // process-wide snapshot as JSON text. Unset: live requests are ignored.
    std::function<std::string(const std::string& requestId)> live;
    // The group's creation was refused after this rank concluded it
    // (keys::kJoinRefused): `why` is the GroupJoinError's text.
    std::function<void(const std::string& why)> refused;
  };

  IncidentProtocol(GroupState& state, Hooks hooks);

  // Raises `inc`; false when this rank was not the first to raise it or the
  // store did not answer (then `*storeFailed` is set).
  bool post(const Incident& inc, bool* storeFailed = nullptr);
  // Raises `inc` with a verdict this rank already knows: the report goes in
  // before the alert. False if it was raised already or the store failed.
  bool publishVerdict(const Incident& inc, const Verdict& verdict);
  // One step at wall time `nowNs`: reads new alerts, answers them, analyses or
  // collects verdicts. Never blocks beyond the store's call bound.
  void progress(int64_t nowNs);
  // At leave or exit: reads the alerts not read yet for a refusal of the
  // group's creation (hooks.refused), and answers nothing else (answering
  // would write this leaving rank's dump over the one of the incident it
  // ended in).
  void readRefusals();
  // Incidents this rank takes part in and has no verdict for yet.
  bool open() const {
    return !awaiting_.empty();
  }
  std::vector<Incident> openIncidents() const;
  // Live requests answered so far.
  uint64_t liveAnswered() const {
    return liveAnswered_;
  }

  // The keys of every incident of the group, for the last rank that leaves.
  std::vector<std::string> incidentKeys();

  // How long an analyst waits for snapshots, and others for its verdict.
  static int64_t snapWaitNs(double intervalS);
  static int64_t reportWaitNs(double intervalS);

 private:
  struct Awaiting {
    Incident incident;
    int64_t snapDeadlineNs = 0;    // analyst: stop waiting for snapshots
    int64_t reportDeadlineNs = 0;  // others: analyse yourself after this
    bool analyst = false;
  };

  void pollAlerts(int64_t nowNs);
  void respond(const Incident& inc);
  // True when done (a verdict was published and acted on).
  bool tryAnalyse(const Awaiting& a, bool force, int64_t nowNs);
  // Follows the waits of `inputs` out of the group: reads the positions that
  // ranks outside it published (StoreKeys.h waits/<rank>) into `others`.
  // False while a rank the waits lead to has published none recent enough.
  bool followOutside(const std::vector<RankInput>& inputs, int64_t nowNs, OtherWaits* others,
                     std::deque<std::vector<GroupWait>>* held);

  GroupState& st_;
  Hooks hooks_;
  uint64_t alertsSeen_ = 0;
  uint64_t liveAnswered_ = 0;
  std::set<std::string> posted_;
  std::set<std::string> handled_;
  std::vector<Awaiting> awaiting_;
};

}  // namespace torch_ext
