#include "guard/report/DumpAnalysis.h"

#include <algorithm>
#include <map>
#include <utility>

namespace torch_ext {

RankSnapshot readDump(const DumpInput& dump) {
  if (dump.text.size() > kMaxDumpBytes) {
    throw DumpError(dump.name, "is " + std::to_string(dump.text.size() >> 20) + " MiB, over the " +
                                   std::to_string(kMaxDumpBytes >> 20) +
                                   " MiB a dump may hold (not a torch_ext dump?)");
  }
  RankSnapshot snap;
  try {
    snap = snapshotFromJson(Json::parse(dump.text));
  } catch (const JsonError& e) {
    throw DumpError(dump.name, e.what());
  }
  for (const auto& g : snap.groups) {
    // The analysis holds one input per rank of a group: the group's size is
    // bounded, and must agree with the ranks the file lists.
    if (g.size > kMaxDumpGroupSize) {
      throw DumpError(dump.name, "group '" + g.name + "' has " + std::to_string(g.size) + " ranks, over the " +
                                     std::to_string(kMaxDumpGroupSize) + " a dump may describe");
    }
    if (g.globalRanks.size() != static_cast<size_t>(g.size)) {
      throw DumpError(dump.name, "group '" + g.name + "' has size " + std::to_string(g.size) + " but lists " +
                                     std::to_string(g.globalRanks.size()) + " ranks");
    }
  }
  return snap;
}

namespace {

// A file's view of one group: the first group of that name in the file, as
// RankSnapshot::group finds it.
struct Held {
  const RankSnapshot* snapshot;
  const GroupView* group;
};

struct GroupInfo {
  int size = 0;
  std::string label;
  std::vector<Held> held;  // in file order
};

// Where the rank stood in each of its groups: as the dump says, or (dumps of
// torch_ext before `waits`) from the groups' windows, which a dump holds whole.
std::vector<GroupWait> waitsOf(const RankSnapshot& s) {
  if (!s.waits.empty()) return s.waits;
  std::vector<GroupWait> out;
  for (const auto& g : s.groups) {
    GroupWait w;
    w.group = g.name;
    w.label = g.label();
    w.ranks = g.globalRanks;
    w.lastSeq = g.lastSeq;
    const EntryView* e = g.oldestPending();
    // A collective that failed last: where the rank stood when its group failed.
    if (e == nullptr && !g.entries.empty() && g.entries.back().state == EntryState::Failed) e = &g.entries.back();
    if (e != nullptr) {
      w.pending = true;
      w.seq = e->seq;
      w.op = e->text;
      w.where = e->where();
      w.startNs = e->startNs;
    }
    out.push_back(std::move(w));
  }
  return out;
}

// `s` with `g` as its only group: all that the analysis of g reads. A copy of
// the whole snapshot per group would cost (groups x file size) for a file
// holding many groups.
RankSnapshot withOnly(const RankSnapshot& s, const GroupView& g) {
  RankSnapshot t;
  t.version = s.version;
  t.rank = s.rank;
  t.pid = s.pid;
  t.hostname = s.hostname;
  t.timeNs = s.timeNs;
  t.incident = s.incident;
  t.config = s.config;
  t.main = s.main;
  t.progress = s.progress;
  t.groups.push_back(g);
  return t;
}

// One input per group rank: the ranks whose dumps hold the group answered.
std::vector<RankInput> inputsFor(const std::string& name, const GroupInfo& info,
                                 const std::map<const RankSnapshot*, std::vector<GroupWait>>& waits,
                                 std::string* incident) {
  const int size = std::max(info.size, 0);
  std::vector<RankInput> inputs(size);
  for (int r = 0; r < size; ++r) {
    inputs[r].groupRank = r;
    inputs[r].globalRank = r;
    inputs[r].groupName = name;
  }
  for (const auto& [s, g] : info.held) {
    if (g->rank >= size) continue;
    auto& in = inputs[g->rank];
    in.responded = true;
    in.snapshot = withOnly(*s, *g);
    in.sharedWaits = &waits.at(s);
    in.globalRank = g->globalRank(g->rank);
    in.heartbeatNs = s->timeNs;
    if (incident->empty()) *incident = s->incident;
  }
  // Ranks without a dump: their global rank as the last file holding the group lists it.
  const GroupView* last = info.held.empty() ? nullptr : info.held.back().group;
  for (auto& in : inputs) {
    if (!in.responded && last != nullptr) in.globalRank = last->globalRank(in.groupRank);
  }
  return inputs;
}

// The oldest operation any rank still waited in: the subject of a hang verdict.
std::optional<Incident> oldestPending(const std::vector<RankInput>& inputs, int64_t* startNs) {
  std::optional<Incident> inc;
  for (const auto& in : inputs) {
    const auto* g = in.group();
    if (!g) continue;
    const EntryView* e = g->oldestPending();
    if (e == nullptr || (inc && e->startNs >= *startNs)) continue;
    *startNs = e->startNs;
    inc = Incident{IncidentKind::Hang,
                   e->isP2P ? IncidentSubject::p2p(g->rank, e->id) : IncidentSubject::collective(e->seq), g->rank, ""};
  }
  return inc;
}

// The newest collective that ended the group: the last entry of some rank's
// ledger, failed (an abort, a peer gone); else the first send/recv that did
// (a pipeline stage's recv ended by a deadlock's verdict before its dump was
// written: the same hang as when the dump caught it pending). Null when none did.
std::optional<Incident> lastFailed(const std::vector<RankInput>& inputs, int64_t* startNs) {
  std::optional<Incident> inc, p2p;
  int64_t p2pStartNs = 0;
  for (const auto& in : inputs) {
    const auto* g = in.group();
    if (g == nullptr || g->entries.empty()) continue;
    const EntryView& e = g->entries.back();
    if (e.state != EntryState::Failed) continue;
    if (e.isP2P) {
      if (!p2p) {
        p2p = Incident{IncidentKind::Hang, IncidentSubject::p2p(g->rank, e.id), g->rank, e.error};
        p2pStartNs = e.startNs;
      }
      continue;
    }
    if (inc && e.seq <= inc->subject.seq) continue;
    *startNs = e.startNs;
    inc = Incident{IncidentKind::Hang, IncidentSubject::collective(e.seq), g->rank, e.error};
  }
  if (!inc && p2p) *startNs = p2pStartNs;
  return inc ? inc : p2p;
}

// Nothing pending: the dumps may have been written for a collective that has
// failed since (incident "failure:2" after a peer died). It becomes the
// subject, so the verdict names that collective as the live report did. A
// dump written for another group's incident (a rank's last dump follows the
// job, not each group): the group's last failed collective.
std::optional<Incident> failedSubject(const std::vector<RankInput>& inputs, const std::string& dumpIncident,
                                      int64_t* startNs) {
  const auto parsed = Incident::fromId(dumpIncident);
  if (!parsed || parsed->subject.kind != IncidentSubject::Kind::Collective) return lastFailed(inputs, startNs);
  if (parsed->kind != IncidentKind::Failure && parsed->kind != IncidentKind::Abort &&
      parsed->kind != IncidentKind::Hang) {
    return std::nullopt;
  }
  for (const auto& in : inputs) {
    const auto* g = in.group();
    const auto* e = g ? g->bySeq(parsed->subject.seq) : nullptr;
    if (e == nullptr || e->state != EntryState::Failed) continue;
    *startNs = e->startNs;
    return Incident{parsed->kind == IncidentKind::Failure ? IncidentKind::Failure : IncidentKind::Hang, parsed->subject,
                    g->rank, e->error};
  }
  return lastFailed(inputs, startNs);
}

}  // namespace

std::vector<GroupFinding> analyzeDumps(const std::vector<RankSnapshot>& snaps,
                                       const std::map<int64_t, StatusRecord>* absent,
                                       const std::set<int64_t>* notAsked) {
  std::map<std::string, GroupInfo> groups;
  std::map<const RankSnapshot*, std::vector<GroupWait>> waits;  // each dump's, shared by its groups' inputs
  int64_t now = 0;
  for (const auto& s : snaps) {
    waits[&s] = waitsOf(s);
    for (const auto& g : s.groups) {
      GroupInfo& info = groups[g.name];
      info.size = g.size;
      // A rank learns a group's description (group_desc) at its first
      // operation there: keep the first rank's that knows it.
      if (info.label.empty() || (info.label == g.name && g.label() != g.name)) info.label = g.label();
      if (info.held.empty() || info.held.back().snapshot != &s) info.held.push_back({&s, &g});
    }
    now = std::max(now, s.timeNs);
  }
  // Every dump's positions, so that a wait can be followed out of a group
  // (three pairwise groups deadlocked: no group holds the whole loop).
  OtherWaits everyone;
  for (const auto& s : snaps) everyone[s.rank] = &waits.at(&s);
  // The store some rank lost, by the global rank that hosted it.
  std::map<int64_t, const RankSnapshot*> lostStores;
  for (const auto& s : snaps) {
    if (s.storeHealth != StoreHealth::Healthy && s.storeHostRank >= 0) lostStores.emplace(s.storeHostRank, &s);
  }
  std::vector<GroupFinding> out;
  for (const auto& [name, info] : groups) {
    GroupFinding f;
    f.groupName = name;
    auto inputs = inputsFor(name, info, waits, &f.dumpIncident);
    for (auto& in : inputs) {
      if (!in.responded && notAsked != nullptr && notAsked->count(in.globalRank)) in.notAsked = true;
      if (!in.responded && lostStores.count(in.globalRank)) in.storeLost = lostStores.at(in.globalRank)->storeLost;
      if (in.responded || absent == nullptr) continue;
      auto it = absent->find(in.globalRank);
      if (it == absent->end()) continue;
      in.statusKnown = true;
      in.phase = it->second.phase;
      in.heartbeatNs = it->second.heartbeatNs;
      in.lastSeq = it->second.lastSeq;
    }
    int64_t startNs = 0;
    auto inc = oldestPending(inputs, &startNs);
    if (!inc) inc = failedSubject(inputs, f.dumpIncident, &startNs);
    f.pending = inc.has_value();
    // Still nothing: look for mismatches only (a verdict of "none" if there is
    // none), rather than report a hang of a collective nobody waits in.
    if (!inc) inc = Incident{IncidentKind::Mismatch, IncidentSubject::collective(0), -1, ""};
    f.verdict = analyze(info.label, inputs, *inc, now, &everyone);
    if (!lostStores.empty()) {
      f.storeLostHost = lostStores.begin()->first;
      f.storeHealth = lostStores.begin()->second->storeHealth;
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace torch_ext
