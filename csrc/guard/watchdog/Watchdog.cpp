#include "guard/watchdog/Watchdog.h"
#include "guard/Clock.h"
#include "guard/Errands.h"

#include "guard/report/Messages.h"
#include "guard/report/RankList.h"
#include "guard/collective/CallSite.h"
#include "guard/watchdog/Dumps.h"
#include "guard/watchdog/LastWords.h"
#include "guard/watchdog/ProgressSampler.h"
#include "guard/store/StoreKeys.h"
#include "guard/Runtime.h"

#include <algorithm>
#include <csignal>
#include <pthread.h>
#include <sstream>

namespace torch_ext {

namespace {

constexpr size_t kHangWindow = 64;
// A status is republished at least this often (the heartbeat).
constexpr int64_t kHeartbeatNs = 500'000'000;
// The awaited ranks' records past abort_after: read every half second, trusted
// for three, and a heartbeat unchanged for kBusyStaleNs (or four exchange
// periods) is a frozen rank's.
constexpr int64_t kBusyLookEveryNs = 500'000'000;
constexpr int64_t kBusyLookFreshNs = 3'000'000'000;
constexpr int64_t kBusyStaleNs = 3'000'000'000;
// While an incident is open, the watchdog ticks (and exchanges) this often.
constexpr double kOpenIntervalS = 0.05;
// An exchange comes due this much before its period ends, so that one due at
// a tick is not put off to the next by the tick's jitter.
constexpr int64_t kTickSlackNs = 10'000'000;

// This rank's closed wait windows as its status record carries them.
std::string publishedWaits(GroupState& st) {
  static const std::string host = [] {
    std::string h = hostname();
    h = h.substr(0, h.find('.'));
    for (char& c : h) {
      if (c == ' ' || c == ':' || c == '\n') c = '_';
    }
    return h.substr(0, 32);
  }();
  RankWaits mine;
  mine.windows = st.ledger().waitWindows();
  if (mine.windows.empty()) return "";
  mine.host = host;
  for (auto& w : mine.windows) w.siteKey = CallSites::instance().stableKey(w.site);
  return mine.encode();
}

// TORCH_EXT_LIVE_SIGNAL: the handler only raises a flag (async-signal-safe);
// the watchdog thread sees it at its next tick and asks the runtime for the
// live report, which the Python side makes on a thread of its own.
std::atomic<int> g_liveSignalPending{0};
std::atomic<bool> g_liveSignalInstalled{false};

extern "C" void onLiveSignal(int sig) {
  g_liveSignalPending.store(sig, std::memory_order_relaxed);
}

// Once per process, from the first guarded group's config. Never replaces a
// handler someone else installed (a launcher's or the application's own).
void installLiveSignal(int sig) {
  if (sig == 0 || g_liveSignalInstalled.exchange(true)) return;
  struct sigaction old {};
  if (sigaction(sig, nullptr, &old) != 0) return;
  if (old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO) != 0) {
    logMessage(LogLevel::Debug, "torch_ext: " + detail::signalName(sig) +
                                    " already has a handler: live reports by signal are off in this process "
                                    "(TORCH_EXT_LIVE_SIGNAL picks another signal)");
    return;
  }
  struct sigaction sa {};
  sa.sa_handler = onLiveSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a blocked read or wait of the application's goes on
  sigaction(sig, &sa, nullptr);
}

}  // namespace

Watchdog& Watchdog::instance() {
  // Leaked: the thread may outlive static destruction at exit.
  static auto* dog = new Watchdog();
  return *dog;
}

