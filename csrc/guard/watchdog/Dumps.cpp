#include "guard/watchdog/Dumps.h"
#include "guard/Clock.h"

#include "guard/Runtime.h"
#include "guard/collective/CallSite.h"
#include "guard/collective/LabelTable.h"
#include "guard/watchdog/ProgressSampler.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace torch_ext {

std::string hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

namespace {

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

}  // namespace

EntryView entryView(const Entry& e) {
  EntryView v;
  v.id = e.id;
  v.seq = e.seq;
  v.p2pOrdinal = e.p2pOrdinal;
  v.op = e.fp.op;
  v.device = c10::DeviceTypeName(e.fp.device, /*lower_case=*/true);
  v.text = e.fp.describe();
  v.isP2P = ::torch_ext::isP2P(e.fp.op);
  v.peer = e.fp.root;
  v.tag = e.fp.tag;
  v.reduceOp = reduceOpName(e.fp.reduceOp);
  for (const auto& m : e.fp.metas) {
    v.dtypes.push_back(dtypeName(m.dtype));
    v.sizes.emplace_back(m.sizes.begin(), m.sizes.end());
  }
  v.hash = e.fp.hash;
  v.rolling = e.rolling;
  v.pairHash = v.isP2P ? e.fp.p2pPairHash() : 0;
  v.splitSend = e.fp.splitSend;
  v.splitRecv = e.fp.splitRecv;
  v.state = e.state;
  v.startNs = e.startNs;
  v.endNs = e.endNs;
  v.frames = CallSites::instance().frames(e.callSite);
  v.label = LabelTable::instance().get(e.label);
  v.error = e.error;
  return v;
}

GroupView groupView(GroupState& state, size_t maxEntries, WithWaitWindows windows) {
  GroupView g;
  const auto& id = state.id();
  g.name = id.name;
  g.desc = state.label();
  g.rank = id.rank;
  g.size = id.size;
  g.globalRanks = id.globalRanks;
  if (g.globalRanks.empty()) {
    for (int r = 0; r < id.size; ++r) g.globalRanks.push_back(r);
  }
  Progress p = state.ledger().progress();
  g.lastSeq = p.lastSeq;
  g.lastCompletedSeq = p.lastCompletedSeq;
  g.lastCompletedNs = p.lastCompletedNs;
  g.rolling = p.rolling;
  g.timeoutMs = state.abortAfter().count();
  for (const auto& e : state.ledger().entries(maxEntries)) {
    g.entries.push_back(entryView(e));
    if (e.state == EntryState::Scheduled) g.entries.back().streamStarted = state.ledger().streamStarted(e.id);
  }
  if (windows == WithWaitWindows::No) return g;
  g.waitWindows = state.ledger().waitWindows(WaitWindows::kHistory);
  auto& sites = CallSites::instance();
  for (auto& w : g.waitWindows) {
    w.siteKey = sites.stableKey(w.site);  // what the other ranks' windows name the same call site by
    if (w.siteKey != 0 && !g.waitSites.count(w.siteKey)) g.waitSites[w.siteKey] = sites.describe(w.site);
  }
  return g;
}

namespace {

// gloo's send completes only once the peer has posted its receive (its pairs
// send on the receiver's notice: measured on torch 2.13, 1 element to 4 MB
// alike), so a thread blocked in a gloo send cannot finish it alone: two
// pipeline stages that both send first, or a stage that sends while its peer
// waits in a collective, are a certain deadlock (issue 68). Other backends
// (NCCL buffers small sends) keep Fingerprint::mayFinishAlone's answer.
bool sendWaitsForItsReceive(const GroupState& state, const Fingerprint& fp) {
  if (fp.op != Op::Send) return false;
  const auto& inner = state.config().inner;
  auto it = inner.find(c10::DeviceTypeName(fp.device, /*lower_case=*/true));
  return it != inner.end() && it->second == "gloo";
}

}  // namespace

GroupWait groupWait(GroupState& state) {
  GroupWait w;
  const auto& id = state.id();
  w.group = id.name;
  w.label = state.label();
  w.ranks = id.globalRanks;
  if (w.ranks.empty()) {
    for (int r = 0; r < id.size; ++r) w.ranks.push_back(r);
  }
  const Progress p = state.ledger().progress();
  w.lastSeq = p.lastSeq;
  std::optional<Entry> stuck;
  if (p.hasPending) {
    stuck = p.oldestPending;
  } else if (auto f = state.failure(); !(f && f->kind == GuardErrorKind::Mismatch)) {
    // Its last collective failed (abort_after, a peer gone) and it issued none
    // since: that is where it stood, for the dumps written after. Not after a
    // mismatch: that group's ranks went on (the demo's scene 1 is not where its
    // ranks wait in scene 2).
    auto last = state.ledger().entries(1);
    if (!last.empty() && last.back().state == EntryState::Failed) stuck = last.back();
  }
  if (stuck) {
    const Entry& e = *stuck;
    w.pending = true;
    w.seq = e.seq;
    w.op = e.fp.describe();
    w.where = describeCallSite(CallSites::instance().frames(e.callSite));
    w.startNs = e.startNs;
    // Blocked in it now, or until it raised (the dumps written after a
    // verdict ended a deadlock still show the loop as certain).
    // A wait the group's failure ended leaves its op pending where the inner
    // work never completed: where it raised still counts.
    uint64_t blockedIn = state.ledger().blockedIn();
    if (blockedIn == 0) blockedIn = state.ledger().raisedInWait();
    w.blocked =
        blockedIn == e.id && (sendWaitsForItsReceive(state, e.fp) ||
                              !e.fp.mayFinishAlone(id.rank, e.seq != 0 && state.mode().resultsWaitForTheCheck()));
    if (e.seq == 0 && (e.fp.op == Op::Send || e.fp.op == Op::Recv) && e.fp.root >= 0) {
      w.peer = id.globalRank(e.fp.root);
      w.recv = e.fp.op == Op::Recv;
      w.tag = e.fp.tag;
    }
  }
  return w;
}

