#include "guard/watchdog/GroupStragglers.h"

#include "guard/Clock.h"
#include "guard/Config.h"
#include "guard/Runtime.h"
#include "guard/collective/CallSite.h"
#include "guard/store/StoreKeys.h"

#include <map>

namespace torch_ext {

namespace {

// A named straggler is warned about again (same rank, same call site) after
// this long. The analysis is written to the store for the other ranks when
// whom it names changes, else this often (its figures).
constexpr int64_t kStragglerRewarnNs = 300'000'000'000;
constexpr int64_t kStragglerRepublishNs = 10'000'000'000;
// The last collectives whose pattern gives the collectives per training step.
constexpr size_t kStepPatternEntries = 256;
// The last windows torch_ext.stragglers() shows.
constexpr size_t kStragglerJsonWindows = 8;

// Names for the board's findings (call sites described once per process and
// kept in `siteNames`), and, when someone is named, the collectives per step:
// the period of the recent collectives' pattern (call site and fingerprint).
StragglerContext stragglerContext(GroupState& st, const StragglerBoard& board, const std::vector<Straggler>& named,
                                  std::map<uint64_t, std::string>& siteNames) {
  StragglerContext c;
  c.group = st.label();
  c.globalRanks = st.id().globalRanks;
  auto& sites = CallSites::instance();
  auto name = [&](uint64_t key) {
    if (key == 0) return;
    auto it = siteNames.find(key);
    if (it == siteNames.end()) it = siteNames.emplace(key, sites.describe(sites.byStableKey(key))).first;
    c.sites[key] = it->second;
  };
  const auto& h = board.history();
  for (size_t i = h.size() > kStragglerJsonWindows ? h.size() - kStragglerJsonWindows : 0; i < h.size(); ++i) {
    name(h[i].siteKey);
  }
  for (const auto& s : named) name(s.siteKey);
  if (named.empty()) return c;
  std::vector<uint64_t> pattern;
  for (const auto& e : st.ledger().entries(kStepPatternEntries)) {
    // The group's first collectives are set-up (DDP's broadcasts), not steps.
    if (e.seq > kSetupCollectives) pattern.push_back(e.fp.hash * 1000003u ^ e.callSite);
  }
  if (const size_t p = StragglerBoard::period(pattern)) c.collectivesPerStep = static_cast<double>(p);
  return c;
}

}  // namespace

void GroupStragglers::afterExchange(GroupState& st) {
  const int size = st.id().size;
  if (st.id().rank != 0 || size <= 1 || st.config().stragglerThreshold <= 0 || st.failed()) return;
  if (++exchanges_ % static_cast<uint64_t>(stragglerLookEvery(size)) == 0) look(st);
}

void GroupStragglers::look(GroupState& st) {
  GroupStore& store = st.store();
  const int size = st.id().size;
  std::vector<std::string> statusKeys;
  for (int r = 0; r < size; ++r) statusKeys.push_back(keys::status(r));
  if (!allStatusSeen_) {
    // multi_get waits for a missing key: read only once every rank has said something.
    auto there = store.check(statusKeys);
    if (!there.ok() || !there.value) return;
    allStatusSeen_ = true;
  }
  auto values = store.multiGet(statusKeys);
  if (!values.ok() || values.value.size() != statusKeys.size()) return;
  std::vector<std::optional<RankWaits>> ranks(size);
  for (int r = 0; r < size; ++r) {
    auto rec = StatusRecord::decode(values.value[r]);
    if (rec && rec->phase == RankPhase::Running && !rec->waits.empty()) ranks[r] = RankWaits::decode(rec->waits);
  }
  if (!board_) board_ = std::make_unique<StragglerBoard>(st.config().stragglerThreshold);
  if (board_->look(ranks) == 0) return;

  const std::vector<Straggler> named = board_->named();
  StragglerContext names = stragglerContext(st, *board_, named, siteNames_);
  const int64_t now = steadyNs();
  for (const auto& s : named) {
    auto& warned = warnedNs_[{s.rank, s.siteKey}];
    if (warned != 0 && now - warned < kStragglerRewarnNs) continue;
    warned = now;
    logMessage(LogLevel::Warning, "guard: " + stragglerText(s, static_cast<size_t>(size), names));
  }
  std::string json = stragglersJson(*board_, named, static_cast<size_t>(size), names, kStragglerJsonWindows).dump();
  std::string who;  // the ranks and sites named, to publish at once when they change
  for (const auto& s : named) who += std::to_string(s.rank) + "@" + std::to_string(s.siteKey) + " ";
  {
    std::lock_guard<std::mutex> lock(jsonMu_);
    json_ = json;
  }
  const bool due = publishedNs_ == 0 || who != publishedWho_ || now - publishedNs_ >= kStragglerRepublishNs;
  if (due && store.set(keys::kStragglers, json)) {
    publishedNs_ = now;
    publishedWho_ = who;
  }
}

std::string GroupStragglers::latest(GroupState& st) {
  if (st.id().rank == 0) {
    std::lock_guard<std::mutex> lock(jsonMu_);
    return json_;
  }
  return st.store().get(keys::kStragglers).value_or("");
}

}  // namespace torch_ext
