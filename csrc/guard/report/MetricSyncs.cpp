#include "guard/report/MetricSyncs.h"

#include "guard/report/RankList.h"

#include <algorithm>
#include <map>
#include <sstream>

namespace torch_ext {

namespace {

void addName(std::vector<std::string>& names, const std::string& n) {
  if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
}

std::string joinNames(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + names[i];
  return out;
}

}  // namespace

std::vector<std::string> metricRunAround(uint64_t seq, uint64_t lastSeq, uint64_t upTo,
                                         const std::function<std::optional<std::string>(uint64_t)>& metricAt) {
  std::vector<std::string> names;
  upTo = std::min(upTo, lastSeq);  // nothing after the rank's last collective
  uint64_t p = std::min(seq, upTo);
  if (p == 0) return names;
  if (!metricAt(p) && p == seq) --p;
  if (p == 0 || !metricAt(p)) return names;
  uint64_t lo = p;
  while (lo > 1 && metricAt(lo - 1)) --lo;
  uint64_t hi = p;
  while (hi < upTo && metricAt(hi + 1)) ++hi;
  for (uint64_t s = lo; s <= hi; ++s) {
    if (auto m = metricAt(s)) addName(names, *m);
  }
  return names;
}

std::string formatMetricSyncs(const std::vector<RankMetrics>& ranks) {
  // Ranks grouped by the names they synced, in order of first appearance.
  std::vector<std::pair<std::vector<std::string>, std::vector<int64_t>>> groups;
  std::vector<std::string> all;
  std::vector<int64_t> unknown;
  for (const auto& r : ranks) {
    if (!r.known) {
      unknown.push_back(r.globalRank);
      continue;
    }
    for (const auto& n : r.names) addName(all, n);
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == r.names; });
    if (it == groups.end()) {
      groups.push_back({r.names, {r.globalRank}});
    } else {
      it->second.push_back(r.globalRank);
    }
  }
  if (groups.size() < 2) return "";
  std::ostringstream os;
  os << "\n  metric syncs here: ";
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& [names, who] = groups[i];
    os << (i ? "; " : "") << formatRanks(who) << " synced ";
    if (names.empty()) {
      os << "none";
    } else {
      os << joinNames(names);
      // "only": another rank synced these and more.
      const bool fewer = std::any_of(groups.begin(), groups.end(), [&](const auto& g) {
        return g.first.size() > names.size() && std::all_of(names.begin(), names.end(), [&](const std::string& n) {
                 return std::find(g.first.begin(), g.first.end(), n) != g.first.end();
               });
      });
      if (fewer) os << " only";
    }
  }
  if (!unknown.empty()) os << "; " << formatRanks(unknown) << ": not known (no ledger window)";
  // Said, for ranks that sent no ledger: where their list comes from.
  std::map<int64_t, std::vector<int64_t>> readFrom;
  for (const auto& r : ranks) {
    if (r.known && r.readFrom >= 0) readFrom[r.readFrom].push_back(r.globalRank);
  }
  for (const auto& [from, who] : readFrom) {
    os << " (" << formatRanks(who) << " sent no ledger: read from rank " << from << "'s, up to the last collective "
       << (who.size() == 1 ? "it" : "each") << " issued)";
  }
  for (const auto& n : all) {
    std::vector<int64_t> with, without;
    for (const auto& r : ranks) {
      if (!r.known) continue;
      const bool has = std::find(r.names.begin(), r.names.end(), n) != r.names.end();
      (has ? with : without).push_back(r.globalRank);
    }
    if (without.empty()) continue;
    os << "\n  " << n << " is synced on " << formatRanks(with) << " only: " << formatRanks(without)
       << " never synced it here";
  }
  return os.str();
}

}  // namespace torch_ext
