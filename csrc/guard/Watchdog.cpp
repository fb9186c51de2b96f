#include "guard/Watchdog.h"

#include "guard/Runtime.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

namespace torch_ext {

namespace {

constexpr const char* kPrefix = "guard/";
// How long an analyst waits for snapshots before it calls silent ranks gone,
// and how long others wait for its verdict before analysing themselves.
constexpr int64_t kMinSnapWaitNs = 1'000'000'000;
constexpr int64_t kMinReportWaitNs = 3'000'000'000;
constexpr size_t kHangWindow = 64;

std::string key(const std::string& k) {
  return kPrefix + k;
}

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string str(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

struct Status {
  bool valid = false;
  bool left = false;  // "left <hb> <lastSeq>": the rank destroyed the group
  int64_t hbNs = 0;
  uint64_t lastSeq = 0;
  uint64_t rolling = 0;
};

std::string formatStatus(int64_t hbNs, const Progress& p) {
  std::ostringstream os;
  os << "v1 " << hbNs << " " << p.lastSeq << " " << hex64(p.rolling) << " " << p.lastCompletedSeq;
  return os.str();
}

Status parseStatus(const std::string& s) {
  Status st;
  std::istringstream is(s);
  std::string tag;
  is >> tag;
  if (tag == "left") {
    st.left = true;
    is >> st.hbNs >> st.lastSeq;
    st.valid = true;
    return st;
  }
  if (tag != "v1") return st;
  std::string rolling;
  is >> st.hbNs >> st.lastSeq >> rolling;
  if (!is) return st;
  try {
    st.rolling = parseHex64(rolling, "status rolling hash");
  } catch (const JsonError&) {
    return st;
  }
  st.valid = true;
  return st;
}

std::string hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

bool makeDirs(const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

} // namespace

Watchdog& Watchdog::instance() {
  // Leaked: the thread may outlive static destruction at exit.
  static auto* dog = new Watchdog();
  return *dog;
}

void Watchdog::announce(c10d::Store& store, int rank) {
  store.set(key("st/" + std::to_string(rank)), bytes(formatStatus(wallNs(), Progress{})));
}

void Watchdog::add(const std::shared_ptr<GroupState>& state) {
  auto ctx = std::make_shared<GroupCtx>();
  ctx->state = state;
  std::lock_guard<std::mutex> lock(mu_);
  groups_.push_back(ctx);
  if (!thread_.joinable() && !exiting_) {
    stop_ = false;
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "torch_ext_watch");
      loop();
    });
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
  if (toJoin.joinable()) {
    toJoin.join();
    Runtime::instance().idle();
  }
  if (ctx) {
    std::lock_guard<std::mutex> busy(ctx->busy);
    ctx->removed = true;
    leaveGroup(*ctx);
  }
}

void Watchdog::leaveGroup(GroupCtx& ctx) {
  // Incident keys stay until every rank has left, so a rank that leaves early
  // (after acting on a verdict) cannot take the verdict away from the others.
  // Their names are derived from the alert counter, so the last rank to leave
  // can remove them all.
  GroupState& st = *ctx.state;
  const int size = st.id().size;
  sset(st, "st/" + std::to_string(st.id().rank),
       "left " + std::to_string(wallNs()) + " " + std::to_string(st.ledger().progress().lastSeq));
  try {
    c10d::Store& store = *st.store();
    if (store.add(key("leave"), 1) < size) return;
    const int64_t alerts = store.add(key("alerts"), 0);
    std::vector<std::string> keys;
    for (int64_t k = 1; k <= alerts; ++k) {
      const std::string alert = key("alert/" + std::to_string(k));
      if (!store.check({alert})) continue;
      std::string desc = str(store.get(alert));
      std::string iid = desc.substr(0, desc.find('\n'));
      keys.push_back(alert);
      keys.push_back(key("once/" + iid));
      keys.push_back(key("report/" + iid));
      for (int r = 0; r < size; ++r) keys.push_back(key("snap/" + iid + "/" + std::to_string(r)));
    }
    for (int r = 0; r < size; ++r) keys.push_back(key("st/" + std::to_string(r)));
    keys.push_back(key("alerts"));
    keys.push_back(key("leave"));
    for (const auto& k : keys) store.deleteKey(k);
    storeOps_ += keys.size() + 2 * alerts + 2;
  } catch (const std::exception&) {
    // The store may already be gone at exit.
  }
}

void Watchdog::stopThread() {
  std::thread toJoin;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable() || std::this_thread::get_id() == threadId_) return;
    stop_ = true;
    exiting_ = true;
    toJoin = std::move(thread_);
  }
  cv_.notify_all();
  toJoin.join();
}

