#include "guard/report/WaitGraph.h"

#include "guard/report/RankList.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>
#include <tuple>

namespace torch_ext {

namespace {

std::string secondsSince(int64_t startNs, int64_t nowNs) {
  char buf[32];
  const double s = startNs > 0 && nowNs > startNs ? static_cast<double>(nowNs - startNs) / 1e9 : 0.0;
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

std::string siteName(const WaitSite& s) {
  if (s.p2p()) return s.what() + " on group \"" + s.label + "\"";
  return "#" + std::to_string(s.seq) + " on group \"" + s.label + "\"";
}

// A site's key in a search: a collective is one site for all its waiters; a
// send/recv is its rank's own.
using SiteKey = std::tuple<std::string, uint64_t, int64_t>;
SiteKey keyOf(const GroupWait& w, int64_t rank) {
  return {w.group, w.seq, w.seq ? -1 : rank};
}
SiteKey keyOf(const WaitSite& s) {
  return {s.group, s.seq, s.p2p() && !s.waiters.empty() ? s.waiters.front() : -1};
}

}  // namespace

Json toJson(const GroupWait& w) {
  Json j = Json::object();
  j.set("group", w.group);
  j.set("desc", w.label);
  Json ranks = Json::array();
  for (auto r : w.ranks) ranks.push(r);
  j.set("ranks", ranks);
  j.set("last_seq", w.lastSeq);
  if (w.pending) {
    Json p = Json::object();
    p.set("collective_seq_id", w.seq);
    p.set("op", w.op);
    p.set("where", w.where);
    p.set("time_created_ns", w.startNs);
    if (w.blocked) p.set("blocked", true);
    if (w.waitsInP2P()) {
      p.set("peer", w.peer);
      p.set("direction", w.recv ? "recv" : "send");
      p.set("tag", static_cast<int64_t>(w.tag));
    }
    j.set("pending", p);
  } else {
    j.set("pending", Json());
  }
  return j;
}

GroupWait groupWaitFromJson(const Json& j) {
  GroupWait w;
  w.group = j.at("group").asString("waits group");
  w.label = j.stringOr("desc");
  if (w.label.empty()) w.label = w.group;
  for (const auto& r : j.at("ranks").asArray("waits ranks")) w.ranks.push_back(r.asInt("waits rank"));
  w.lastSeq = static_cast<uint64_t>(j.at("last_seq").asInt("waits last_seq"));
  if (const Json* p = j.get("pending"); p != nullptr && p->isObject()) {
    w.pending = true;
    w.seq = static_cast<uint64_t>(p->at("collective_seq_id").asInt("waits collective_seq_id"));
    w.op = p->stringOr("op");
    w.where = p->stringOr("where");
    w.startNs = p->intOr("time_created_ns");
    if (const Json* b = p->get("blocked"); b != nullptr && b->type() == Json::Type::Bool)
      w.blocked = b->asBool("waits blocked");
    if (const Json* peer = p->get("peer"); peer != nullptr && peer->isNumber()) {
      w.peer = peer->asInt("waits peer");
      w.recv = p->stringOr("direction") == "recv";
      w.tag = static_cast<int32_t>(p->intOr("tag"));
    }
  }
  return w;
}

std::string encodePublishedWaits(const PublishedWaits& p) {
  Json j = Json::object();
  j.set("time_ns", p.timeNs);
  Json waits = Json::array();
  for (const auto& w : p.waits) waits.push(toJson(w));
  j.set("waits", waits);
  return j.dump();
}

std::optional<PublishedWaits> decodePublishedWaits(const std::string& text) {
  try {
    const Json j = Json::parse(text);
    PublishedWaits p;
    p.timeNs = j.at("time_ns").asInt("time_ns");
    for (const auto& w : j.at("waits").asArray("waits")) p.waits.push_back(groupWaitFromJson(w));
    return p;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

Json toJson(const WaitSite& s) {
  auto ranks = [](const std::vector<int64_t>& rs) {
    Json a = Json::array();
    for (auto r : rs) a.push(r);
    return a;
  };
  Json j = Json::object();
  j.set("group", s.group);
  j.set("desc", s.label);
  j.set("collective_seq_id", s.seq);
  j.set("what", s.what());
  j.set("where", s.where);
  j.set("time_created_ns", s.startNs);
  j.set("waiters", ranks(s.waiters));
  j.set("waits_for", ranks(s.waitsFor));
  if (s.p2p()) {
    j.set("peer", s.peer);
    j.set("direction", s.recv ? "recv" : "send");
  }
  return j;
}

WaitSite waitSiteFromJson(const Json& j) {
  auto ranks = [&j](const char* key) {
    std::vector<int64_t> out;
    for (const auto& r : j.at(key).asArray(key)) out.push_back(r.asInt(key));
    return out;
  };
  WaitSite s;
  s.group = j.at("group").asString("site group");
  s.label = j.stringOr("desc");
  s.seq = static_cast<uint64_t>(j.at("collective_seq_id").asInt("site collective_seq_id"));
  s.where = j.stringOr("where");
  s.startNs = j.intOr("time_created_ns");
  s.waiters = ranks("waiters");
  s.waitsFor = ranks("waits_for");
  if (const Json* peer = j.get("peer"); peer != nullptr && peer->isNumber()) {
    s.peer = peer->asInt("site peer");
    s.recv = j.stringOr("direction") == "recv";
  }
  // what() of a collective is "collective #N <op>"; keep the op part.
  std::string what = j.stringOr("what");
  const std::string prefix = "collective #" + std::to_string(s.seq) + " ";
  if (!s.p2p() && what.rfind(prefix, 0) == 0) what = what.substr(prefix.size());
  if (s.p2p()) {
    const auto cut = what.rfind(s.recv ? " from rank " : " to rank ");
    if (cut != std::string::npos) what = what.substr(0, cut);
  }
  s.op = what;
  return s;
}

std::string WaitSite::what() const {
  if (!p2p()) return "collective #" + std::to_string(seq) + " " + op;
  if (peer < 0) return op;
  return op + (recv ? " from rank " : " to rank ") + std::to_string(peer);
}

namespace {

std::string listOf(const std::vector<std::string>& groups) {
  std::string out;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i > 0) out += i + 1 == groups.size() ? " and " : ", ";
    out += groups[i];
  }
  return out;
}

}  // namespace

std::string deadlockHeadline(const std::vector<std::string>& groups) {
  return "deadlock across groups " + listOf(groups);
}

std::string WaitFinding::groupList() const {
  return listOf(groups);
}

std::string WaitFinding::headline() const {
  return shape == WaitShape::Cycle ? deadlockHeadline(groups) : std::string();
}

void WaitGraph::addRank(int64_t rank, std::vector<GroupWait> waits) {
  owned_.push_back(std::move(waits));
  ranks_[rank] = &owned_.back();
}

void WaitGraph::addRankRef(int64_t rank, const std::vector<GroupWait>& waits) {
  ranks_[rank] = &waits;
}

const GroupWait* WaitGraph::waitOf(int64_t rank) const {
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return nullptr;
  const GroupWait* best = nullptr;
  for (const auto& w : *it->second) {
    if (w.waits() && (best == nullptr || w.startNs > best->startNs)) best = &w;
  }
  return best;
}

bool WaitGraph::issued(int64_t rank, const std::string& group, uint64_t seq) const {
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return false;
  for (const auto& w : *it->second) {
    if (w.group == group) return w.lastSeq >= seq;
  }
  return false;
}

namespace {

// The site of collective `seq` of `group`, from every known position.
WaitSite siteAt(const std::map<int64_t, const std::vector<GroupWait>*>& ranks, const WaitGraph& graph,
                const std::string& group, uint64_t seq) {
  WaitSite s;
  s.group = group;
  s.seq = seq;
  const GroupWait* members = nullptr;
  for (const auto& [rank, waits] : ranks) {
    for (const auto& w : *waits) {
      if (w.group != group) continue;
      // A rank learns a group's description at its first operation there.
      if (members == nullptr || (members->label == group && w.label != group)) members = &w;
      if (w.pending && w.seq == seq) {
        s.waiters.push_back(rank);
        if (s.op.empty()) {
          s.op = w.op;
          s.where = w.where;
        }
        if (s.startNs == 0 || (w.startNs > 0 && w.startNs < s.startNs)) s.startNs = w.startNs;
      }
    }
  }
  if (members != nullptr) {
    s.label = members->label;
    s.members = members->ranks;
    for (auto r : members->ranks) {
      if (!graph.issued(r, group, seq)) s.waitsFor.push_back(r);
    }
  }
  if (s.label.empty()) s.label = group;
  std::sort(s.waitsFor.begin(), s.waitsFor.end());
  return s;
}

}  // namespace

namespace {

// The site of `rank`'s send/recv `w`: it waits for its peer, unless the peer
// waits in the counterpart (the pair is posted: waiting on the transport).
WaitSite p2pSiteOf(const std::map<int64_t, const std::vector<GroupWait>*>& ranks, int64_t rank, const GroupWait& w) {
  WaitSite s;
  s.group = w.group;
  s.label = w.label.empty() ? w.group : w.label;
  s.seq = 0;
  s.peer = w.peer;
  s.recv = w.recv;
  s.op = w.op;
  s.where = w.where;
  s.startNs = w.startNs;
  s.waiters = {rank};
  s.members = w.ranks;
  bool paired = false;
  if (auto it = ranks.find(w.peer); it != ranks.end()) {
    for (const auto& p : *it->second) {
      paired |= p.group == w.group && p.waitsInP2P() && p.peer == rank && p.recv != w.recv && p.tag == w.tag;
    }
  }
  if (!paired && w.peer != rank) s.waitsFor = {w.peer};
  return s;
}

}  // namespace

std::optional<WaitSite> WaitGraph::siteOf(int64_t rank) const {
  const GroupWait* w = waitOf(rank);
  if (w == nullptr) return std::nullopt;
  if (w->waitsInP2P()) return p2pSiteOf(ranks_, rank, *w);
  return siteAt(ranks_, *this, w->group, w->seq);
}

namespace {

// The sites of the ranks a search visits, computed once each (a site scans
// every known rank's positions).
class SiteCache {
 public:
  explicit SiteCache(const WaitGraph& g) : g_(g) {}
  const WaitSite* of(int64_t rank) {
    auto it = byRank_.find(rank);
    if (it != byRank_.end()) return it->second;
    const WaitSite* site = nullptr;
    if (const GroupWait* w = g_.waitOf(rank)) {
      const SiteKey key = keyOf(*w, rank);
      auto s = sites_.find(key);
      if (s == sites_.end()) s = sites_.emplace(key, *g_.siteOf(rank)).first;
      site = &s->second;
    }
    byRank_[rank] = site;
    return site;
  }
  // The ranks `rank` waits for (itself excluded).
  std::vector<int64_t> targets(int64_t rank) {
    std::vector<int64_t> out;
    if (const WaitSite* s = of(rank)) {
      for (auto r : s->waitsFor) {
        if (r != rank) out.push_back(r);
      }
    }
    return out;
  }

