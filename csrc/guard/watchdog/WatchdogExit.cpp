#include "guard/watchdog/Watchdog.h"

// The watchdog's exits: leaving a group (destroy_process_group), the
// interpreter's exit (atExit: pending checks settled, "exited" said, the
// thread stopped), and the store's host staying until its peers are done
// with the store (lingerForPeers).

#include "guard/Errands.h"
#include "guard/report/RankList.h"
#include "guard/store/StoreKeys.h"
#include "guard/watchdog/LastWords.h"

#include <algorithm>
#include <thread>

namespace torch_ext {

namespace {

// At exit, how long saying "exited" may take in all (a loaded machine's store
// answers in tens of milliseconds, its I/O thread may finish an exchange first:
// 300 ms per group lost the record on a CI runner, and its peers then reported
// "no heartbeat" without what this rank had issued), and how long the thread
// gets to stop.
constexpr std::chrono::milliseconds kExitStatusBound{1500};
constexpr std::chrono::milliseconds kExitJoinBound{2000};
// How long the exit waits for errands still running (Errands.h): they end
// within milliseconds unless stuck on a peer that is gone.
constexpr std::chrono::milliseconds kErrandsExitBound{200};

}  // namespace

void Watchdog::keepUnraisedRefusal(GroupState& st) {
  auto f = st.failure();
  if (!f || f->kind != GuardErrorKind::Join || st.failureRaised()) return;
  std::lock_guard<std::mutex> lock(mu_);
  const std::string text = "GroupJoinError at exit: " + f->report;
  if (std::find(unraised_.begin(), unraised_.end(), text) == unraised_.end()) unraised_.push_back(text);
}

void Watchdog::leaveGroup(GroupCtx& ctx) {
  // Incident keys stay until every rank has left, so a rank that leaves early
  // (after acting on a verdict) cannot take the verdict away from the others.
  // Their names are derived from the alert counter, so the last rank to leave
  // can remove them all.
  GroupState& st = *ctx.state;
  GroupStore& store = st.store();
  const int size = st.id().size;
  // The alerts once more: a group whose creation was refused after this rank
  // concluded it (a program shorter than an exchange) fails here, and the
  // exit says so (keepUnraisedRefusal).
  ctx.protocol.readRefusals();
  keepUnraisedRefusal(st);
  if (!store.set(keys::status(st.id().rank),
                 StatusRecord::of(RankPhase::Left, wallNs(), st.ledger().progress()).encode())) {
    return;
  }
  auto left = store.add(keys::kLeave, 1);
  if (!left.ok() || left.value < size) return;
  std::vector<std::string> written = ctx.protocol.incidentKeys();
  for (int r = 0; r < size; ++r) written.push_back(keys::status(r));
  for (int r = 0; r < size; ++r) written.push_back(keys::lastWords(r));
  for (int r = 0; r < size; ++r) written.push_back(keys::joinRecord(r));
  if (!st.failed()) {  // a refused group keeps them: its refusing processes may still count who read it
    for (int r = 0; r < size; ++r) written.push_back(keys::joinClaim(r));
    written.push_back(keys::kJoinSeen);
  }
  written.push_back(keys::kLeave);
  written.push_back(keys::kStragglers);
  written.push_back(keys::kJoinVerdict);
  store.deleteKeys(written);
}

std::vector<std::string> Watchdog::unraisedAtExit(const std::vector<std::shared_ptr<GroupCtx>>& groups) {
  // No clean exit over a pending verdict: the mode drains what this rank
  // issued first (bounded by the store timeout); a difference found meanwhile
  // fails its group, and the exit reports it.
  std::vector<std::string> mismatches;
  for (auto& g : groups) {
    GroupState& st = *g->state;
    st.mode().drain(std::chrono::milliseconds(static_cast<int64_t>(st.config().storeTimeoutS * 1000.0)));
    // Found at exit, or earlier on collectives nobody waited on: never raised.
    auto f = st.failure();
    if (f && f->kind == GuardErrorKind::Mismatch && !st.failureRaised()) {
      mismatches.push_back("CollectiveMismatchError at exit: " + f->report);
    }
    // The alerts once more (on the store's I/O thread, after any exchange):
    // a refusal of the group's creation that came after this rank's last tick.
    if (!st.failed() && st.store().health() == StoreHealth::Healthy) {
      st.store().channel().call<bool>("alerts at exit", [ctx = g] {
        ctx->protocol.readRefusals();
        return true;
      });
      keepUnraisedRefusal(st);
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  mismatches.insert(mismatches.end(), unraised_.begin(), unraised_.end());
  return mismatches;
}

void Watchdog::sayExited(const std::vector<std::shared_ptr<GroupCtx>>& groups, const std::string& uncaught) {
  // Say "exited" where the store answers: peers then report this rank in
  // those words instead of "no heartbeat". Briefly: the store may be gone.
  const auto deadline = std::chrono::steady_clock::now() + kExitStatusBound;
  for (auto& g : groups) {
    GroupState& st = *g->state;
    if (st.store().health() != StoreHealth::Healthy) continue;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    g->exitSaid.store(true);
    // A failed group: what this rank issued stays for the ranks still
    // analysing (a verdict this rank raised may not have reached them). An
    // uncaught exception: what it raised, for the peers it leaves waiting.
    if (!uncaught.empty()) {
      publishLastWords(st, LastWordsWhy{LastWordsCause::Raised, uncaught});
    } else if (st.failed()) {
      publishLastWords(st, LastWordsWhy{LastWordsCause::Exited, ""});
    }
    st.store().set(keys::status(st.id().rank),
                   StatusRecord::of(RankPhase::Exited, wallNs(), st.ledger().progress()).encode(), left);
  }
}

std::vector<std::string> Watchdog::atExit(const std::string& uncaught) {
  std::vector<std::shared_ptr<GroupCtx>> groups;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (exiting()) return {};
    groups = groups_;
  }
  std::vector<std::string> mismatches = unraisedAtExit(groups);
  for (auto& g : groups) groupFailed_.store(groupFailed_.load() || g->state->failed());
  // The store's host says "exited" before it lingers: its peers read it while
  // the store is still there (said after, it was lost with the store in a race
  // its peers mostly lost, and they reported "no heartbeat" instead).
  std::vector<std::shared_ptr<GroupCtx>> hosted;
  for (auto& g : groups) {
    if (hostsStore(*g->state)) hosted.push_back(g);
  }
  sayExited(hosted, uncaught);
  for (auto& g : groups) lingerForPeers(*g, groupFailed_.load());
  // A clean exit (no group failed) finishes a dump that recovered.
  dumpFile_.update();
  if (std::none_of(groups.begin(), groups.end(), [](const auto& g) { return g->state->failed(); })) {
    dumpFile_.finish();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (exiting()) return mismatches;
    exiting_.store(true, std::memory_order_release);
  }
  sayExited(groups, uncaught);
  std::thread toStop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    toStop = std::move(thread_);
  }
  // A call in progress returns at once once its channel is closed.
  for (auto& g : groups) g->state->store().channel().close();
  cv_.notify_all();
  if (toStop.joinable()) {
    std::unique_lock<std::mutex> lock(mu_);
    const bool done = cv_.wait_for(lock, kExitJoinBound, [this] { return threadDone_; });
    lock.unlock();
    if (done) {
      toStop.join();
    } else {
      toStop.detach();  // stuck somewhere it should not be: never block the exit on it
    }
  }
  // The guard's errands are joined; one stuck in a transport (a pair
  // exchange whose peer is gone) is named and left to the exit.
  for (const auto& name : Errands::instance().finish(kErrandsExitBound)) {
    logMessage(LogLevel::Debug, "guard: at exit, the errand '" + name + "' still runs; the process exits over it");
  }
  return mismatches;
}

void Watchdog::holdStoreForPeers(const std::shared_ptr<GroupState>& state) {
  if (auto ctx = find(state.get())) lingerForPeers(*ctx, true);
}

bool Watchdog::hostsStore(const GroupState& st) {
  return st.store().health() == StoreHealth::Healthy &&
         st.store().channel().address().hostRank == st.id().globalRank(st.id().rank);
}

void Watchdog::lingerForPeers(GroupCtx& ctx, bool afterFailure) {
  // Under plain env:// this process hosts the store. Leaving a failed group at
  // once would take the verdict's keys with it, and peers that have not read
  // them yet (they poll each tick) would report a lost store instead of the
  // failure. Stay, bounded, until every peer has left or exited. The same for
  // every group once any of this process's groups failed: in a deadlock across
  // groups this rank's group fails first, while a peer elsewhere (a pipeline
  // stage) still waits for its own group's verdict through this store. And at
  // a clean end (issue 69): a peer whose watchdog still exchanges when the
  // store goes would print torch's TCPStore warning and a C++ stack over a
  // successful run.
  GroupState& st = *ctx.state;
  if (!hostsStore(st)) return;
  const int size = st.id().size;
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) {
    if (r != st.id().rank) keys.push_back(keys::status(r));
  }
  if (keys.empty()) return;
  const double boundS = std::min(5.0, std::max(1.0, 10 * st.exchangeIntervalS()));
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(boundS * 1000));
  std::vector<int64_t> still;
  while (std::chrono::steady_clock::now() < deadline) {
    auto values = st.store().multiGet(keys);
    if (!values.ok()) return;
    still.clear();
    for (size_t i = 0; i < values.value.size(); ++i) {
      auto rec = StatusRecord::decode(values.value[i]);
      const int r = static_cast<int>(i) + (static_cast<int>(i) >= st.id().rank ? 1 : 0);
      if (!(rec && (rec->phase == RankPhase::Left || rec->phase == RankPhase::Exited))) {
        still.push_back(st.id().globalRank(r));
      }
    }
    if (still.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a bounded poll of the peers' statuses
  }
  if (!afterFailure && !st.failed()) {
    logMessage(LogLevel::Warning, "group \"" + st.label() + "\": this process hosts the store (" +
                                      st.store().channel().address().describe() + ") and ends while " +
                                      formatRanks(still) + " still use" + (still.size() == 1 ? "s" : "") +
                                      " it, after waiting " + std::to_string(static_cast<int>(boundS * 1000)) +
                                      " ms for them: they will find the store gone");
  }
}

}  // namespace torch_ext