Watchdog::Stats Watchdog::stats() const {
  Stats s;
  s.ticks = ticks_.load();
  s.storeOps = storeOps_.load();
  s.incidents = incidents_.load();
  std::lock_guard<std::mutex> lock(mu_);
  s.groups = groups_.size();
  s.running = thread_.joinable();
  return s;
}

bool Watchdog::sset(GroupState& st, const std::string& k, const std::string& value) {
  try {
    st.store()->set(key(k), bytes(value));
    ++storeOps_;
    return true;
  } catch (const std::exception& e) {
    logMessage(LogLevel::Debug, std::string("guard watchdog: store set failed: ") + e.what());
    return false;
  }
}

bool Watchdog::scheck(GroupState& st, const std::string& k) {
  try {
    ++storeOps_;
    return st.store()->check({key(k)});
  } catch (const std::exception&) {
    return false;
  }
}

std::optional<std::string> Watchdog::sget(GroupState& st, const std::string& k) {
  if (!scheck(st, k)) return std::nullopt;
  try {
    ++storeOps_;
    return str(st.store()->get(key(k)));
  } catch (const std::exception&) {
    return std::nullopt;
  }
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
      if (busy) intervalNs = std::min<int64_t>(intervalNs, 50'000'000);
      cv_.wait_for(lock, std::chrono::nanoseconds(intervalNs), [this] { return stop_ || wake_; });
      wake_ = false;
      if (stop_) return;
      groups = groups_;
    }
    ++ticks_;
    for (auto& g : groups) {
      std::lock_guard<std::mutex> busy(g->busy);
      if (g->removed) continue;
      try {
        tick(*g);
      } catch (const std::exception& e) {
        logMessage(LogLevel::Debug, std::string("guard watchdog: tick failed: ") + e.what());
      }
    }
  }
}

