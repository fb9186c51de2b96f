#pragma once

// Watchdog: keeps every guarded group honest, on two kinds of thread.
//
// The watchdog thread (`torch_ext_watch`, one per process) does no store I/O.
// Each tick (TORCH_EXT_INTERVAL), per group, it
//  1. checks the store's health (StoreChannel: timestamps only). A store that
//     is gone or does not answer fails the group at once, with a report made
//     from what this rank knows (LocalReport);
//  2. checks the deadlines of the oldest pending op (Deadlines): warn_after and
//     abort_after raise incidents, and when their cross-rank verdict does not
//     come in time, act on a local report instead. So deadlines fire on time
//     whatever the store does;
//  3. queues the group's exchange on its store channel's I/O thread, unless
//     the last one is still running.
//
// The exchange (a job on `torch_ext_store`, every store call bounded):
// publish this rank's status (StatusRecord), read the two ring neighbours'
// (kept as their last known state; in async mode their rolling hashes are
// compared at the lower of the two seqs, and a difference raises a mismatch
// incident), post the incidents the watchdog thread asked for, and take part
// in the group's incidents (IncidentProtocol) and live requests (answered with
// this process's snapshot of every group). O(1) store operations per rank and
// tick whatever the world size; a live request costs each rank two more (read
// the request, write its snapshot), once.
//
// Exit: no exit path joins a thread that may be stuck or waits on the store.
// At interpreter exit (atExit) every group says "exited" where the store
// answers, the thread stops, the channels close, and inner backends are kept
// alive (their teardown could block on a dead peer).

#include "guard/Runtime.h"
#include "guard/watchdog/BusyWait.h"
#include "guard/watchdog/Deadlines.h"
#include "guard/watchdog/Dumps.h"
#include "guard/watchdog/FailureDesk.h"
#include "guard/watchdog/GroupStragglers.h"
#include "guard/collective/Fingerprint.h"
#include "guard/collective/GroupState.h"
#include "guard/collective/IncidentSink.h"
#include "guard/watchdog/IncidentProtocol.h"
#include "guard/report/LocalReport.h"
#include "guard/report/Report.h"
#include "guard/report/Snapshot.h"
#include "guard/report/StatusRecord.h"

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

class Watchdog final : public IncidentSink {
 public:
  static Watchdog& instance();

  // Watches the group, and becomes its incident sink.
  void add(const std::shared_ptr<GroupState>& state);
  // The default group's rank 0: writes where a live asker (`torch-ext-diagnose
  // live HOST:PORT`) finds the group's keys (keys::kLiveDirectory, in the base
  // store), on the store's I/O thread. Once per group creation; no-op elsewhere.
  void publishLiveDirectory(const std::shared_ptr<GroupState>& state);
  // Stops watching the group: publishes "left" and, on the last rank to
  // leave, removes the group's keys. The thread ends with the last group.
  void remove(const std::shared_ptr<GroupState>& state);

  // Publishes a first status for `rank` before the inner backends rendezvous,
  // so neighbours find the key from their first tick.
  static void announce(c10d::Store& store, int rank);

  // What `st`'s rank can say of the group alone at progress `p`: its pending
  // (or failed) operation, ranks and store host; no peers (the caller adds
  // those it read).
  static LocalFacts localFactsOf(GroupState& st, const Progress& p);

  // Raises `inc` for `state`'s group from any thread (the watchdog posts it at
  // once); used by checks that run outside the watchdog, e.g. the split audit.
  void requestIncident(const std::shared_ptr<GroupState>& state, const Incident& inc) override;

  // Raises `inc` with a verdict already known to this rank (e.g. a strict check
  // that saw both fingerprints): the report is published before the alert, so
  // the other ranks act on it even if this rank raises and exits at once.
  // Runs on the calling thread; returns false if the incident was raised already.
  bool publishVerdict(const std::shared_ptr<GroupState>& state, const Incident& inc, const Verdict& verdict) override;

  // A work whose inner op failed: raises (or joins) a failure incident and
  // returns the cross-rank report, waiting a few seconds at most.
  std::string failureReport(const std::shared_ptr<GroupState>& state, uint64_t entryId,
                            const std::string& error) override;

  // The one way a group fails (IncidentSink::failGroup): filed at the desk
  // (FailureDesk), which dumps, fails and tells; the watchdog's own verdicts
  // and deadlines come here too.
  bool failGroup(GroupState& state, const GroupFailure& failure) override;

  // A process being terminated (TerminateHandler) that hosts `state`'s store: stays,
  // bounded, until the peers have left, so that they can still read the
  // verdict its termination led to (lingerForPeers).
  void holdStoreForPeers(const std::shared_ptr<GroupState>& state);