Watchdog::GroupCtx::GroupCtx(Watchdog& dog, std::shared_ptr<GroupState> s)
    : state(std::move(s)),
      deadlines(state->warnAfter(), state->abortAfter(), state->exchangeIntervalS(), state->mode().compares(),
                state->busyCap()),
      busyWait(std::max<int64_t>(kBusyStaleNs, static_cast<int64_t>(4e9 * state->exchangeIntervalS()))),
      protocol(*state, IncidentProtocol::Hooks{
                           [&dog, st = state.get()](const Incident& inc) {
                             const size_t window =
                                 inc.kind == IncidentKind::Mismatch ? st->ledger().capacity() : kHangWindow;
                             RankSnapshot snap = dog.snapshot(inc.id(), st, window);
                             dog.writeDump(inc.id(), std::string(), st);
                             return toJson(snap).dump();
                           },
                           [&dog, this](const Incident& inc, const Verdict& v) { dog.applyVerdict(*this, inc, v); },
                           [&dog] { return dog.positions(); },
                           [&dog](const std::string& requestId) {
                             // Every group, a window of each: the asker analyses them all.
                             ++dog.liveAnswered_;
                             RankSnapshot snap = dog.snapshot(requestId, nullptr, kHangWindow, WithWaitWindows::Yes);
                             snap.threads = Runtime::instance().threadStacks(std::chrono::milliseconds(200));
                             return toJson(snap).dump();
                           },
                           [&dog, st = state.get()](const std::string& why) {
                             dog.failGroup(*st, GroupFailure{GuardErrorKind::Join, why, std::nullopt, Verdict(),
                                                             Telling{Telling::Who::GroupRankZero}});
                           }}) {}

void Watchdog::announce(c10d::Store& store, int rank) {
  const std::string v = StatusRecord::of(RankPhase::Running, wallNs(), Progress{}).encode();
  store.set(keys::kPrefix + keys::status(rank), std::vector<uint8_t>(v.begin(), v.end()));
}

void Watchdog::publishLiveDirectory(const std::shared_ptr<GroupState>& state) {
  if (state->id().rank != 0) return;
  GroupStore& store = state->store();
  const std::string prefix = store.fullPrefix();
  if (prefix.empty()) return;  // a store without a base we can reach: no live reports
  Json j = Json::object();
  j.set("version", 1);
  j.set("prefix", prefix);
  j.set("size", state->id().size);
  j.set("group", state->id().name);
  j.set("exchange_s", state->exchangeIntervalS());  // how often ranks read requests: the asker's default deadline
  const std::string text = j.dump();
  // On the I/O thread: creating the group never waits on the store for this.
  store.channel().post([st = state, text] { st->store().setRoot(keys::kLiveDirectory, text); });
}

void Watchdog::add(const std::shared_ptr<GroupState>& state) {
  state->attachIncidentSink(*this);
  installLiveSignal(state->config().liveSignal);
  ProgressSampler::instance().sample(steadyNs());  // a first sample, so the first snapshot has a window
  auto ctx = std::make_shared<GroupCtx>(*this, state);
  std::lock_guard<std::mutex> lock(mu_);
  groups_.push_back(ctx);
  if (!thread_.joinable() && !exiting()) {
    stop_ = false;
    threadDone_ = false;
    thread_ = std::thread([this] {
      loop();
      std::lock_guard<std::mutex> done(mu_);
      threadDone_ = true;
      cv_.notify_all();
    });
    // Named here, not by the thread once it runs: under load that came after
    // the first collectives, and a listing of the threads missed it.
    pthread_setname_np(thread_.native_handle(), "torch_ext_watch");
    threadId_ = thread_.get_id();
  }
}

std::shared_ptr<Watchdog::GroupCtx> Watchdog::find(const GroupState* state) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& g : groups_) {
    if (g->state.get() == state) return g;
  }
  return nullptr;
}

void Watchdog::remove(const std::shared_ptr<GroupState>& state) {
  if (state->failed()) groupFailed_.store(true);
  if (!exiting()) {
    // destroy_process_group(): after a failure of this group or another, or a clean end.
    if (auto watched = find(state.get())) lingerForPeers(*watched, groupFailed_.load());
  }
  std::shared_ptr<GroupCtx> ctx;
  std::thread toJoin;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = groups_.begin(); it != groups_.end(); ++it) {
      if ((*it)->state == state) {
        ctx = *it;
        groups_.erase(it);
        break;
      }
    }
    if (groups_.empty() && thread_.joinable() && std::this_thread::get_id() != threadId_) {
      stop_ = true;
      toJoin = std::move(thread_);
    }
  }
  cv_.notify_all();
  if (ctx) ctx->removed = true;
  // The group may have gone past what a dump waited in since the last tick;
  // a clean end of the last group finishes the dump (a failed group never does).
  dumpFile_.update();
  if (ctx && !exiting() && !state->failed()) {
    bool last = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = groups_.empty();
    }
    if (last) dumpFile_.finish();
  }
  if (toJoin.joinable()) {
    toJoin.join();  // the watchdog thread never waits on the store: this is quick
    Runtime::instance().idle();
  }
  if (!ctx) return;
  StoreChannel& channel = state->store().channel();
  if (!exiting()) {
    // On the I/O thread, after any exchange of this group still queued (it
    // sees `removed` and does nothing); bounded like every store call.
    channel.call<bool>("leave", [this, ctx] {
      leaveGroup(*ctx);
      return true;
    });
  }
  retiredStoreOps_ += state->store().ops();
  bool shared = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& g : groups_) shared = shared || &g->state->store().channel() == &channel;
  }
  if (!shared) channel.quiesce();  // the last watched group on this store: no thread stays behind
}

