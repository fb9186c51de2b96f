#include "guard/report/WaitGraph.h"

#include "guard/report/Report.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>

namespace torch_ext {

namespace {

std::string secondsSince(int64_t startNs, int64_t nowNs) {
  char buf[32];
  const double s = startNs > 0 && nowNs > startNs ? static_cast<double>(nowNs - startNs) / 1e9 : 0.0;
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

std::string optString(const Json& j, const char* key) {
  const Json* v = j.get(key);
  return (v && v->isString()) ? v->asString() : std::string();
}

int64_t optInt(const Json& j, const char* key) {
  const Json* v = j.get(key);
  return (v && v->isNumber()) ? v->asInt(key) : 0;
}

std::string siteName(const WaitSite& s) {
  return "#" + std::to_string(s.seq) + " on group \"" + s.label + "\"";
}

} // namespace

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
    j.set("pending", p);
  } else {
    j.set("pending", Json());
  }
  return j;
}

GroupWait groupWaitFromJson(const Json& j) {
  GroupWait w;
  w.group = j.at("group").asString("waits group");
  w.label = optString(j, "desc");
  if (w.label.empty()) w.label = w.group;
  for (const auto& r : j.at("ranks").asArray("waits ranks")) w.ranks.push_back(r.asInt("waits rank"));
  w.lastSeq = static_cast<uint64_t>(j.at("last_seq").asInt("waits last_seq"));
  if (const Json* p = j.get("pending"); p != nullptr && p->isObject()) {
    w.pending = true;
    w.seq = static_cast<uint64_t>(p->at("collective_seq_id").asInt("waits collective_seq_id"));
    w.op = optString(*p, "op");
    w.where = optString(*p, "where");
    w.startNs = optInt(*p, "time_created_ns");
  }
  return w;
}

std::string WaitFinding::groupList() const {
  std::string out;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i > 0) out += i + 1 == groups.size() ? " and " : ", ";
    out += groups[i];
  }
  return out;
}

std::string WaitFinding::headline() const {
  return shape == WaitShape::Cycle ? "deadlock across groups " + groupList() : std::string();
}

std::string WaitFinding::ownerGroup() const {
  std::string owner;
  for (const auto& s : sites) {
    if (owner.empty() || s.group < owner) owner = s.group;
  }
  return owner;
}

void WaitGraph::addRank(int64_t rank, std::vector<GroupWait> waits) {
  ranks_[rank] = std::move(waits);
}

const GroupWait* WaitGraph::waitOf(int64_t rank) const {
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return nullptr;
  const GroupWait* best = nullptr;
  for (const auto& w : it->second) {
    if (w.waitsInCollective() && (best == nullptr || w.startNs > best->startNs)) best = &w;
  }
  return best;
}

bool WaitGraph::issued(int64_t rank, const std::string& group, uint64_t seq) const {
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return false;
  for (const auto& w : it->second) {
    if (w.group == group) return w.lastSeq >= seq;
  }
  return false;
}