void Watchdog::tick(GroupCtx& ctx) {
  GroupState& st = *ctx.state;
  const auto& id = st.id();
  const int rank = id.rank;
  const int size = id.size;
  const auto& cfg = st.config();

  std::vector<Incident> requests;
  {
    std::lock_guard<std::mutex> lock(mu_);
    requests.swap(ctx.requests);
  }
  for (const auto& inc : requests) post(ctx, inc);

  st.ledger().pollCompletions();
  Progress p = st.ledger().progress();
  const int64_t now = wallNs();

  // 1. Status / heartbeat.
  std::string status = formatStatus(now, p);
  std::string body = status.substr(status.find(' ', 3));
  if (body != ctx.lastStatus || now - ctx.lastPublishNs > 500'000'000) {
    if (sset(st, "st/" + std::to_string(rank), status)) {
      ctx.lastStatus = body;
      ctx.lastPublishNs = now;
    }
  }

  // 2. Ring check: compare rolling hashes with both neighbours at the lower seq.
  if (cfg.check == CheckMode::Async && size > 1 && !st.failed() && p.lastSeq > 0) {
    std::vector<int> neighbours{(rank + 1) % size};
    if (size > 2) neighbours.push_back((rank + size - 1) % size);
    std::vector<std::string> keys;
    for (int n : neighbours) {
      std::string k = "st/" + std::to_string(n);
      if (!ctx.seenNeighbours.count(n)) {
        if (!scheck(st, k)) continue;
        ctx.seenNeighbours.insert(n);
      }
      keys.push_back(key(k));
    }
    if (!keys.empty()) {
      std::vector<std::vector<uint8_t>> values;
      try {
        ++storeOps_;
        values = st.store()->multiGet(keys);
      } catch (const std::exception&) {
      }
      for (const auto& v : values) {
        Status ns = parseStatus(str(v));
        if (!ns.valid || ns.left || ns.lastSeq == 0 || ns.lastSeq > p.lastSeq) continue;
        auto mine = st.ledger().rollingAt(ns.lastSeq);
        if (mine && *mine != ns.rolling) {
          post(ctx, Incident{"mismatch", "any", rank, ""});
          break;
        }
      }
    }
  }

  // 3. Deadlines of the oldest pending operation.
  if (p.hasPending && !st.failed()) {
    const Entry& e = p.oldestPending;
    const int64_t age = steadyNs() - e.startSteadyNs;
    const std::string subject =
        e.seq ? std::to_string(e.seq) : "p2p-" + std::to_string(rank) + "-" + std::to_string(e.id);
    const int64_t abortNs = std::chrono::duration_cast<std::chrono::nanoseconds>(st.abortAfter()).count();
    const int64_t warnNs = std::chrono::duration_cast<std::chrono::nanoseconds>(st.warnAfter()).count();
    if (age > abortNs && ctx.abortedId != e.id) {
      ctx.abortedId = e.id;
      post(ctx, Incident{"abort", subject, rank, ""});
    } else if (age > warnNs && ctx.warnedId != e.id) {
      ctx.warnedId = e.id;
      post(ctx, Incident{"hang", subject, rank, ""});
    }
    const int64_t p2pCheckNs = std::max<int64_t>(1'000'000'000, static_cast<int64_t>(5 * cfg.intervalS * 1e9));
    if (e.seq == 0 && cfg.check != CheckMode::Off && age > p2pCheckNs && ctx.p2pCheckedId != e.id) {
      ctx.p2pCheckedId = e.id;
      post(ctx, Incident{"p2p", subject, rank, ""});
    }
  }

  // 4. Incidents.
  pollAlerts(ctx);
  progressAwaiting(ctx);
  ctx.open = !ctx.awaiting.empty();
}

void Watchdog::post(GroupCtx& ctx, const Incident& inc) {
  GroupState& st = *ctx.state;
  const std::string iid = inc.id();
  if (!ctx.posted.insert(iid).second) return;
  const std::string me = std::to_string(st.id().rank);
  const std::string onceKey = key("once/" + iid);
  try {
    ++storeOps_;
    auto cur = str(st.store()->compareSet(onceKey, {}, bytes(me)));
    if (cur != me) return;  // another rank raised it first; we join via the alert
    ++storeOps_;
    int64_t k = st.store()->add(key("alerts"), 1);
    std::string desc = iid + "\n" + me + "\n" + inc.error;
    sset(st, "alert/" + std::to_string(k), desc);
    ++incidents_;
  } catch (const std::exception& e) {
    logMessage(LogLevel::Warning, std::string("guard watchdog: could not raise incident ") + iid + ": " + e.what());
  }
}

void Watchdog::pollAlerts(GroupCtx& ctx) {
  GroupState& st = *ctx.state;
  int64_t n = 0;
  try {
    ++storeOps_;
    n = st.store()->add(key("alerts"), 0);
  } catch (const std::exception&) {
    return;
  }
  while (ctx.alertsSeen < static_cast<uint64_t>(n)) {
    auto desc = sget(st, "alert/" + std::to_string(ctx.alertsSeen + 1));
    if (!desc) return;  // raised but not written yet: next tick
    ++ctx.alertsSeen;
    Incident inc;
    std::string iid;
    auto nl1 = desc->find('\n');
    auto nl2 = nl1 == std::string::npos ? std::string::npos : desc->find('\n', nl1 + 1);
    if (nl2 == std::string::npos) continue;
    iid = desc->substr(0, nl1);
    inc.poster = std::atoll(desc->substr(nl1 + 1, nl2 - nl1 - 1).c_str());
    inc.error = desc->substr(nl2 + 1);
    auto colon = iid.find(':');
    if (colon == std::string::npos) continue;
    inc.kind = iid.substr(0, colon);
    inc.subject = iid.substr(colon + 1);
    if (!ctx.handled.insert(iid).second) continue;
    respond(ctx, inc);
    Awaiting a;
    a.incident = inc;
    const int64_t now = wallNs();
    const int64_t tickNs = static_cast<int64_t>(st.config().intervalS * 1e9);
    a.snapDeadlineNs = now + std::max<int64_t>(kMinSnapWaitNs, 4 * tickNs);
    a.reportDeadlineNs = now + std::max<int64_t>(kMinReportWaitNs, 12 * tickNs);
    a.analyst = inc.poster == st.id().rank;
    ctx.awaiting.push_back(a);
  }
}

void Watchdog::respond(GroupCtx& ctx, const Incident& inc) {
  GroupState& st = *ctx.state;
  const size_t window = inc.kind == "mismatch" ? st.ledger().capacity() : kHangWindow;
  RankSnapshot snap = snapshot(inc.id(), &st, window);
  sset(st, "snap/" + inc.id() + "/" + std::to_string(st.id().rank), toJson(snap).dump());
  writeDump(inc.id());
}

void Watchdog::progressAwaiting(GroupCtx& ctx) {
  GroupState& st = *ctx.state;
  const int64_t now = wallNs();
  for (auto it = ctx.awaiting.begin(); it != ctx.awaiting.end();) {
    bool done = false;
    // A published verdict wins, also for the rank that raised the incident.
    if (auto report = sget(st, "report/" + it->incident.id())) {
      try {
        act(ctx, it->incident, Verdict::fromJson(Json::parse(*report)));
      } catch (const std::exception& e) {
        logMessage(LogLevel::Warning, std::string("guard watchdog: unreadable report: ") + e.what());
      }
      done = true;
    } else if (it->analyst) {
      done = tryAnalyse(ctx, *it, now > it->snapDeadlineNs);
    } else if (now > it->reportDeadlineNs) {
      // The analyst did not publish in time (gone?): analyse ourselves.
      it->analyst = true;
      it->snapDeadlineNs = now;
      done = tryAnalyse(ctx, *it, true);
    }
    it = done ? ctx.awaiting.erase(it) : it + 1;
  }
}

bool Watchdog::tryAnalyse(GroupCtx& ctx, const Awaiting& a, bool force) {
  GroupState& st = *ctx.state;
  const auto& id = st.id();
  const std::string iid = a.incident.id();
  std::vector<bool> present(id.size, false);
  bool all = true;
  for (int r = 0; r < id.size; ++r) {
    present[r] = scheck(st, "snap/" + iid + "/" + std::to_string(r));
    all = all && present[r];
  }
  if (!all && !force) return false;
  std::vector<RankInput> inputs(id.size);
  for (int r = 0; r < id.size; ++r) {
    RankInput& in = inputs[r];
    in.groupRank = r;
    in.globalRank = id.globalRank(r);
    in.groupName = id.name;
    if (present[r]) {
      if (auto text = sget(st, "snap/" + iid + "/" + std::to_string(r))) {
        try {
          in.snapshot = snapshotFromJson(Json::parse(*text));
          in.responded = true;
        } catch (const std::exception& e) {
          logMessage(LogLevel::Warning, "guard watchdog: bad snapshot from rank " + std::to_string(r) + ": " + e.what());
        }
      }
    }
    if (!in.responded) {
      if (auto s = sget(st, "st/" + std::to_string(r))) {
        Status status = parseStatus(*s);
        in.heartbeatNs = status.hbNs;
        in.left = status.left;
        in.leftAfterSeq = status.lastSeq;
      }
    }
  }
  Verdict v = analyze(st.label(), inputs, a.incident, wallNs());
  sset(st, "report/" + iid, v.toJson().dump());
  act(ctx, a.incident, v);
  return true;
}

void Watchdog::act(GroupCtx& ctx, const Incident& inc, const Verdict& v) {
  GroupState& st = *ctx.state;
  const bool reporter = st.id().globalRank(st.id().rank) == v.reporter;
  std::string text = v.text;
  auto abortText = [&](const std::string& body) {
    // The first line says "timeout" in so many words: retry logic (and torch's
    // own tests) grep for it in gloo's and NCCL's messages.
    std::ostringstream why;
    why << "timeout after abort_after=" << std::chrono::duration<double>(st.abortAfter()).count()
        << " s (TORCH_EXT_ABORT_AFTER), the collective fails on every live rank";
    const auto nl = body.find('\n');
    std::string first = body.substr(0, nl);
    const std::string rest = nl == std::string::npos ? "" : body.substr(nl);
    if (!first.empty() && first.back() == ':') {
      first.pop_back();
      return first + " (" + why.str() + "):" + rest;
    }
    return first + ": " + why.str() + rest;
  };
  switch (v.kind) {
    case Verdict::Kind::Mismatch:
      if (st.config().check != CheckMode::Off) {
        if (reporter) logMessage(LogLevel::Error, text);
        st.fail(GuardErrorKind::Mismatch, text);
      } else if (inc.kind == "abort") {
        // Checks are off, but the deadline is not: abort, saying what differs.
        text = abortText(text);
        if (reporter) logMessage(LogLevel::Error, text);
        st.fail(GuardErrorKind::Timeout, text);
      } else if (reporter) {
        logMessage(LogLevel::Warning, text);  // checks are off: say what is wrong, fail nothing
      }
      break;
    case Verdict::Kind::Hang:
      if (inc.kind == "abort") {
        text = abortText(text);
        if (reporter) logMessage(LogLevel::Error, text);
        st.fail(GuardErrorKind::Timeout, text);
      } else if (reporter) {
        logMessage(LogLevel::Warning, text);
      }
      break;
    case Verdict::Kind::Failure: {
      if (reporter) logMessage(LogLevel::Error, text);
      // With a rank gone the group cannot recover: fail it on every rank, so
      // ranks that have not reached the collective yet fail fast too.
      const Json* gone = v.json.get("gone");
      if (gone != nullptr && gone->isArray() && !gone->asArray().empty()) st.fail(GuardErrorKind::Failure, text);
      break;
    }
    case Verdict::Kind::None:
      logMessage(LogLevel::Debug, text);
      break;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    results_[st.id().name + "/" + inc.id()] = text;
  }
  cv_.notify_all();
}

bool Watchdog::publishVerdict(const std::shared_ptr<GroupState>& state, const Incident& inc, const Verdict& verdict) {
  GroupState& st = *state;
  const std::string iid = inc.id();
  const std::string me = std::to_string(st.id().rank);
  try {
    ++storeOps_;
    if (str(st.store()->compareSet(key("once/" + iid), {}, bytes(me))) != me) return false;
    sset(st, "report/" + iid, verdict.toJson().dump());
    ++storeOps_;
    const int64_t k = st.store()->add(key("alerts"), 1);
    sset(st, "alert/" + std::to_string(k), iid + "\n" + me + "\n");
    ++incidents_;
    return true;
  } catch (const std::exception& e) {
    logMessage(LogLevel::Warning, "guard: could not publish " + iid + ": " + e.what());
    return false;
  }
}

void Watchdog::requestIncident(const std::shared_ptr<GroupState>& state, const Incident& inc) {
  auto ctx = find(state.get());
  if (!ctx) return;
  std::lock_guard<std::mutex> lock(mu_);
  ctx->requests.push_back(inc);
  wake_ = true;
  cv_.notify_all();
}

std::string Watchdog::failureReport(const std::shared_ptr<GroupState>& state, uint64_t entryId,
                                    const std::string& error) {
  auto ctx = find(state.get());
  std::string subject;
  std::string opText = "operation";
  for (const auto& e : state->ledger().entriesAfter(entryId ? entryId - 1 : 0, 1)) {
    if (e.id != entryId) continue;
    subject = e.seq ? std::to_string(e.seq) : "p2p-" + std::to_string(state->id().rank) + "-" + std::to_string(e.id);
    opText = e.seq ? "collective #" + std::to_string(e.seq) + " " + e.fp.describe() : e.fp.describe();
  }
  // Inner errors carry a C++ backtrace after this marker: keep the message only.
  std::string shortError = error.substr(0, error.find("\nException raised from"));
  std::string fallback = opText + " on group \"" + state->label() + "\" failed in the inner backend (rank " +
                         std::to_string(state->id().globalRank(state->id().rank)) + " saw: " + shortError + ")";
  if (!ctx || subject.empty()) return fallback + "\n  (no cross-rank report: the group is not watched)";
  Incident inc{"failure", subject, state->id().rank, shortError};
  const std::string resultKey = state->id().name + "/" + inc.id();
  const auto budget = std::chrono::milliseconds(
      std::max<int64_t>(5000, static_cast<int64_t>(25 * state->config().intervalS * 1000)));
  std::unique_lock<std::mutex> lock(mu_);
  if (!results_.count(resultKey)) {
    ctx->requests.push_back(inc);
    wake_ = true;
    cv_.notify_all();
    // Another incident (e.g. a mismatch verdict) may fail the group first: its
    // report explains this failure better than a lost connection does.
    cv_.wait_for(lock, budget,
                 [&] { return results_.count(resultKey) > 0 || !thread_.joinable() || state->failed(); });
  }
  auto it = results_.find(resultKey);
  if (it == results_.end()) {
    if (state->failed()) return fallback;  // the group's own failure wins; this text is unused
    return fallback + "\n  (no cross-rank report within the time limit)";
  }
  // The verdict's first line speaks for the rank that raised the incident; put
  // this rank's own op and error first, then the cross-rank lines.
  const std::string& verdict = it->second;
  auto nl = verdict.find('\n');
  return nl == std::string::npos ? fallback : fallback + verdict.substr(nl);
}

std::vector<RankOp> Watchdog::exchangeStrictFingerprints(const std::shared_ptr<GroupState>& state,
                                                         const Fingerprint& fp, uint64_t seq, uint32_t callSite) {
  GroupState& st = *state;
  const auto& id = st.id();
  const std::string base = "strict/" + std::to_string(seq) + "/";
  Json mine = Json::object();
  mine.set("text", fp.describe());
  mine.set("where", CallSites::instance().describe(callSite));
  mine.set("hash", hex64(fp.hash));
  st.store()->set(key(base + std::to_string(id.rank)), bytes(mine.dump()));
  std::vector<std::string> keys;
  for (int r = 0; r < id.size; ++r) keys.push_back(key(base + std::to_string(r)));
  // Every rank took part in the check collective, so every rank writes its key.
  st.store()->wait(keys, std::max(st.timeout(), std::chrono::milliseconds(30000)));
  auto values = st.store()->multiGet(keys);
  std::vector<RankOp> ops;
  for (int r = 0; r < id.size; ++r) {
    RankOp op;
    op.globalRank = id.globalRank(r);
    try {
      Json j = Json::parse(str(values[r]));
      op.text = j.at("text").asString();
      op.where = j.at("where").asString();
      op.hash = parseHex64(j.at("hash").asString(), "hash");
    } catch (const std::exception& e) {
      op.text = std::string("(unreadable fingerprint: ") + e.what() + ")";
    }
    ops.push_back(std::move(op));
  }
  if (st.store()->add(key(base + "done"), 1) >= id.size) {
    for (const auto& k : keys) st.store()->deleteKey(k);
    st.store()->deleteKey(key(base + "done"));
  }
  return ops;
}

RankSnapshot Watchdog::snapshot(const std::string& reason, const GroupState* only, size_t maxEntries) {
  RankSnapshot s;
  s.pid = static_cast<int64_t>(getpid());
  s.hostname = hostname();
  s.timeNs = wallNs();
  s.incident = reason;
  std::vector<std::shared_ptr<GroupState>> states;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& g : groups_) {
      if (only == nullptr || g->state.get() == only) states.push_back(g->state);
    }
  }
  for (auto& st : states) {
    s.groups.push_back(GroupView::from(*st, maxEntries ? maxEntries : st->ledger().capacity()));
  }
  if (!states.empty()) {
    s.rank = states.front()->id().globalRank(states.front()->id().rank);
    s.config = states.front()->config().describe();
  }
  s.main = Runtime::instance().mainThreadStack(std::chrono::milliseconds(300));
  return s;
}

std::string Watchdog::writeDump(const std::string& reason, const std::string& dirOverride) {
  std::string dir = dirOverride;
  if (dir.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& g : groups_) {
      if (!g->state->config().dumpDir.empty()) {
        dir = g->state->config().dumpDir;
        break;
      }
    }
  }
  if (dir.empty()) return "";
  RankSnapshot snap = snapshot(reason);
  const std::string path = dir + "/rank" + std::to_string(snap.rank) + ".json";
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  bool ok = makeDirs(dir);
  if (ok) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << toJson(snap).dump() << "\n";
    out.close();
    ok = out.good() && std::rename(tmp.c_str(), path.c_str()) == 0;
    if (!ok) std::remove(tmp.c_str());
  }
  if (!ok) {
    if (!dumpWarned_.exchange(true)) {
      logMessage(LogLevel::Warning, "torch_ext: cannot write dumps to TORCH_EXT_DUMP_DIR='" + dir + "' (" +
                                        std::strerror(errno) + "); training goes on without dump files");
    }
    return "";
  }
  return path;
}

} // namespace torch_ext
