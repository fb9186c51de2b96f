#include "guard/report/DumpStragglers.h"

#include "guard/report/StragglerBoard.h"

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace torch_ext {

namespace {

struct GroupInput {
  const GroupView* first = nullptr;
  std::vector<std::optional<RankWaits>> ranks;  // by group rank
  std::map<uint64_t, std::string> sites;
  std::vector<uint64_t> pattern;  // the first rank's collectives, for the collectives per step
};

}  // namespace

std::vector<Json> stragglersFromSnapshots(const std::vector<RankSnapshot>& snapshots, double threshold) {
  std::vector<std::string> order;
  std::map<std::string, GroupInput> groups;
  for (const auto& snap : snapshots) {
    for (const auto& g : snap.groups) {
      auto [it, fresh] = groups.try_emplace(g.name);
      GroupInput& in = it->second;
      if (fresh) {
        order.push_back(g.name);
        in.first = &g;
        in.ranks.resize(static_cast<size_t>(g.size));
        for (const auto& e : g.entries) {
          if (!e.isP2P && e.seq > kSetupCollectives) {
            in.pattern.push_back(e.hash * 1000003u ^ std::hash<std::string>{}(e.where()));
          }
        }
      }
      if (g.rank < 0 || static_cast<size_t>(g.rank) >= in.ranks.size() || g.waitWindows.empty()) continue;
      in.ranks[static_cast<size_t>(g.rank)] = RankWaits{snap.hostname, g.waitWindows};
      for (const auto& [key, text] : g.waitSites) in.sites.emplace(key, text);
    }
  }
  std::vector<Json> out;
  for (const auto& name : order) {
    const GroupInput& in = groups.at(name);
    StragglerBoard board(threshold);
    if (threshold > 0) board.look(in.ranks);
    const std::vector<Straggler> named = board.named();
    StragglerContext ctx;
    ctx.group = in.first->label();
    ctx.globalRanks = in.first->globalRanks;
    ctx.sites = in.sites;
    if (!named.empty()) {
      if (const size_t p = StragglerBoard::period(in.pattern)) ctx.collectivesPerStep = static_cast<double>(p);
    }
    const auto& history = board.history();
    Json j = stragglersJson(board, named, in.ranks.size(), ctx, history.size());
    j.set("group_name", name);
    j.set("first_seq", history.empty() ? Json() : Json(history.front().firstSeq));
    j.set("last_seq", history.empty() ? Json() : Json(history.back().lastSeq));
    int64_t collectives = 0;
    std::vector<int64_t> wait(in.ranks.size(), 0), span(in.ranks.size(), 0);
    for (const auto& w : history) {
      collectives += static_cast<int64_t>(w.lastSeq - w.firstSeq + 1);
      for (size_t r = 0; r < w.waitNs.size() && r < wait.size(); ++r) {
        wait[r] += w.waitNs[r];
        span[r] += w.spanNs[r];
      }
    }
    j.set("collectives", collectives);
    Json ranks = Json::array();
    if (!history.empty()) {
      for (size_t r = 0; r < wait.size(); ++r) {
        Json rj = Json::object();
        rj.set("rank", ctx.globalRank(static_cast<int>(r)));
        rj.set("wait_s", static_cast<double>(wait[r]) / 1e9);
        rj.set("span_s", static_cast<double>(span[r]) / 1e9);
        rj.set("wait_share", span[r] > 0 ? static_cast<double>(wait[r]) / static_cast<double>(span[r]) : 0.0);
        ranks.push(std::move(rj));
      }
    }
    j.set("ranks", std::move(ranks));
    out.push_back(std::move(j));
  }
  return out;
}

}  // namespace torch_ext