  // This process's view of all its groups (or one), with the main thread's stack.
  RankSnapshot snapshot(const std::string& reason, const GroupState* only = nullptr, size_t maxEntries = 0,
                        WithWaitWindows windows = WithWaitWindows::No);
  // This process's position in each of its groups (WaitGraph).
  std::vector<GroupWait> positions();
  // The groups watched now.
  std::vector<std::shared_ptr<GroupState>> groupStates();
  // Whether this process logged the report of `state`'s failure (FailureDesk).
  bool toldHere(const GroupState& state) const {
    return desk_.toldHere(state);
  }
  // Writes the process-wide snapshot to <dump_dir>/rank<r>.json; returns the path
  // ("" without a dump dir). An unwritable dir is warned about once. `reason`
  // is an incident id ("hang:57": the dump's cause, and what it waits for in
  // `about`, the incident's group), "store_lost" (the store's loss), or
  // anything else for a manual dump (these wait for the oldest pending op of
  // every group). The file then follows
  // the job's state (DumpFile): recovered, failed, finished.
  std::string writeDump(const std::string& reason, const std::string& dirOverride = std::string(),
                        const GroupState* about = nullptr) override;

  // Interpreter exit: waits (bounded) for the verdict on what check="verify"
  // has not verified yet, says "exited" for every group where the store
  // answers (briefly), stops the thread without waiting on the store, and
  // closes the store channels. Later removals publish nothing. Returns the
  // failures nobody raised, each "<ErrorType> at exit: <report>": groups found
  // to differ while waiting, and groups whose creation was refused after this
  // rank concluded it (read in their alerts at leave or exit). `uncaught`:
  // what ends the process, when it is an exception the program did not catch
  // ("RuntimeError: ... (at train.py:30 in step)"): left as this rank's last
  // words in every group, so the report of a peer it leaves waiting says what
  // it raised instead of only that it exited.
  std::vector<std::string> atExit(const std::string& uncaught = std::string());
  // A group whose creation was refused (GroupJoinError) and that nobody raised:
  // kept for atExit, found at destroy_process_group or exit.
  void keepUnraisedRefusal(GroupState& st);
  bool exiting() const {
    return exiting_.load(std::memory_order_acquire);
  }

  // The straggler analysis of `state`'s group (StragglerBoard JSON): this
  // process's own on the group's rank 0, else the analyst's, read from the
  // store (bounded); "" when there is none yet or the store does not answer.
  std::string stragglers(const GroupState* state);

  struct Stats {
    uint64_t ticks = 0;
    uint64_t storeOps = 0;
    uint64_t incidents = 0;
    uint64_t liveAnswered = 0;  // live requests this process answered
    size_t groups = 0;
    bool running = false;
  };
  Stats stats() const;