Watchdog::Stats Watchdog::stats() const {
  Stats s;
  s.ticks = ticks_.load();
  s.storeOps = retiredStoreOps_.load();
  s.incidents = incidents_.load();
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& g : groups_) s.storeOps += g->state->store().ops();
  s.groups = groups_.size();
  s.liveAnswered = liveAnswered_.load();
  s.running = thread_.joinable();
  return s;
}

void Watchdog::loop() {
  while (true) {
    std::vector<std::shared_ptr<GroupCtx>> groups;
    int64_t intervalNs = 200'000'000;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_) return;
      bool busy = false;
      for (auto& g : groups_) {
        intervalNs = std::min<int64_t>(intervalNs, static_cast<int64_t>(g->state->config().intervalS * 1e9));
        busy = busy || g->open.load() || !g->requests.empty();
      }
      // While an incident is open, tick faster so reports arrive quickly.
      if (busy) intervalNs = std::min<int64_t>(intervalNs, static_cast<int64_t>(kOpenIntervalS * 1e9));
      cv_.wait_for(lock, std::chrono::nanoseconds(intervalNs), [this] { return stop_ || wake_; });
      wake_ = false;
      if (stop_) return;
      groups = groups_;
    }
    ++ticks_;
    ProgressSampler::instance().sample(steadyNs());  // what a snapshot says of this process's progress
    for (auto& g : groups) {
      if (g->removed) continue;
      try {
        tick(g);
      } catch (const std::exception& e) {
        tickFailed(*g->state, e);
      }
    }
    dumpFile_.update();  // a waiting dump whose hang resolved becomes "recovered"
    if (const int sig = g_liveSignalPending.exchange(0, std::memory_order_relaxed)) {
      Runtime::instance().liveReport(sig);  // TORCH_EXT_LIVE_SIGNAL arrived since the last tick
    }
  }
}

void Watchdog::tickFailed(const GroupState& st, const std::exception& e) {
  // A failed tick is a bug or a broken invariant, never part of normal work:
  // say so where users look, but at most once per kTickWarnEveryNs, so a tick
  // that fails every 0.2 s cannot flood the log.
  const int64_t now = steadyNs();
  if (lastTickWarnNs_ != 0 && now - lastTickWarnNs_ < kTickWarnEveryNs) {
    ++suppressedTickFailures_;
    return;
  }
  std::string msg = "guard watchdog: a check of group \"" + st.label() + "\" failed and was skipped: " + e.what();
  if (suppressedTickFailures_ > 0) {
    msg += " (" + std::to_string(suppressedTickFailures_) + " more failed checks since the last warning)";
  }
  msg += "; the watchdog goes on. Please report this with the log.";
  logMessage(LogLevel::Warning, msg);
  lastTickWarnNs_ = now;
  suppressedTickFailures_ = 0;
}

int64_t Watchdog::GroupCtx::exchangePeriodNs(bool incidentOpen) const {
  const Config& cfg = state->config();
  // The shortest period that keeps the group within the budget (0: no budget).
  const double budgetS = exchangeIntervalS(0.0, cfg.storeBudget, state->id().size);
  const double wantS = incidentOpen ? std::min(cfg.intervalS, kOpenIntervalS) : cfg.intervalS;
  if (budgetS <= wantS) return 0;  // within the budget: every tick exchanges
  return static_cast<int64_t>(budgetS * 1e9) - kTickSlackNs;
}

