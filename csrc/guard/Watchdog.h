#pragma once

// Watchdog: one thread per process that keeps every guarded group honest.
//
// Each tick (TORCH_EXT_INTERVAL), for each group, with O(1) store operations
// per rank whatever the world size:
//  1. publish this rank's status (heartbeat, last seq, rolling hash, oldest
//     pending op) under guard/st/<rank>;
//  2. async mode: read the two ring neighbours' status and compare rolling
//     hashes at the lower of the two seqs; a difference raises a mismatch
//     incident;
//  3. check the oldest pending op against warn_after / abort_after (and, for a
//     stuck send/recv, a pairing check);
//  4. poll the group's incident counter and take part in new incidents.
//
// An incident (hang, abort, mismatch, p2p, failure) runs the same protocol:
// the rank that raises it wins a compare-set on guard/once/<id>, bumps
// guard/alerts and becomes the analyst; every rank answers with a snapshot
// (its ledger window and its main thread's stack) and writes its dump file; the
// analyst waits until all ranks answered or a short deadline passed (ranks that
// did not answer are gone), runs Report::analyze() and publishes the verdict
// under guard/report/<id>; each rank then acts on it (log, fail the group).
// Ranks that see no verdict in time analyse for themselves, so a dead analyst
// cannot stall the others.

#include "guard/Fingerprint.h"
#include "guard/GroupState.h"
#include "guard/Report.h"
#include "guard/Snapshot.h"

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace torch_ext {

class Watchdog {
 public:
  static Watchdog& instance();

  void add(const std::shared_ptr<GroupState>& state);
  // Stops watching the group and removes its keys; the thread ends with the
  // last group.
  void remove(const std::shared_ptr<GroupState>& state);

  // Publishes a first status for `rank` before the inner backends rendezvous,
  // so neighbours find the key from their first tick.
  static void announce(c10d::Store& store, int rank);

  // Raises `inc` for `state`'s group from any thread (the watchdog posts it at
  // once); used by checks that run outside the watchdog, e.g. the split audit.
  void requestIncident(const std::shared_ptr<GroupState>& state, const Incident& inc);

  // Raises `inc` with a verdict already known to this rank (e.g. a strict check
  // that saw both fingerprints): the report is published before the alert, so
  // the other ranks act on it even if this rank raises and exits at once.
  // Runs on the calling thread; returns false if the incident was raised already.
  bool publishVerdict(const std::shared_ptr<GroupState>& state, const Incident& inc, const Verdict& verdict);

  // A work whose inner op failed: raises (or joins) a failure incident and
  // returns the cross-rank report, waiting a few seconds at most.
  std::string failureReport(const std::shared_ptr<GroupState>& state, uint64_t entryId, const std::string& error);

  // Strict mode, after the check collective saw different hashes: every rank
  // publishes its full fingerprint and reads all others'.
  std::vector<RankOp> exchangeStrictFingerprints(const std::shared_ptr<GroupState>& state, const Fingerprint& fp,
                                                 uint64_t seq, uint32_t callSite);

  // This process's view of all its groups (or one), with the main thread's stack.
  RankSnapshot snapshot(const std::string& reason, const GroupState* only = nullptr, size_t maxEntries = 0);
  // Writes the process-wide snapshot to <dump_dir>/rank<r>.json; returns the path
  // ("" without a dump dir). An unwritable dir is warned about once.
  std::string writeDump(const std::string& reason, const std::string& dirOverride = std::string());

  // Stops the thread for good without leaving groups (interpreter exit).
  void stopThread();

  struct Stats {
    uint64_t ticks = 0;
    uint64_t storeOps = 0;
    uint64_t incidents = 0;
    size_t groups = 0;
    bool running = false;
  };
  Stats stats() const;

 private:
  struct Awaiting {
    Incident incident;
    int64_t snapDeadlineNs = 0;    // analyst: stop waiting for snapshots
    int64_t reportDeadlineNs = 0;  // others: analyse yourself after this
    bool analyst = false;
  };
  struct GroupCtx {
    std::shared_ptr<GroupState> state;
    std::mutex busy;  // held while the watchdog works on this group
    bool removed = false;
    std::atomic<bool> open{false};  // an incident is in progress (tick faster)
    std::set<int> seenNeighbours;
    uint64_t alertsSeen = 0;
    std::set<std::string> posted;
    std::set<std::string> handled;
    std::vector<Awaiting> awaiting;
    std::vector<Incident> requests;  // from failureReport(), guarded by Watchdog::mu_
    std::string lastStatus;
    int64_t lastPublishNs = 0;
    uint64_t warnedId = 0, abortedId = 0, p2pCheckedId = 0;
  };

  Watchdog() = default;
  void loop();
  void tick(GroupCtx& ctx);
  void post(GroupCtx& ctx, const Incident& inc);
  void pollAlerts(GroupCtx& ctx);
  void respond(GroupCtx& ctx, const Incident& inc);
  void progressAwaiting(GroupCtx& ctx);
  bool tryAnalyse(GroupCtx& ctx, const Awaiting& a, bool force);
  void act(GroupCtx& ctx, const Incident& inc, const Verdict& v);
  std::shared_ptr<GroupCtx> find(const GroupState* state);
  void leaveGroup(GroupCtx& ctx);

  // Store helpers that count operations and never throw.
  bool sset(GroupState& st, const std::string& key, const std::string& value);
  bool scheck(GroupState& st, const std::string& key);
  std::optional<std::string> sget(GroupState& st, const std::string& key);  // only if it exists

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<GroupCtx>> groups_;
  std::map<std::string, std::string> results_;  // failure incident id -> report
  std::thread thread_;
  std::thread::id threadId_;
  bool stop_ = false;
  bool wake_ = false;
  bool exiting_ = false;

  std::atomic<uint64_t> ticks_{0};
  std::atomic<uint64_t> storeOps_{0};
  std::atomic<uint64_t> incidents_{0};
  std::atomic<bool> dumpWarned_{false};
};

} // namespace torch_ext