 private:
  struct GroupCtx {
    GroupCtx(Watchdog& dog, std::shared_ptr<GroupState> s);
    std::shared_ptr<GroupState> state;
    std::atomic<bool> removed{false};
    std::atomic<bool> open{false};            // an incident is in progress (tick faster)
    std::atomic<bool> exchangeQueued{false};  // a job is queued or running on the I/O thread
    std::atomic<bool> exitSaid{false};        // "exited" is written: no exchange publishes "running" again
    int64_t nextExchangeNs = 0;               // watchdog thread: not before (steady clock)
    // Between two exchanges: the exchange interval, or 50 ms while an incident
    // is open, either stretched to the store budget for a large group.
    int64_t exchangePeriodNs(bool incidentOpen) const;
    // Watchdog thread (and verdicts, under localMu).
    std::mutex localMu;
    Deadlines deadlines;
    bool storeLossHandled = false;
    // What the ranks the oldest collective waits for do (BusyWait.h): looked at
    // by the I/O thread from a little before abort_after, read under localMu.
    BusyLook busyLook;
    // The collective whose wait past abort_after has begun (watchdog thread
    // writes, the I/O thread's looks read).
    std::atomic<uint64_t> busySeq{0};
    // A stream-ordered work's failure was raised as an incident: the later
    // works of the group fail after it ("in error after an earlier failure")
    // and tell its story, so they raise none (the report names the first).
    bool polledFailureRaised = false;
    // I/O thread only.
    IncidentProtocol protocol;
    std::set<int> seenNeighbours;
    BusyWait busyWait;
    int64_t nextBusyLookNs = 0;
    StatusRecord lastPublished;
    // The groups of the deadlock that the last hang verdict found, and its
    // subject: the abort of the same collective says it even when a rank of
    // the loop has left by then (its own abort came first).
    std::optional<std::pair<IncidentSubject, std::vector<std::string>>> deadlock;
    int64_t lastPublishNs = 0;
    // Straggler analysis (on group rank 0; GroupStragglers.h).
    GroupStragglers stragglers;
    // Written by the I/O thread, read for local reports.
    std::mutex peersMu;
    std::map<int, PeerState> peers;  // last status read of each watched peer
    std::vector<Incident> requests;  // to post; guarded by Watchdog::mu_
  };
  Watchdog() = default;
  void loop();
  // Watchdog thread: local checks, then the exchange is queued.
  void tick(const std::shared_ptr<GroupCtx>& ctx);
  // A tick threw: a rate-limited warning (watchdog thread only).
  void tickFailed(const GroupState& st, const std::exception& e);
  // Fails the group when its store is lost; false then.
  // At exit from a failed group whose store this process hosts: waits
  // (bounded) until the peers have left, so they can still read the verdict.
  // `afterFailure`: some group of this process failed (this one or another:
  // a deadlock across groups fails them one after the other, and a peer in a
  // group that has not failed yet still needs the store for its verdict).
  void lingerForPeers(GroupCtx& ctx, bool afterFailure);
  // At exit: pending verify checks settled and the alerts read once more;
  // the failures nobody raised ("<ErrorType> at exit: <report>").
  std::vector<std::string> unraisedAtExit(const std::vector<std::shared_ptr<GroupCtx>>& groups);
  // At exit: "exited" (and last words) where the store answers.
  void sayExited(const std::vector<std::shared_ptr<GroupCtx>>& groups, const std::string& uncaught);
  // The groups whose store this process hosts (lingerForPeers waits on them).
  static bool hostsStore(const GroupState& st);
  // Some group of this process has failed (sticky: a failed group destroyed
  // before the others still counts when they are left).
  std::atomic<bool> groupFailed_{false};
  // Failures found at leave that nobody raised (keepUnraisedRefusal), for atExit.
  std::vector<std::string> unraised_;
  // Raises an incident for each stream-ordered work found failed by polling.
  void reportPolledFailures(GroupCtx& ctx);
  bool checkStore(GroupCtx& ctx, const Progress& p);
  // Deadlines of the oldest pending op: incidents to raise, local fallbacks.
  void checkDeadlines(GroupCtx& ctx, const Progress& p);
  // I/O thread: past (nearly) abort_after, reads the awaited ranks' records
  // into ctx.busyLook. `mine`: this rank's record as just built.
  void lookAtAwaited(GroupCtx& ctx, const Progress& p, const StatusRecord& mine);
  // The wait goes on past abort_after: said once, by the lowest waiting rank.
  void sayBusyWait(GroupCtx& ctx, const Progress& p, const Entry& e);
  // I/O thread: status, neighbours (ring check), incidents.
  void exchange(GroupCtx& ctx);
  void post(GroupCtx& ctx, const Incident& inc);
  void applyVerdict(GroupCtx& ctx, const Incident& inc, const Verdict& v);
  // A certain deadlock's verdict (`text`: its error) reached group `from`: ends
  // this process's other groups on the cycle and publishes it to their peers.
  void endCycleGroups(const GroupState& from, const Verdict& v, const std::string& text);
  LocalFacts localFacts(GroupCtx& ctx, const Progress& p);
  std::shared_ptr<GroupCtx> find(const GroupState* state);
  void leaveGroup(GroupCtx& ctx);  // I/O thread

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<GroupCtx>> groups_;
  std::map<std::string, std::string> results_;  // failure incident id -> report
  // Mismatch reports already logged by this process. One mismatch reaches
  // applyVerdict more than once: as the "mismatch" incident, then as each
  // "failure" incident of the collectives the mismatch aborted (their analysis
  // finds the same mismatch first). It is logged once.
  // Where groups fail, and what this process tells of it.
  FailureDesk desk_{[this](GroupState& st, uint64_t seq) {
                      if (st.config().dumpDir.empty()) return;
                      writeDump(Incident{IncidentKind::Mismatch, IncidentSubject::collective(seq), -1, ""}.id(),
                                st.config().dumpDir, &st);
                    },
                    [this](GroupState& st, const Verdict& v) {
                      if (auto ctx = find(&st)) {
                        publishVerdict(ctx->state,
                                       Incident{IncidentKind::Mismatch, IncidentSubject::any(), st.id().rank, ""}, v);
                      }
                    }};
  // The certain deadlocks (by the groups on the cycle) this process logged.
  std::set<std::vector<std::string>> loggedDeadlocks_;
  std::thread thread_;
  std::thread::id threadId_;
  bool stop_ = false;
  bool wake_ = false;
  bool threadDone_ = false;
  std::atomic<bool> exiting_{false};

  std::atomic<uint64_t> ticks_{0};
  static constexpr int64_t kTickWarnEveryNs = 30'000'000'000;
  int64_t lastTickWarnNs_ = 0;                // watchdog thread only
  uint64_t suppressedTickFailures_ = 0;       // watchdog thread only
  std::atomic<uint64_t> retiredStoreOps_{0};  // of groups no longer watched
  std::atomic<uint64_t> incidents_{0};
  std::atomic<uint64_t> liveAnswered_{0};
  std::atomic<bool> storeLossDumped_{false};  // one dump at the store's loss, not one per group
  std::atomic<bool> dumpWarned_{false};
  DumpFile dumpFile_;  // the last dump written, whose state follows the job
};

}  // namespace torch_ext