void Watchdog::tick(const std::shared_ptr<GroupCtx>& ctx) {
  GroupState& st = *ctx->state;
  st.ledger().pollCompletions();
  reportPolledFailures(*ctx);
  const Progress p = st.ledger().progress();
  if (!checkStore(*ctx, p)) {
    ctx->open = false;
    return;
  }
  checkDeadlines(*ctx, p);
  // The exchange runs on the store's I/O thread; one at a time per group, so
  // a store call that hangs there holds up nothing here. A large group
  // exchanges less often than it ticks, to stay within the store budget.
  const int64_t now = steadyNs();
  if (now < ctx->nextExchangeNs) return;
  if (!ctx->exchangeQueued.exchange(true)) {
    ctx->nextExchangeNs = now + ctx->exchangePeriodNs(ctx->open.load());
    const bool queued = st.store().channel().post([this, ctx] {
      if (!ctx->removed) exchange(*ctx);
      ctx->exchangeQueued = false;
    });
    if (!queued) ctx->exchangeQueued = false;
  }
}

bool Watchdog::failGroup(GroupState& st, const GroupFailure& f) {
  return desk_.file(st, f);
}

void Watchdog::reportPolledFailures(GroupCtx& ctx) {
  GroupState& st = *ctx.state;
  for (const auto& [id, error] : st.ledger().takePolledFailures()) {
    if (st.failed()) return;
    // A stream-ordered work failed (NCCL's asynchronous error): nobody waits
    // on the host to see it, so the watchdog raises it for every rank; the
    // verdict fails the group (GroupState::streamOrdered), which aborts the
    // inner backend and releases every host blocked on its stream.
    auto e = st.ledger().byId(id);
    const std::string shortError = error.substr(0, error.find("\nException raised from"));
    if (!e) {
      const std::string text = "an operation on group \"" + st.label() + "\" failed in the inner backend (rank " +
                               std::to_string(st.id().globalRank(st.id().rank)) + " saw: " + shortError + ")";
      failGroup(st,
                GroupFailure{GuardErrorKind::Failure, text, std::nullopt, Verdict(), Telling{Telling::Who::ThisRank}});
      return;
    }
    if (ctx.polledFailureRaised) continue;
    ctx.polledFailureRaised = true;
    const IncidentSubject subject =
        e->seq ? IncidentSubject::collective(e->seq) : IncidentSubject::p2p(st.id().rank, e->id);
    std::lock_guard<std::mutex> lock(mu_);
    ctx.requests.push_back(Incident{IncidentKind::Failure, subject, st.id().rank, shortError});
  }
}

bool Watchdog::checkStore(GroupCtx& ctx, const Progress& p) {
  GroupState& st = *ctx.state;
  if (st.store().health() == StoreHealth::Healthy) return true;
  if (ctx.storeLossHandled) return false;
  ctx.storeLossHandled = true;
  LocalFacts facts = localFacts(ctx, p);
  const std::string text = formatStoreLost(facts, st.store().channel().describeLoss());
  // The dump first, while the ledger still shows what was pending (failing
  // the group aborts it); the post-mortem then names the store and its host.
  // Not at the end of a job whose other ranks all left (the host exited
  // first): nothing failed there.
  const bool endOfJob = !facts.pending && !facts.lastFailed && facts.allPeersDone();
  if (!st.config().dumpDir.empty() && !st.failed() && !endOfJob && !storeLossDumped_.exchange(true)) {
    writeDump(enumName(DumpCause::StoreLost), st.config().dumpDir, &st);
  }
  // One line per group: the whole report where an op waits on it (or just
  // failed for it); otherwise the first line (the next op raises it in full),
  // and nothing above debug level at the end of a job whose ranks all left.
  Telling tell{Telling::Who::ThisRank, LogLevel::Error, ""};
  if (!facts.pending && !facts.lastFailed) {
    tell.level = endOfJob ? LogLevel::Debug : LogLevel::Warning;
    if (!endOfJob) {
      tell.line = text.substr(0, text.find('\n')) +
                  " (nothing was pending here: the next operation on the group raises StoreLostError)";
    }
  }
  failGroup(st, GroupFailure{GuardErrorKind::StoreLost, text, std::nullopt, Verdict(), tell});
  cv_.notify_all();  // failureReport() waiters
  return false;
}