 private:
  const WaitGraph& g_;
  std::map<SiteKey, WaitSite> sites_;
  std::map<int64_t, const WaitSite*> byRank_;
};

// Tarjan's strongly connected components of the waits reachable from the
// roots; returns those of two ranks or more (ranks that wait for each other,
// directly or not: a deadlock), each sorted, in order of their lowest rank.
std::vector<std::vector<int64_t>> loops(SiteCache& sites, const std::vector<int64_t>& roots) {
  std::map<int64_t, int> index, low;
  std::set<int64_t> onStack;
  std::vector<int64_t> stack;
  std::vector<std::vector<int64_t>> out;
  int counter = 0;
  std::function<void(int64_t)> visit = [&](int64_t v) {
    index[v] = low[v] = counter++;
    stack.push_back(v);
    onStack.insert(v);
    for (auto t : sites.targets(v)) {
      if (!index.count(t)) {
        visit(t);
        low[v] = std::min(low[v], low[t]);
      } else if (onStack.count(t)) {
        low[v] = std::min(low[v], index[t]);
      }
    }
    if (low[v] == index[v]) {
      std::vector<int64_t> scc;
      int64_t w;
      do {
        w = stack.back();
        stack.pop_back();
        onStack.erase(w);
        scc.push_back(w);
      } while (w != v);
      if (scc.size() >= 2) {
        std::sort(scc.begin(), scc.end());
        out.push_back(std::move(scc));
      }
    }
  };
  for (auto r : roots) {
    if (!index.count(r)) visit(r);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.front() < b.front(); });
  return out;
}

// The finding for the ranks of one loop: their sites, walked in wait order
// from the owner's (the others after, if any).
WaitFinding cycleOf(const WaitGraph& graph, SiteCache& sites, const std::vector<int64_t>& loop) {
  WaitFinding f;
  f.shape = WaitShape::Cycle;
  f.loop = loop;
  f.unblocked = graph.notBlocked(loop);
  f.certain = f.unblocked.empty();
  std::vector<const WaitSite*> all;
  for (auto r : loop) {
    const WaitSite* s = sites.of(r);
    if (s != nullptr && std::find(all.begin(), all.end(), s) == all.end()) all.push_back(s);
  }
  std::set<std::string> labels;
  for (const WaitSite* s : all) labels.insert(s->label);
  f.groups.assign(labels.begin(), labels.end());
  // Which group's report logs it: the lowest-named group on the loop whose
  // members include every rank of the loop (its analyst saw all of them, so
  // it finds this loop too); none such (pairwise groups, a 2x2 mesh, pipeline
  // stages), the lowest-named group on the loop: its analyst follows the
  // waits out of its group through the positions ranks publish job-wide.
  const std::set<int64_t> inLoop(loop.begin(), loop.end());
  for (const WaitSite* s : all) {
    const std::set<int64_t> members(s->members.begin(), s->members.end());
    const bool covers = std::includes(members.begin(), members.end(), inLoop.begin(), inLoop.end());
    if (covers && (f.owner.empty() || s->group < f.owner)) f.owner = s->group;
  }
  if (f.owner.empty()) {
    for (const WaitSite* s : all) {
      if (f.owner.empty() || s->group < f.owner) f.owner = s->group;
    }
  }
  const std::string first = f.owner;
  const WaitSite* at = nullptr;
  for (const WaitSite* s : all) {
    if (s->group == first) at = s;
  }
  std::vector<const WaitSite*> order;
  while (at != nullptr && std::find(order.begin(), order.end(), at) == order.end()) {
    order.push_back(at);
    const WaitSite* next = nullptr;
    for (auto r : at->waitsFor) {
      const WaitSite* s = inLoop.count(r) ? sites.of(r) : nullptr;
      if (s != nullptr && std::find(order.begin(), order.end(), s) == order.end()) {
        next = s;
        break;
      }
    }
    at = next;
  }
  for (const WaitSite* s : all) {
    if (std::find(order.begin(), order.end(), s) == order.end()) order.push_back(s);
  }
  for (const WaitSite* s : order) f.sites.push_back(*s);
  return f;
}

}  // namespace

WaitFinding WaitGraph::follow(const std::string& group, uint64_t seq, const std::vector<int64_t>& missing) const {
  return followFrom(siteAt(ranks_, *this, group, seq), missing);
}

WaitFinding WaitGraph::followFrom(WaitSite start, const std::vector<int64_t>& missing) const {
  SiteCache sites(*this);
  const auto found = loops(sites, missing);
  if (!found.empty()) return cycleOf(*this, sites, found.front());
  // No loop: the chain from the stuck operation, site by site.
  WaitFinding f;
  std::set<SiteKey> seen{keyOf(start)};
  f.sites.push_back(std::move(start));
  std::set<int64_t> visited(missing.begin(), missing.end()), ends;
  std::vector<int64_t> frontier = missing;
  while (!frontier.empty()) {
    std::vector<int64_t> after;
    for (auto r : frontier) {
      const WaitSite* s = sites.of(r);
      if (s == nullptr) {
        ends.insert(r);
        if (!knows(r)) f.endUnknown.push_back(r);
        continue;
      }
      if (!seen.insert(keyOf(*s)).second) continue;
      for (auto t : s->waitsFor) {
        if (visited.insert(t).second) after.push_back(t);
      }
      f.sites.push_back(*s);
    }
    frontier = std::move(after);
  }
  if (f.sites.size() < 2) return WaitFinding{};
  f.shape = WaitShape::Chain;
  f.end.assign(ends.begin(), ends.end());
  std::sort(f.endUnknown.begin(), f.endUnknown.end());
  return f;
}

WaitFinding WaitGraph::anyCycle() const {
  SiteCache sites(*this);
  std::vector<int64_t> roots;
  for (const auto& kv : ranks_) roots.push_back(kv.first);
  const auto found = loops(sites, roots);
  return found.empty() ? WaitFinding{} : cycleOf(*this, sites, found.front());
}

std::vector<int64_t> WaitGraph::notBlocked(const std::vector<int64_t>& ranks) const {
  std::vector<int64_t> out;
  for (auto r : ranks) {
    const GroupWait* w = waitOf(r);
    if (w == nullptr || !w->blocked) out.push_back(r);
  }
  return out;
}

std::string WaitFinding::describe(int64_t nowNs) const {
  if (shape == WaitShape::None) return "";
  // Which site each waiting rank is in, to say where the ranks waited for are.
  std::map<int64_t, const WaitSite*> siteOfRank;
  for (const auto& s : sites) {
    for (auto r : s.waiters) siteOfRank.emplace(r, &s);
  }
  std::ostringstream os;
  for (const auto& s : sites) {
    if (s.waiters.empty()) continue;
    os << "\n  " << formatRanks(s.waiters) << (s.waiters.size() == 1 ? " waits" : " wait") << " in " << s.what()
       << " on group \"" << s.label << "\" (at " << s.where << ", " << secondsSince(s.startNs, nowNs) << ") for "
       << formatRanks(s.waitsFor);
    // Where the ranks it waits for are, grouped by site.
    std::map<const WaitSite*, std::vector<int64_t>> by;
    std::vector<int64_t> idle;
    for (auto r : s.waitsFor) {
      auto it = siteOfRank.find(r);
      if (it != siteOfRank.end() && it->second != &s) {
        by[it->second].push_back(r);
      } else if (it == siteOfRank.end()) {
        idle.push_back(r);
      }
    }
    if (by.size() == 1 && by.begin()->second.size() == s.waitsFor.size()) {
      // All of them in one place: ", which wait in #1 on group "mp"".
      os << (s.waitsFor.size() == 1 ? ", which waits in " : ", which wait in ") << siteName(*by.begin()->first);
    } else {
      // Spread over several: "; rank 1 waits in #1 on group "b", rank 2 in #1 on group "c"".
      bool first = true;
      for (const auto& [site, rs] : by) {
        os << (first ? "; " : ", ") << formatRanks(rs) << (first ? (rs.size() == 1 ? " waits" : " wait") : "") << " in "
           << siteName(*site);
        first = false;
      }
    }
  }
  if (shape == WaitShape::Cycle && certain) {
    os << "\n  every rank of the loop blocks in its wait, so none can issue what the others wait for: it can "
          "never complete";
  } else if (shape == WaitShape::Cycle) {
    os << "\n  possibly temporary: " << formatRanks(unblocked) << (unblocked.size() == 1 ? " has" : " have")
       << " its operation pending without blocking in it (async_op=True, DDP's gradient buckets, a stream) "
          "and may still issue what the others wait for";
  }
  if (shape == WaitShape::Chain && !end.empty()) {
    os << "\n  everything waits for " << formatRanks(end);
    if (endUnknown.empty()) {
      os << ": in no guarded collective (computing, or blocked outside the guarded groups)";
    } else if (endUnknown.size() < end.size()) {
      os << ": in no guarded collective as far as these ranks know";
    } else {
      os << " (not a member of this group: the report on its own groups says where it is)";
    }
  }
  return os.str();
}

}  // namespace torch_ext
