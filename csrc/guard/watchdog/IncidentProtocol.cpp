#include "guard/watchdog/IncidentProtocol.h"
#include "guard/Clock.h"

#include "guard/store/StoreKeys.h"
#include "guard/Runtime.h"

#include <algorithm>
#include <cstdlib>

namespace torch_ext {

namespace {

// How long an analyst waits for snapshots before it calls silent ranks gone,
// and how long others wait for its verdict before analysing themselves.
constexpr int64_t kMinSnapWaitNs = 1'000'000'000;
constexpr int64_t kMinReportWaitNs = 3'000'000'000;
// Following waits out of the group: at most this many steps away, and this
// many ranks' positions read per analysis.
constexpr int kFollowSteps = 8;
constexpr size_t kMaxFollowed = 32;
// Groups larger than this do not hold their analysis back for positions from
// outside (each retry reads every snapshot again): they go with what is there.
constexpr int kMaxHoldBackSize = 256;

int64_t ticksNs(double intervalS, int n) {
  return static_cast<int64_t>(n * intervalS * 1e9);
}

}  // namespace

int64_t IncidentProtocol::snapWaitNs(double intervalS) {
  return std::max<int64_t>(kMinSnapWaitNs, ticksNs(intervalS, 4));
}

int64_t IncidentProtocol::reportWaitNs(double intervalS) {
  return std::max<int64_t>(kMinReportWaitNs, ticksNs(intervalS, 12));
}

IncidentProtocol::IncidentProtocol(GroupState& state, Hooks hooks) : st_(state), hooks_(std::move(hooks)) {}

bool IncidentProtocol::post(const Incident& inc, bool* storeFailed) {
  const std::string iid = inc.id();
  if (!posted_.insert(iid).second) return false;
  GroupStore& store = st_.store();
  const std::string me = std::to_string(st_.id().rank);
  auto won = store.compareSet(keys::once(iid), "", me);
  if (!won.ok()) {
    posted_.erase(iid);  // try again once the store answers (it may not)
    if (storeFailed) *storeFailed = true;
    return false;
  }
  if (won.value != me) return false;  // another rank raised it first; we join via the alert
  auto k = store.add(keys::kAlerts, 1);
  const bool ok = k.ok() && store.set(keys::alert(k.value), keys::AlertRecord{iid, st_.id().rank, inc.error}.encode());
  if (!ok && storeFailed) *storeFailed = true;
  return ok;
}

bool IncidentProtocol::publishVerdict(const Incident& inc, const Verdict& verdict) {
  const std::string iid = inc.id();
  GroupStore& store = st_.store();
  const std::string me = std::to_string(st_.id().rank);
  auto won = store.compareSet(keys::once(iid), "", me);
  if (!won.ok() || won.value != me) return false;
  posted_.insert(iid);
  if (!store.set(keys::report(iid), verdict.toJson().dump())) return false;
  auto k = store.add(keys::kAlerts, 1);
  return k.ok() && store.set(keys::alert(k.value), keys::AlertRecord{iid, st_.id().rank, ""}.encode());
}

void IncidentProtocol::progress(int64_t nowNs) {
  pollAlerts(nowNs);
  for (auto it = awaiting_.begin(); it != awaiting_.end();) {
    bool done = false;
    // A published verdict wins, also for the rank that raised the incident.
    if (auto report = st_.store().get(keys::report(it->incident.id()))) {
      try {
        hooks_.act(it->incident, Verdict::fromJson(Json::parse(*report)));
      } catch (const std::exception& e) {
        logMessage(LogLevel::Warning, std::string("guard watchdog: unreadable report: ") + e.what());
      }
      done = true;
    } else if (st_.store().health() != StoreHealth::Healthy) {
      break;  // nothing more to learn here; the watchdog fails the group
    } else if (it->analyst) {
      done = tryAnalyse(*it, nowNs > it->snapDeadlineNs, nowNs);
    } else if (nowNs > it->reportDeadlineNs) {
      // The analyst did not publish in time (gone?): analyse ourselves.
      it->analyst = true;
      it->snapDeadlineNs = nowNs;
      done = tryAnalyse(*it, true, nowNs);
    }
    it = done ? awaiting_.erase(it) : it + 1;
  }
}

std::vector<Incident> IncidentProtocol::openIncidents() const {
  std::vector<Incident> out;
  for (const auto& a : awaiting_) out.push_back(a.incident);
  return out;
}

void IncidentProtocol::readRefusals() {
  GroupStore& store = st_.store();
  auto n = store.add(keys::kAlerts, 0);
  if (!n.ok()) return;
  for (uint64_t k = alertsSeen_ + 1; k <= static_cast<uint64_t>(n.value); ++k) {
    auto desc = store.get(keys::alert(k));
    const auto alert = desc ? keys::AlertRecord::decode(*desc) : std::nullopt;
    if (!alert || alert->id != keys::kJoinRefused) continue;
    store.add(keys::kJoinSeen, 1);
    if (hooks_.refused) hooks_.refused(alert->body);
    return;
  }
}

void IncidentProtocol::pollAlerts(int64_t nowNs) {
  GroupStore& store = st_.store();
  auto n = store.add(keys::kAlerts, 0);
  if (!n.ok()) return;
  while (alertsSeen_ < static_cast<uint64_t>(n.value)) {
    auto desc = store.get(keys::alert(alertsSeen_ + 1));
    if (!desc) return;  // raised but not written yet: next tick
    ++alertsSeen_;
    const auto alert = keys::AlertRecord::decode(*desc);
    if (!alert) continue;
    const std::string& iid = alert->id;
    if (keys::isLiveRequest(iid)) {
      // Answered at once (a snapshot costs no store call but its set); nothing to await.
      if (hooks_.live && keys::specAsks(alert->body, st_.id().globalRank(st_.id().rank))) {
        store.set(keys::snapshot(iid, st_.id().rank), hooks_.live(iid));
        ++liveAnswered_;
      }
      continue;
    }
    if (iid == keys::kJoinRefused) {
      store.add(keys::kJoinSeen, 1);
      if (hooks_.refused) hooks_.refused(alert->body);
      continue;
    }
    auto inc = Incident::fromId(iid);
    if (!inc) continue;
    inc->poster = alert->poster;
    inc->error = alert->body;
    if (!handled_.insert(iid).second) continue;
    respond(*inc);
    Awaiting a;
    a.incident = *inc;
    const double interval = st_.exchangeIntervalS();
    a.snapDeadlineNs = nowNs + snapWaitNs(interval);
    a.reportDeadlineNs = nowNs + reportWaitNs(interval);
    a.analyst = inc->poster == st_.id().rank;
    awaiting_.push_back(a);
  }
}

void IncidentProtocol::respond(const Incident& inc) {
  st_.store().set(keys::snapshot(inc.id(), st_.id().rank), hooks_.snapshot(inc));
  GroupStore* job = st_.jobStore();
  if (job != nullptr && hooks_.positions) {
    const PublishedWaits mine{wallNs(), hooks_.positions()};
    job->set(keys::waits(st_.id().globalRank(st_.id().rank)), encodePublishedWaits(mine));
  }
}

bool IncidentProtocol::followOutside(const std::vector<RankInput>& inputs, int64_t nowNs, OtherWaits* others,
                                     std::deque<std::vector<GroupWait>>* held) {
  GroupStore* job = st_.jobStore();
  if (job == nullptr) return true;
  // A record older than this predates the waits of this incident (a hang
  // that resolved earlier): its positions are not where the rank is now.
  const int64_t oldest =
      nowNs - static_cast<int64_t>(st_.warnAfter().count()) * 1'000'000 - 2 * reportWaitNs(st_.exchangeIntervalS());
  std::set<int64_t> tried;
  for (const auto& in : inputs) tried.insert(in.globalRank);
  bool complete = true;
  for (int step = 0; step < kFollowSteps && tried.size() < inputs.size() + kMaxFollowed; ++step) {
    WaitGraph graph;
    for (const auto& [rank, waits] : *others) graph.addRankRef(rank, *waits);
    for (const auto& in : inputs) {
      if (in.responded) graph.addRankRef(in.globalRank, in.waits());
    }
    // The ranks some known rank waits for, whose positions nobody here has.
    std::vector<int64_t> wanted;
    for (int64_t rank : tried) {
      auto site = graph.siteOf(rank);
      if (!site) continue;
      for (int64_t r : site->waitsFor) {
        if (!graph.knows(r) && std::find(wanted.begin(), wanted.end(), r) == wanted.end()) wanted.push_back(r);
      }
    }
    std::vector<int64_t> fresh;
    for (int64_t r : wanted) {
      if (!tried.insert(r).second) continue;
      if (tried.size() > inputs.size() + kMaxFollowed) break;
      auto text = job->get(keys::waits(r));
      auto published = text ? decodePublishedWaits(*text) : std::nullopt;
      if (!published || published->timeNs < oldest) {
        complete = false;  // computing (no wait to publish), or not answered yet
        continue;
      }
      held->push_back(std::move(published->waits));
      (*others)[r] = &held->back();
      fresh.push_back(r);
    }
    if (fresh.empty()) break;
  }
  return complete;
}

bool IncidentProtocol::tryAnalyse(const Awaiting& a, bool force, int64_t nowNs) {
  const auto& id = st_.id();
  GroupStore& store = st_.store();
  const std::string iid = a.incident.id();
  std::vector<std::string> snapKeys;
  for (int r = 0; r < id.size; ++r) snapKeys.push_back(keys::snapshot(iid, r));
  // One check for all the snapshots while waiting (a large group would
  // otherwise cost the store one call per rank per tick); rank by rank only
  // once the wait is over, to tell who is missing.
  auto every = store.check(snapKeys);
  if (!every.ok()) return false;  // the store failed: no verdict from here
  if (!every.value && !force) return false;
  std::vector<bool> present(id.size, every.value);
  for (int r = 0; !every.value && r < id.size; ++r) {
    auto there = store.check({snapKeys[r]});
    if (!there.ok()) return false;
    present[r] = there.value;
  }
  std::vector<RankInput> inputs(id.size);
  for (int r = 0; r < id.size; ++r) {
    RankInput& in = inputs[r];
    in.groupRank = r;
    in.globalRank = id.globalRank(r);
    in.groupName = id.name;
    if (present[r]) {
      if (auto text = store.get(snapKeys[r])) {
        try {
          in.snapshot = snapshotFromJson(Json::parse(*text));
          in.responded = true;
        } catch (const std::exception& e) {
          logMessage(LogLevel::Warning,
                     "guard watchdog: bad snapshot from rank " + std::to_string(r) + ": " + e.what());
        }
      }
    }
    if (!in.responded) {
      // A rank the inner backend terminated (gloo's abort on a byte-count
      // difference) left its ledger window as its last words (LastWords):
      // what it issued is known, so a mismatch report describes its call
      // instead of "did not answer"; it still counts as gone.
      if (auto text = store.get(keys::lastWords(r))) {
        try {
          in.snapshot = snapshotFromJson(Json::parse(*text));
          in.lastWords = true;
        } catch (const std::exception& e) {
          logMessage(LogLevel::Warning,
                     "guard watchdog: bad last words from rank " + std::to_string(r) + ": " + e.what());
        }
      }
    }
    if (!in.responded) {
      if (auto s = store.get(keys::status(r))) {
        if (auto status = StatusRecord::decode(*s)) {
          in.statusKnown = true;
          in.phase = status->phase;
          in.heartbeatNs = status->heartbeatNs;
          in.lastSeq = status->lastSeq;
        }
      }
    }
  }
  if (store.health() != StoreHealth::Healthy) return false;
  // Where the waits lead out of the group: hold the analysis back (until the
  // snapshot deadline) for ranks that have not published their positions yet;
  // every rank of a deadlock answers an incident on one of its groups.
  OtherWaits others;
  std::deque<std::vector<GroupWait>> held;
  const bool followed = followOutside(inputs, nowNs, &others, &held);
  if (!followed && !force && id.size <= kMaxHoldBackSize) return false;
  Verdict v = analyze(st_.label(), inputs, a.incident, nowNs, others.empty() ? nullptr : &others);
  store.set(keys::report(iid), v.toJson().dump());
  hooks_.act(a.incident, v);
  return true;
}

std::vector<std::string> IncidentProtocol::incidentKeys() {
  GroupStore& store = st_.store();
  const int size = st_.id().size;
  std::vector<std::string> out;
  auto alerts = store.add(keys::kAlerts, 0);
  if (!alerts.ok()) return out;
  for (int64_t k = 1; k <= alerts.value; ++k) {
    const std::string alert = keys::alert(k);
    auto desc = store.get(alert);
    if (!desc) continue;
    const auto record = keys::AlertRecord::decode(*desc);
    const std::string iid = record ? record->id : desc->substr(0, desc->find('\n'));
    out.push_back(alert);
    if (keys::isLiveRequest(iid)) {
      // Only the ranks it asked may have answered (after the asker left, if late).
      const std::string spec = record ? record->body : std::string();
      for (int r = 0; r < size; ++r) {
        if (keys::specAsks(spec, st_.id().globalRank(r))) out.push_back(keys::snapshot(iid, r));
      }
      continue;
    }
    out.push_back(keys::once(iid));
    out.push_back(keys::report(iid));
    for (int r = 0; r < size; ++r) out.push_back(keys::snapshot(iid, r));
  }
  out.push_back(keys::kAlerts);
  return out;
}

}  // namespace torch_ext