LocalFacts Watchdog::localFacts(GroupCtx& ctx, const Progress& p) {
  LocalFacts f = localFactsOf(*ctx.state, p);
  std::lock_guard<std::mutex> lock(ctx.peersMu);
  f.peers = ctx.peers;
  return f;
}

LocalFacts Watchdog::localFactsOf(GroupState& st, const Progress& p) {
  LocalFacts f;
  f.groupLabel = st.label();
  f.groupSize = st.id().size;
  f.groupRank = st.id().rank;
  f.globalRanks = st.id().globalRanks;
  f.progress = p;
  f.nowWallNs = wallNs();
  f.nowSteadyNs = steadyNs();
  if (p.hasPending) {
    f.pending = entryView(p.oldestPending);
    f.pendingForNs = f.nowSteadyNs - p.oldestPending.startSteadyNs;
  } else {
    for (const auto& e : st.ledger().entries(1)) {
      if (e.state == EntryState::Failed) f.lastFailed = entryView(e);
    }
  }
  f.storeHostRank = st.store().channel().address().hostRank;
  return f;
}

void Watchdog::checkDeadlines(GroupCtx& ctx, const Progress& p) {
  GroupState& st = *ctx.state;
  if (st.failed()) return;
  DeadlineActions a;
  {
    std::lock_guard<std::mutex> lock(ctx.localMu);
    const int64_t abortNs = std::chrono::duration_cast<std::chrono::nanoseconds>(st.abortAfter()).count();
    const auto awaitedBusy = [&ctx, abortNs](const Entry& e) {
      using Awaited = Deadlines::Awaited;
      const BusyLook& look = ctx.busyLook;
      if (look.seq != e.seq || look.atSteadyNs < e.startSteadyNs + abortNs) return Awaited::Unknown;
      if (steadyNs() - look.atSteadyNs >= kBusyLookFreshNs) return Awaited::NotBusy;  // the looks stopped coming
      return look.waitOn ? Awaited::Busy : Awaited::NotBusy;
    };
    a = ctx.deadlines.check(p, st.id().rank, steadyNs(), awaitedBusy);
  }
  if (a.raise) {
    std::lock_guard<std::mutex> lock(mu_);
    ctx.requests.push_back(*a.raise);
  }
  if (a.busyWaitBegins) {
    ctx.busySeq = a.entry.seq;  // the next looks keep a busy rank busy until kQuietMs
    sayBusyWait(ctx, p, a.entry);
  }
  if (a.localAbort || a.localWarn) {
    const std::string why = st.store().health() == StoreHealth::Healthy
                                ? "no verdict came through the store within " +
                                      std::to_string(ctx.deadlines.fallbackNs() / 1'000'000'000) + " s"
                                : st.store().channel().describeLoss();
    LocalFacts facts = localFacts(ctx, p);
    if (a.localAbort) {
      const std::string text = formatLocalTimeout(facts, std::chrono::duration<double>(st.abortAfter()).count(), why);
      failGroup(st,
                GroupFailure{GuardErrorKind::Timeout, text, std::nullopt, Verdict(), Telling{Telling::Who::ThisRank}});
      cv_.notify_all();
    } else {
      logMessage(LogLevel::Warning, formatLocalHang(facts, why));
    }
  }
}

void Watchdog::exchange(GroupCtx& ctx) {
  GroupState& st = *ctx.state;
  GroupStore& store = st.store();
  const int rank = st.id().rank;
  const int size = st.id().size;
  std::vector<Incident> requests;
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests.swap(ctx.requests);
  }
  for (const auto& inc : requests) post(ctx, inc);
  const Progress p = st.ledger().progress();
  const int64_t now = wallNs();

  // Status / heartbeat, with this rank's collective waits.
  StatusRecord mine = StatusRecord::of(RankPhase::Running, now, p);
  if (const ProgressFacts pf = ProgressSampler::instance().facts(steadyNs()); pf.known) {
    mine.quietMs = pf.busy ? 0 : pf.quietNs / 1'000'000;  // what a collective waiting for this rank reads
  }
  if (st.config().stragglerThreshold > 0 && size > 1) mine.waits = publishedWaits(st);
  // Exiting: the exit's own record ("exited") is written after any exchange
  // already queued; a later one must not turn it back into "running".
  const bool publishes = !mine.sameProgress(ctx.lastPublished) || now - ctx.lastPublishNs > kHeartbeatNs;
  if (publishes && !exiting() && !ctx.exitSaid.load()) {
    if (store.set(keys::status(rank), mine.encode())) {
      ctx.lastPublished = mine;
      ctx.lastPublishNs = now;
    }
  }

  // Ring neighbours: their last known state, and in async mode (in verify
  // mode, while a carried check is pending) the ring check (rolling hashes
  // compared at the lower of the two seqs).
  if (size > 1) {
    std::vector<int> neighbours{(rank + 1) % size};
    if (size > 2) neighbours.push_back((rank + size - 1) % size);
    std::vector<int> readable;
    std::vector<std::string> statusKeys;
    for (int n : neighbours) {
      if (!ctx.seenNeighbours.count(n)) {
        auto there = store.check({keys::status(n)});
        if (!there.ok() || !there.value) continue;
        ctx.seenNeighbours.insert(n);
      }
      readable.push_back(n);
      statusKeys.push_back(keys::status(n));
    }
    if (!statusKeys.empty()) {
      auto values = store.multiGet(statusKeys);
      const int64_t readAt = steadyNs();
      // Whether the ring compares now is the mode's (async always; verify while
      // a collective that carries its check, and so starts no round, is unverified).
      const bool ring = st.mode().comparesInStatusRing() && !st.failed() && p.lastSeq > 0;
      for (size_t i = 0; values.ok() && i < values.value.size(); ++i) {
        auto ns = StatusRecord::decode(values.value[i]);
        if (!ns) continue;
        {
          std::lock_guard<std::mutex> lock(ctx.peersMu);
          ctx.peers[readable[i]] = PeerState{*ns, readAt};
        }
        if (!ring || ns->phase != RankPhase::Running || ns->lastSeq == 0 || ns->lastSeq > p.lastSeq) continue;
        auto at = st.ledger().rollingAt(ns->lastSeq);
        if (at && *at != ns->rolling) {
          post(ctx, Incident{IncidentKind::Mismatch, IncidentSubject::any(), rank, ""});
          break;
        }
      }
    }
  }

  ctx.stragglers.afterExchange(st);
  lookAtAwaited(ctx, p, mine);

  // Incidents.
  ctx.protocol.progress(now);
  ctx.open = ctx.protocol.open();
}