RankSnapshot takeSnapshot(const std::string& reason, const std::vector<std::shared_ptr<GroupState>>& states,
                          size_t maxEntries, const std::vector<std::shared_ptr<GroupState>>& waitsOf,
                          WithWaitWindows windows) {
  RankSnapshot s;
  s.pid = static_cast<int64_t>(getpid());
  s.hostname = hostname();
  s.software = Runtime::instance().software();
  s.timeNs = wallNs();
  s.incident = reason;
  for (const auto& st : states) {
    s.groups.push_back(groupView(*st, maxEntries ? maxEntries : st->ledger().capacity(), windows));
  }
  for (const auto& st : waitsOf.empty() ? states : waitsOf) s.waits.push_back(groupWait(*st));
  if (!states.empty()) {
    s.rank = states.front()->id().globalRank(states.front()->id().rank);
    s.config = states.front()->config().describe();
    // Every group of a process shares one store: its host, and its loss once lost.
    StoreChannel& channel = states.front()->store().channel();
    s.storeHostRank = channel.address().hostRank;
    s.storeHealth = channel.health();
    if (s.storeHealth != StoreHealth::Healthy) s.storeLost = channel.describeLoss();
  }
  s.main = Runtime::instance().mainThreadStack(std::chrono::milliseconds(300));
  s.progress = ProgressSampler::instance().now(steadyNs());
  return s;
}

std::string writeDumpFile(const std::string& dir, const RankSnapshot& snap, std::string* error) {
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
    *error = std::strerror(errno);
    return "";
  }
  return path;
}

namespace {

// Whether `w`'s group went past what the dump waited in; nullopt when the
// group is gone (it cannot be told any more).
std::optional<bool> pastIt(const DumpWatch& w, bool* failed) {
  auto g = w.group.lock();
  if (!g) return std::nullopt;
  if (g->failed()) *failed = true;
  const Progress p = g->ledger().progress();
  const bool seqDone = w.seq == 0 || p.lastCompletedSeq >= w.seq;
  const bool recordDone = w.recordId == 0 || !p.hasPending || p.oldestPending.id > w.recordId;
  return seqDone && recordDone;
}

}  // namespace

std::string DumpFile::write(const std::string& dir, RankSnapshot snap, DumpCause cause, std::vector<DumpWatch> watches,
                            bool failed, std::string* error) {
  DumpStatus st;
  st.cause = cause;
  st.stateNs = snap.timeNs;
  for (const auto& w : watches) {
    if (auto g = w.group.lock()) st.awaited.push_back(DumpAwaited{g->id().name, w.seq, w.recordId});
  }
  const bool failure = failed || cause == DumpCause::AbortAfter || cause == DumpCause::Mismatch ||
                       cause == DumpCause::Failure || cause == DumpCause::StoreLost || cause == DumpCause::Terminated;
  st.state = failure ? DumpState::Failed : (watches.empty() ? DumpState::Running : DumpState::Waiting);
  snap.status = std::move(st);
  std::lock_guard<std::mutex> lock(mu_);
  // The first failure is the story: what follows it (a peer gone after it
  // raised, an in-flight collective's inner failure, the store's host gone)
  // is its consequence, and would show the ranks after their waits ended (a
  // CI run's post-mortem of a deadlock read the failure a peer's exit caused).
  // Only an asked-for dump (live signal, torch_ext.dump) replaces it.
  if (have_ && cause != DumpCause::Manual) {
    evaluateLocked();
    if (snap_.status->state == DumpState::Failed) return dir_ + "/rank" + std::to_string(snap_.rank) + ".json";
  }
  const std::string path = writeDumpFile(dir, snap, error);
  if (path.empty()) return path;
  have_ = true;
  dir_ = dir;
  waiting_ = snap.status->state == DumpState::Waiting;
  snap_ = std::move(snap);
  watches_ = std::move(watches);
  return path;
}

void DumpFile::update() {
  if (!waiting_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mu_);
  evaluateLocked();
}

void DumpFile::evaluateLocked() {
  if (!have_ || snap_.status->state != DumpState::Waiting) return;
  bool failed = false, all = true;
  for (const auto& w : watches_) {
    const auto past = pastIt(w, &failed);
    all = all && past.value_or(false);
  }
  if (failed) {
    rewriteLocked(DumpState::Failed, wallNs());
  } else if (all) {
    const int64_t now = wallNs();
    snap_.status->recoveredNs = now;
    rewriteLocked(DumpState::Recovered, now);
  }
}

void DumpFile::finish() {
  update();
  std::lock_guard<std::mutex> lock(mu_);
  if (!have_) return;
  const DumpState s = snap_.status->state;
  if (s == DumpState::Recovered || s == DumpState::Running) rewriteLocked(DumpState::Finished, wallNs());
}

void DumpFile::rewriteLocked(DumpState state, int64_t nowNs) {
  snap_.status->state = state;
  snap_.status->stateNs = nowNs;
  waiting_ = state == DumpState::Waiting;
  std::string error;
  if (writeDumpFile(dir_, snap_, &error).empty()) {
    logMessage(LogLevel::Debug,
               "torch_ext: cannot mark the dump in '" + dir_ + "' " + enumName(state) + " (" + error + ")");
  }
}

}  // namespace torch_ext