namespace {

// The site of collective `seq` of `group`, from every known position.
WaitSite siteAt(const std::map<int64_t, std::vector<GroupWait>>& ranks, const WaitGraph& graph,
                const std::string& group, uint64_t seq) {
  WaitSite s;
  s.group = group;
  s.seq = seq;
  const GroupWait* members = nullptr;
  for (const auto& [rank, waits] : ranks) {
    for (const auto& w : waits) {
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
    for (auto r : members->ranks) {
      if (!graph.issued(r, group, seq)) s.waitsFor.push_back(r);
    }
  }
  if (s.label.empty()) s.label = group;
  std::sort(s.waitsFor.begin(), s.waitsFor.end());
  return s;
}

} // namespace

std::optional<WaitSite> WaitGraph::siteOf(int64_t rank) const {
  const GroupWait* w = waitOf(rank);
  if (w == nullptr) return std::nullopt;
  return siteAt(ranks_, *this, w->group, w->seq);
}

std::vector<int64_t> WaitGraph::targets(int64_t rank) const {
  auto s = siteOf(rank);
  std::vector<int64_t> out;
  if (!s) return out;
  for (auto r : s->waitsFor) {
    if (r != rank) out.push_back(r);
  }
  return out;
}

WaitFinding WaitGraph::cycleFrom(const std::vector<int64_t>& loop) const {
  WaitFinding f;
  f.shape = WaitShape::Cycle;
  std::set<std::pair<std::string, uint64_t>> seen;
  std::set<std::string> labels;
  for (auto r : loop) {
    auto s = siteOf(r);
    if (!s || !seen.insert({s->group, s->seq}).second) continue;
    labels.insert(s->label);
    f.sites.push_back(std::move(*s));
  }
  // Start at the owner's site, so every view of the cycle reads the same.
  const std::string owner = f.ownerGroup();
  auto first = std::find_if(f.sites.begin(), f.sites.end(), [&](const WaitSite& s) { return s.group == owner; });
  std::rotate(f.sites.begin(), first, f.sites.end());
  f.groups.assign(labels.begin(), labels.end());
  return f;
}

namespace {

// Depth-first search for a loop of waits reachable from `start`; the loop's
// ranks in `*loop` (in wait order).
bool findLoop(int64_t r, const std::function<std::vector<int64_t>(int64_t)>& targets, std::map<int64_t, int>& color,
              std::vector<int64_t>& stack, std::vector<int64_t>* loop) {
  color[r] = 1;
  stack.push_back(r);
  for (auto t : targets(r)) {
    const int c = color.count(t) ? color[t] : 0;
    if (c == 1) {
      auto from = std::find(stack.begin(), stack.end(), t);
      loop->assign(from, stack.end());
      return true;
    }
    if (c == 0 && findLoop(t, targets, color, stack, loop)) return true;
  }
  stack.pop_back();
  color[r] = 2;
  return false;
}

} // namespace

WaitFinding WaitGraph::follow(const std::string& group, uint64_t seq, const std::vector<int64_t>& missing) const {
  const auto next = [this](int64_t r) { return targets(r); };
  std::map<int64_t, int> color;
  for (auto r : missing) {
    std::vector<int64_t> stack, loop;
    if (!color.count(r) && findLoop(r, next, color, stack, &loop)) return cycleFrom(loop);
  }
  // No cycle: the chain from the stuck collective, site by site.
  WaitFinding f;
  f.sites.push_back(siteAt(ranks_, *this, group, seq));
  std::set<std::pair<std::string, uint64_t>> seen{{group, seq}};
  std::set<int64_t> visited(missing.begin(), missing.end()), ends;
  std::vector<int64_t> frontier = missing;
  while (!frontier.empty()) {
    std::vector<int64_t> after;
    for (auto r : frontier) {
      auto s = siteOf(r);
      if (!s) {
        ends.insert(r);
        if (!knows(r)) f.endUnknown.push_back(r);
        continue;
      }
      if (!seen.insert({s->group, s->seq}).second) continue;
      for (auto t : s->waitsFor) {
        if (visited.insert(t).second) after.push_back(t);
      }
      f.sites.push_back(std::move(*s));
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
  const auto next = [this](int64_t r) { return targets(r); };
  std::map<int64_t, int> color;
  for (const auto& kv : ranks_) {
    std::vector<int64_t> stack, loop;
    if (!color.count(kv.first) && findLoop(kv.first, next, color, stack, &loop)) return cycleFrom(loop);
  }
  return WaitFinding{};
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
    os << "\n  " << formatRanks(s.waiters) << (s.waiters.size() == 1 ? " waits" : " wait") << " in collective #"
       << s.seq << " " << s.op << " on group \"" << s.label << "\" (at " << s.where << ", "
       << secondsSince(s.startNs, nowNs) << ") for " << formatRanks(s.waitsFor);
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
    std::vector<std::string> parts;
    for (const auto& [site, rs] : by) {
      parts.push_back(std::string(rs.size() == 1 ? "which waits" : "which wait") + " in " + siteName(*site));
    }
    for (size_t i = 0; i < parts.size(); ++i) os << (i ? "; " : ", ") << parts[i];
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

} // namespace torch_ext
