#include "guard/report/StragglerBoard.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <set>
#include <sstream>
#include <tuple>

namespace torch_ext {

namespace {

int64_t median(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double medianD(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace

size_t StragglerBoard::look(const std::vector<std::optional<RankWaits>>& ranks) {
  if (ranks.size() < 2) return 0;
  for (const auto& r : ranks) {
    if (!r) return 0;
  }
  hosts_.resize(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) hosts_[i] = ranks[i]->host;
  for (uint8_t level = 0; level < kWaitWindowSizes.size(); ++level) {
    // Windows of this level that every rank shows, oldest first.
    std::vector<uint64_t> common;
    for (const auto& w : ranks[0]->windows) {
      if (w.level != level || w.lastSeq() <= lastSeq_) continue;
      bool everywhere = true;
      for (size_t i = 1; i < ranks.size() && everywhere; ++i) everywhere = ranks[i]->find(level, w.index) != nullptr;
      if (everywhere) common.push_back(w.index);
    }
    if (common.empty()) continue;
    std::sort(common.begin(), common.end());
    // Windows much shorter than a training step (a few of DDP's bucket
    // all_reduces) tell noise, not stragglers: take a coarser level.
    std::vector<int64_t> spans;
    for (const auto& r : ranks) spans.push_back(r->find(level, common.back())->spanNs);
    if (static_cast<size_t>(level) + 1 < kWaitWindowSizes.size() && median(spans) < kMinWindowNs) continue;
    for (uint64_t index : common) {
      std::vector<const WaitWindow*> windows;
      for (const auto& r : ranks) windows.push_back(r->find(level, index));
      history_.push_back(analyse(windows));
      if (history_.size() > kHistory) history_.pop_front();
      lastSeq_ = std::max(lastSeq_, windows[0]->lastSeq());
    }
    return common.size();
  }
  return 0;
}

StragglerWindow StragglerBoard::analyse(const std::vector<const WaitWindow*>& windows) const {
  StragglerWindow out;
  out.level = windows[0]->level;
  out.firstSeq = windows[0]->firstSeq();
  out.lastSeq = windows[0]->lastSeq();
  const size_t n = windows.size();
  int64_t total = 0;
  for (const auto* w : windows) {
    out.waitNs.push_back(w->waitNs);
    out.spanNs.push_back(w->spanNs);
    total += w->waitNs;
  }
  out.medianSpanNs = median(out.spanNs);
  const double bar = threshold_ * static_cast<double>(out.medianSpanNs);
  std::set<int> lateRanks;
  for (size_t r = 0; r < n; ++r) {
    std::vector<int64_t> others;
    for (size_t j = 0; j < n; ++j) {
      if (j != r) others.push_back(out.waitNs[j]);
    }
    const int64_t deficit = median(others) - out.waitNs[r];
    if (deficit > 0 && static_cast<double>(deficit) >= bar) {
      const int64_t othersMean = (total - out.waitNs[r]) / static_cast<int64_t>(n - 1);
      out.late.push_back({static_cast<int>(r), othersMean - out.waitNs[r]});
      lateRanks.insert(static_cast<int>(r));
    }
  }
  std::sort(out.late.begin(), out.late.end(), [](const auto& a, const auto& b) { return a.lostNs > b.lostNs; });
  // Where the ranks that waited for it waited most.
  std::map<uint64_t, int64_t> bySite;
  for (size_t r = 0; r < n; ++r) {
    if (!lateRanks.count(static_cast<int>(r))) bySite[windows[r]->siteKey] += windows[r]->siteWaitNs;
  }
  int64_t best = -1;
  for (const auto& [key, ns] : bySite) {
    if (ns > best) {
      best = ns;
      out.siteKey = key;
    }
  }
  std::vector<int64_t> counts;
  for (size_t r = 0; r < n; ++r) {
    if (!lateRanks.count(static_cast<int>(r)) && windows[r]->siteKey == out.siteKey)
      counts.push_back(windows[r]->siteCount);
  }
  out.siteCollectives = static_cast<uint32_t>(median(counts));
  return out;
}

std::vector<Straggler> StragglerBoard::named() const {
  std::map<uint64_t, int> siteWindows;
  std::map<std::pair<int, uint64_t>, Straggler> found;
  std::map<std::pair<int, uint64_t>, std::pair<std::vector<double>, std::vector<double>>> shares;
  for (const auto& w : history_) {
    ++siteWindows[w.siteKey];
    for (const auto& late : w.late) {
      auto& s = found[{late.rank, w.siteKey}];
      s.rank = late.rank;
      s.siteKey = w.siteKey;
      if (s.windows == 0) s.firstSeq = w.firstSeq;
      ++s.windows;
      s.lastSeq = w.lastSeq;
      s.collectives += static_cast<int64_t>(w.lastSeq - w.firstSeq + 1);
      s.siteCollectives += w.siteCollectives;
      s.lostNs += late.lostNs;
      s.spanNs += w.medianSpanNs;
      auto& [own, others] = shares[{late.rank, w.siteKey}];
      own.push_back(static_cast<double>(w.waitNs[late.rank]) /
                    static_cast<double>(std::max<int64_t>(1, w.spanNs[late.rank])));
      std::vector<double> o;
      for (size_t j = 0; j < w.waitNs.size(); ++j) {
        if (static_cast<int>(j) != late.rank) {
          o.push_back(static_cast<double>(w.waitNs[j]) / static_cast<double>(std::max<int64_t>(1, w.spanNs[j])));
        }
      }
      others.push_back(medianD(o));
    }
  }
  std::vector<Straggler> out;
  for (auto& [key, s] : found) {
    s.siteWindows = siteWindows[s.siteKey];
    s.historyWindows = static_cast<int>(history_.size());
    if (s.windows < kMinWindows || 2 * s.windows < s.siteWindows) continue;
    const auto& [own, others] = shares[key];
    double a = 0, b = 0;
    for (double v : own) a += v;
    for (double v : others) b += v;
    s.ownWaitShare = a / static_cast<double>(own.size());
    s.othersWaitShare = b / static_cast<double>(others.size());
    if (static_cast<size_t>(s.rank) < hosts_.size()) s.host = hosts_[s.rank];
    out.push_back(s);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.lostNs > b.lostNs; });
  return out;
}

size_t StragglerBoard::period(const std::vector<uint64_t>& symbols) {
  const size_t n = symbols.size();
  for (size_t p = 1; p <= n / 2; ++p) {
    size_t same = 0;
    for (size_t i = 0; i + p < n; ++i) same += symbols[i] == symbols[i + p];
    if (same * 10 >= (n - p) * 8) return p;
  }
  return 0;
}

std::string StragglerContext::site(uint64_t key) const {
  auto it = sites.find(key);
  return it == sites.end() || it->second.empty() ? std::string("an unknown call site") : it->second;
}

namespace {

std::string ms(double ns) {
  std::ostringstream os;
  const double v = ns / 1e6;
  os << std::fixed << std::setprecision(v < 10 ? 2 : 1) << v << " ms";
  return os.str();
}

std::string percent(double share) {
  std::ostringstream os;
  os << static_cast<int>(std::lround(share * 100)) << "%";
  return os.str();
}

}  // namespace

std::string stragglerText(const Straggler& s, size_t groupSize, const StragglerContext& ctx) {
  const int64_t rank = ctx.globalRank(s.rank);
  std::ostringstream os;
  os << "straggler on group \"" << ctx.group << "\": rank " << rank;
  if (!s.host.empty()) os << " (host " << s.host << ")";
  os << " is the straggler: the other " << groupSize - 1 << " ranks waited on average ";
  if (s.mainLoop()) {
    if (ctx.collectivesPerStep > 0) {
      os << ms(s.lostNsPerCollective() * ctx.collectivesPerStep) << " per step (" << ms(s.lostNsPerCollective())
         << " per collective)";
    } else {
      os << ms(s.lostNsPerCollective()) << " per collective";
    }
    os << " for it over collectives " << s.firstSeq << "-" << s.lastSeq << " (about " << percent(s.share())
       << " of their time), most at " << ctx.site(s.siteKey);
  } else {
    // A phase (validation, an epoch end): most windows name nobody.
    os << ms(s.lostNsPerCollective()) << " per collective for it at " << ctx.site(s.siteKey)
       << ", a phase of the loop, over collectives " << s.firstSeq << "-" << s.lastSeq << " (about "
       << percent(s.share()) << " of their time in those windows)";
  }
  os << "; its own wait share is " << percent(s.ownWaitShare) << " against a median of " << percent(s.othersWaitShare)
     << " for the others (" << s.windows << " windows of collectives out of " << s.siteWindows
     << " there). Look at what rank " << rank
     << " does that the others do not at that point (data loading, logging or checkpointing on one rank, a slower "
        "or throttled device); torch_ext.stragglers() has the figures, TORCH_EXT_STRAGGLER=off turns this off.";
  return os.str();
}

Json stragglersJson(const StragglerBoard& board, const std::vector<Straggler>& named, size_t groupSize,
                    const StragglerContext& ctx, size_t maxWindows) {
  Json out = Json::object();
  out.set("group", ctx.group);
  out.set("size", static_cast<int64_t>(groupSize));
  out.set("threshold", board.threshold());
  out.set("analysed_up_to", board.analysedUpTo());
  out.set("collectives_per_step", ctx.collectivesPerStep > 0 ? Json(ctx.collectivesPerStep) : Json());
  Json list = Json::array();
  for (const auto& s : named) {
    Json j = Json::object();
    j.set("rank", ctx.globalRank(s.rank));
    j.set("group_rank", s.rank);
    j.set("host", s.host);
    j.set("site", ctx.site(s.siteKey));
    j.set("phase", !s.mainLoop());
    j.set("windows", s.windows);
    j.set("site_windows", s.siteWindows);
    j.set("first_seq", s.firstSeq);
    j.set("last_seq", s.lastSeq);
    j.set("collectives", s.collectives);
    j.set("lost_s", static_cast<double>(s.lostNs) / 1e9);
    j.set("span_s", static_cast<double>(s.spanNs) / 1e9);
    j.set("share", s.share());
    j.set("extra_s_per_collective", s.lostNsPerCollective() / 1e9);
    j.set("extra_s_per_step", ctx.collectivesPerStep > 0 && s.mainLoop()
                                  ? Json(s.lostNsPerCollective() * ctx.collectivesPerStep / 1e9)
                                  : Json());
    j.set("own_wait_share", s.ownWaitShare);
    j.set("others_wait_share", s.othersWaitShare);
    j.set("waited_ranks", static_cast<int64_t>(groupSize - 1));
    j.set("text", stragglerText(s, groupSize, ctx));
    list.push(std::move(j));
  }
  out.set("stragglers", std::move(list));
  Json windows = Json::array();
  const auto& h = board.history();
  for (size_t i = h.size() > maxWindows ? h.size() - maxWindows : 0; i < h.size(); ++i) {
    const auto& w = h[i];
    Json j = Json::object();
    j.set("first_seq", w.firstSeq);
    j.set("last_seq", w.lastSeq);
    Json waits = Json::array(), spans = Json::array(), late = Json::array();
    for (auto v : w.waitNs) waits.push(static_cast<double>(v) / 1e9);
    for (auto v : w.spanNs) spans.push(static_cast<double>(v) / 1e9);
    for (const auto& l : w.late) {
      Json lj = Json::object();
      lj.set("rank", ctx.globalRank(l.rank));
      lj.set("lost_s", static_cast<double>(l.lostNs) / 1e9);
      late.push(std::move(lj));
    }
    j.set("wait_s", std::move(waits));
    j.set("span_s", std::move(spans));
    j.set("site", ctx.site(w.siteKey));
    j.set("late", std::move(late));
    windows.push(std::move(j));
  }
  out.set("windows", std::move(windows));
  return out;
}

}  // namespace torch_ext