void Watchdog::lookAtAwaited(GroupCtx& ctx, const Progress& p, const StatusRecord& mine) {
  // Past abort_after a collective waits on while every rank it waits for is
  // busy (BusyWait.h): from abort_after on, their records are read (twice a
  // second at most: a large group's store is not flooded by its waiters).
  GroupState& st = *ctx.state;
  const int size = st.id().size;
  const int64_t now = steadyNs();
  if (!p.hasPending || p.oldestPending.seq == 0 || size < 2 || st.failed()) return;
  if (now - p.oldestPending.startSteadyNs < ctx.deadlines.busyLookAfterNs() || now < ctx.nextBusyLookNs) return;
  ctx.nextBusyLookNs = now + kBusyLookEveryNs;
  std::vector<std::string> statusKeys;
  for (int r = 0; r < size; ++r) statusKeys.push_back(keys::status(r));
  auto there = st.store().check(statusKeys);  // multi_get waits for a missing key
  if (!there.ok() || !there.value) return;
  auto values = st.store().multiGet(statusKeys);
  if (!values.ok() || values.value.size() != statusKeys.size()) return;
  std::vector<std::optional<StatusRecord>> records(size);
  for (int r = 0; r < size; ++r) records[r] = StatusRecord::decode(values.value[r]);
  records[st.id().rank] = mine;  // this rank's own, as it is now
  BusyLook look =
      ctx.busyWait.look(records, p.oldestPending.seq, steadyNs(), wallNs(), ctx.busySeq.load() == p.oldestPending.seq);
  std::lock_guard<std::mutex> lock(ctx.localMu);
  ctx.busyLook = std::move(look);
}

void Watchdog::sayBusyWait(GroupCtx& ctx, const Progress& p, const Entry& e) {
  BusyLook look;
  {
    std::lock_guard<std::mutex> lock(ctx.localMu);
    look = ctx.busyLook;
  }
  GroupState& st = *ctx.state;
  if (look.seq != e.seq || look.lowestArrived != st.id().rank) return;  // said once, by the lowest waiting rank
  std::vector<int64_t> busy;
  for (int r : look.busy) busy.push_back(st.id().globalRank(r));
  logMessage(LogLevel::Warning,
             formatBusyWait(localFacts(ctx, p), busy, std::chrono::duration<double>(st.abortAfter()).count(),
                            std::chrono::duration<double>(st.busyCap()).count()));
}

RankSnapshot Watchdog::snapshot(const std::string& reason, const GroupState* only, size_t maxEntries,
                                WithWaitWindows windows) {
  std::vector<std::shared_ptr<GroupState>> states, all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& g : groups_) {
      all.push_back(g->state);
      if (only == nullptr || g->state.get() == only) states.push_back(g->state);
    }
  }
  // Every group's position rides along (a few hundred bytes per group), so
  // the report can follow a rank that has not arrived into the group where it
  // waits, with no store traffic beyond the snapshot itself.
  return takeSnapshot(reason, states, maxEntries, all, windows);
}

std::vector<std::shared_ptr<GroupState>> Watchdog::groupStates() {
  std::vector<std::shared_ptr<GroupState>> all;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& g : groups_) all.push_back(g->state);
  return all;
}

std::vector<GroupWait> Watchdog::positions() {
  std::vector<std::shared_ptr<GroupState>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& g : groups_) all.push_back(g->state);
  }
  std::vector<GroupWait> out;
  out.reserve(all.size());
  for (const auto& st : all) out.push_back(groupWait(*st));
  return out;
}

std::string Watchdog::writeDump(const std::string& reason, const std::string& dirOverride, const GroupState* about) {
  std::string dir = dirOverride;
  std::vector<std::shared_ptr<GroupState>> states;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& g : groups_) {
      states.push_back(g->state);
      if (dir.empty() && !g->state->config().dumpDir.empty()) dir = g->state->config().dumpDir;
    }
  }
  if (dir.empty()) return "";
  // What the dump waits for: the incident's collective in its group, or the
  // oldest pending op of each group concerned (a send/recv, a manual dump).
  const auto inc = Incident::fromId(reason);
  DumpCause cause = DumpCause::Manual;
  for (DumpCause named : {DumpCause::StoreLost, DumpCause::Terminated}) {
    if (reason == enumName(named)) cause = named;
  }
  if (inc) {
    switch (inc->kind) {
      case IncidentKind::Hang:
        cause = DumpCause::WarnAfter;
        break;
      case IncidentKind::Abort:
        cause = DumpCause::AbortAfter;
        break;
      case IncidentKind::Mismatch:
        cause = DumpCause::Mismatch;
        break;
      case IncidentKind::P2P:
        cause = DumpCause::P2PCheck;
        break;
      case IncidentKind::Failure:
        cause = DumpCause::Failure;
        break;
    }
  }
  std::vector<DumpWatch> watches;
  bool failed = false;
  for (const auto& st : states) {
    if (inc && about != nullptr && st.get() != about) continue;
    failed = failed || st->failed();
    DumpWatch w{st};
    const Progress p = st->ledger().progress();
    if (inc && inc->subject.kind == IncidentSubject::Kind::Collective) {
      w.seq = inc->subject.seq;
    } else if (p.hasPending) {
      w.recordId = p.oldestPending.id;
    } else {
      continue;  // nothing waits here
    }
    watches.push_back(std::move(w));
  }
  std::string error;
  const std::string path = dumpFile_.write(dir, takeSnapshot(reason, states, 0, {}, WithWaitWindows::Yes), cause,
                                           std::move(watches), failed, &error);
  if (path.empty() && !dumpWarned_.exchange(true)) {
    logMessage(LogLevel::Warning, "torch_ext: cannot write dumps to TORCH_EXT_DUMP_DIR='" + dir + "' (" + error +
                                      "); training goes on without dump files");
  }
  return path;
}

std::string Watchdog::stragglers(const GroupState* state) {
  auto ctx = find(state);
  return ctx ? ctx->stragglers.latest(*ctx->state) : "";
}

}  // namespace torch_ext
