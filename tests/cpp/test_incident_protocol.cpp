// IncidentProtocol: ranks answering an incident together through an in-memory
// store, each rank through its own fault-injecting view of it. Most cases step
// the ranks in turn on a fake clock (deterministic); one runs them as threads.
#include "guard/watchdog/IncidentProtocol.h"
#include "guard/Clock.h"

#include "guard/watchdog/Dumps.h"
#include "guard/store/StoreKeys.h"
#include "guard/report/DumpAnalysis.h"
#include "guard/report/StatusRecord.h"
#include "store_testing.h"

#include <gtest/gtest.h>

#include <deque>
#include <memory>
#include <mutex>
#include <thread>

using namespace torch_ext;
using std::chrono::milliseconds;

namespace test_incident_protocol {

namespace {

constexpr int64_t kSec = 1'000'000'000;
constexpr int64_t kTick = 200'000'000;

Fingerprint allReduce(int64_t n) {
  return FingerprintBuilder(Op::AllReduce)
      .meta(at::kFloat, {n}, c10::DeviceType::CPU)
      .reduceOp(c10d::ReduceOp(c10d::ReduceOp::SUM))
      .finish();
}

struct Rank {
  Rank(int r, int size, const c10::intrusive_ptr<c10d::Store>& shared) {
    faulty = c10::make_intrusive<testkit::FaultyStore>(shared);
    Config cfg;
    cfg.ledgerSize = 64;
    state = std::make_shared<GroupState>(GroupIdentity{"0", r, size, {}}, cfg,
                                         testkit::groupStore(faulty, milliseconds(500)), milliseconds(30000));
    state->setDesc("default_pg");
    protocol = std::make_unique<IncidentProtocol>(
        *state, IncidentProtocol::Hooks{
                    [this](const Incident& inc) { return toJson(takeSnapshot(inc.id(), {state}, 64)).dump(); },
                    [this](const Incident& inc, const Verdict& v) {
                      std::lock_guard<std::mutex> lock(mu);
                      verdicts.push_back(v);
                    },
                    nullptr,  // positions: not published job-wide here
                    [this](const std::string& requestId) {
                      ++liveAnswers;
                      return toJson(takeSnapshot(requestId, {state}, 64)).dump();
                    }});
  }
  void op(int64_t n, bool pending) {
    uint64_t seq = 0;
    uint64_t id = state->ledger().record(allReduce(n), 0, &seq);
    if (!pending) state->ledger().complete(id, true);
  }
  void publishStatus(int64_t nowNs) {
    state->store().set("st/" + std::to_string(state->id().rank),
                       StatusRecord::of(RankPhase::Running, nowNs, state->ledger().progress()).encode());
  }
  size_t acted() {
    std::lock_guard<std::mutex> lock(mu);
    return verdicts.size();
  }

  c10::intrusive_ptr<testkit::FaultyStore> faulty;
  std::shared_ptr<GroupState> state;
  std::unique_ptr<IncidentProtocol> protocol;
  std::mutex mu;
  std::vector<Verdict> verdicts;
  int liveAnswers = 0;
  bool alive = true;
};

// N ranks on one in-memory store; #1 completes everywhere, #2 is pending on
// every rank but `missing`, which has not issued it.
struct World {
  World(int size, int missing, int64_t t0) : now(t0) {
    for (int r = 0; r < size; ++r) ranks.emplace_back(r, size, shared);
    for (int r = 0; r < size; ++r) {
      ranks[r].op(4, false);
      if (r != missing) ranks[r].op(8, true);
      ranks[r].publishStatus(now);
    }
  }
  // One tick for every live rank, then the clock moves on.
  void step() {
    for (auto& r : ranks) {
      if (r.alive) r.protocol->progress(now);
    }
    now += kTick;
  }
  // Steps until every live rank acted on a verdict or `maxTicks` passed.
  int run(int maxTicks) {
    for (int t = 0; t < maxTicks; ++t) {
      bool all = true;
      for (auto& r : ranks) all = all && (!r.alive || r.acted() > 0);
      if (all) return t;
      step();
    }
    return maxTicks;
  }
  c10::intrusive_ptr<c10d::Store> shared = c10::make_intrusive<c10d::HashStore>();
  std::deque<Rank> ranks;
  int64_t now;
};

}  // namespace

TEST(IncidentProtocol, AHangIsAnsweredByEveryRankWithOneVerdict) {
  World w(3, 2, 1000 * kSec);
  EXPECT_TRUE(w.ranks[0].protocol->post(Incident{IncidentKind::Hang, IncidentSubject::collective(2), 0, ""}));
  EXPECT_FALSE(w.ranks[1].protocol->post(
      Incident{IncidentKind::Hang, IncidentSubject::collective(2), 1, ""}));  // raised already
  const int ticks = w.run(50);
  EXPECT_LT(ticks, 10);  // all snapshots in: no deadline was needed
  for (auto& r : w.ranks) {
    ASSERT_EQ(r.acted(), 1u);
    const Verdict& v = r.verdicts[0];
    EXPECT_EQ(v.kind, Verdict::Kind::Hang);
    EXPECT_EQ(v.text, w.ranks[0].verdicts[0].text);  // one verdict, published by the analyst
    EXPECT_EQ(v.waiting, (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(v.notArrived, (std::vector<int64_t>{2}));
    EXPECT_TRUE(v.gone.empty());
    EXPECT_FALSE(r.protocol->open());
  }
}

TEST(IncidentProtocol, WhenTheAnalystDiesTheOthersAnalyseForThemselves) {
  World w(3, 2, 1000 * kSec);
  ASSERT_TRUE(w.ranks[0].protocol->post(Incident{IncidentKind::Hang, IncidentSubject::collective(2), 0, ""}));
  w.ranks[0].alive = false;  // dies right after raising: no snapshot, no verdict
  const int ticks = w.run(100);
  const int64_t waited = ticks * kTick;
  EXPECT_GE(waited, IncidentProtocol::reportWaitNs(0.2));
  EXPECT_LT(waited, IncidentProtocol::reportWaitNs(0.2) + 3 * kSec);
  for (int r : {1, 2}) {
    ASSERT_EQ(w.ranks[r].acted(), 1u);
    const Verdict& v = w.ranks[r].verdicts[0];
    EXPECT_EQ(v.gone, (std::vector<int64_t>{0})) << v.text;
    EXPECT_NE(v.text.find("rank 0: no heartbeat for"), std::string::npos) << v.text;
  }
}

TEST(IncidentProtocol, ARankThatNeverAnswersIsCalledGoneAfterTheSnapshotWait) {
  World w(3, 1, 1000 * kSec);
  w.ranks[1].alive = false;  // frozen: never takes part
  ASSERT_TRUE(w.ranks[0].protocol->post(Incident{IncidentKind::Abort, IncidentSubject::collective(2), 0, ""}));
  const int ticks = w.run(100);
  EXPECT_GE(ticks * kTick, IncidentProtocol::snapWaitNs(0.2));
  EXPECT_LT(ticks * kTick, IncidentProtocol::reportWaitNs(0.2));  // the analyst itself decided
  for (int r : {0, 2}) {
    ASSERT_EQ(w.ranks[r].acted(), 1u);
    EXPECT_EQ(w.ranks[r].verdicts[0].gone, (std::vector<int64_t>{1}));
  }
}

TEST(IncidentProtocol, StoreLostMidIncidentStopsProgressWithoutBlocking) {
  World w(3, 2, 1000 * kSec);
  ASSERT_TRUE(w.ranks[0].protocol->post(Incident{IncidentKind::Hang, IncidentSubject::collective(2), 0, ""}));
  w.step();  // every rank saw the alert and answered
  w.ranks[1].faulty->setMode(testkit::FaultyStore::Mode::Fail);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 30; ++i) w.step();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_EQ(w.ranks[1].state->store().health(), StoreHealth::Lost);
  EXPECT_EQ(w.ranks[1].acted(), 0u);
  EXPECT_TRUE(w.ranks[1].protocol->open());  // the watchdog fails the group from here
  EXPECT_EQ(w.ranks[1].protocol->openIncidents()[0].id(), "hang:2");
  EXPECT_EQ(w.ranks[0].acted(), 1u);  // the others are unaffected
  EXPECT_EQ(w.ranks[2].acted(), 1u);
  // A post through a lost store says so.
  bool failed = false;
  EXPECT_FALSE(
      w.ranks[1].protocol->post(Incident{IncidentKind::Abort, IncidentSubject::collective(2), 1, ""}, &failed));
  EXPECT_TRUE(failed);
}

TEST(IncidentProtocol, AFrozenStoreMidIncidentCostsEachRankOneBoundedCall) {
  World w(2, 1, 1000 * kSec);
  ASSERT_TRUE(w.ranks[0].protocol->post(Incident{IncidentKind::Hang, IncidentSubject::collective(2), 0, ""}));
  w.ranks[0].faulty->setMode(testkit::FaultyStore::Mode::Block);
  const auto t0 = std::chrono::steady_clock::now();
  w.ranks[0].protocol->progress(w.now);
  w.ranks[0].protocol->progress(w.now + kTick);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 2.0);  // one call ran into the 0.5 s bound; the rest were refused at once
  EXPECT_EQ(w.ranks[0].state->store().health(), StoreHealth::NotAnswering);
  w.ranks[0].faulty->release();
}

TEST(IncidentProtocol, AVerdictPublishedBeforeTheStoreIsLostReachesOnlyThoseWhoReadIt) {
  World w(3, 2, 1000 * kSec);
  ASSERT_TRUE(w.ranks[0].protocol->post(Incident{IncidentKind::Hang, IncidentSubject::collective(2), 0, ""}));
  // Ranks 0 and 1 take part until the verdict is out; rank 2's store dies first.
  w.ranks[2].protocol->progress(w.now);  // rank 2 answers its snapshot
  w.ranks[2].faulty->setMode(testkit::FaultyStore::Mode::Fail);
  w.ranks[2].alive = false;
  w.run(50);
  EXPECT_EQ(w.ranks[0].acted(), 1u);
  EXPECT_EQ(w.ranks[1].acted(), 1u);
  w.ranks[2].alive = true;
  w.step();
  EXPECT_EQ(w.ranks[2].acted(), 0u);
  EXPECT_TRUE(w.ranks[2].protocol->open());
  EXPECT_EQ(w.ranks[2].state->store().health(), StoreHealth::Lost);
}

TEST(IncidentProtocol, APublishedVerdictIsActedOnEvenIfItsPublisherIsGone) {
  World w(3, -1, 1000 * kSec);
  Verdict v;
  v.kind = Verdict::Kind::Mismatch;
  v.text = "send/recv on group \"default_pg\" do not pair";
  v.reporter = 1;
  ASSERT_TRUE(w.ranks[1].protocol->publishVerdict(Incident{IncidentKind::Mismatch, IncidentSubject::any(), 1, ""}, v));
  EXPECT_FALSE(w.ranks[0].protocol->publishVerdict(Incident{IncidentKind::Mismatch, IncidentSubject::any(), 0, ""}, v));
  w.ranks[1].alive = false;  // raised and exited at once
  w.run(20);
  for (int r : {0, 2}) {
    ASSERT_EQ(w.ranks[r].acted(), 1u);
    EXPECT_EQ(w.ranks[r].verdicts[0].kind, Verdict::Kind::Mismatch);
    EXPECT_EQ(w.ranks[r].verdicts[0].text, v.text);
  }
}

TEST(IncidentProtocol, RanksAsThreadsAgreeOnTheLateRank) {
  World w(4, 3, wallNs());
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      // Ranks 1 and 2 raise it at about the same time: one wins, both take part.
      if (r == 1 || r == 2)
        w.ranks[r].protocol->post(Incident{IncidentKind::Hang, IncidentSubject::collective(2), r, ""});
      while (!stop && w.ranks[r].acted() == 0) {
        w.ranks[r].protocol->progress(wallNs());
        std::this_thread::sleep_for(milliseconds(20));
      }
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    bool all = true;
    for (auto& r : w.ranks) all = all && r.acted() > 0;
    if (all) break;
    std::this_thread::sleep_for(milliseconds(20));
  }
  stop = true;
  for (auto& t : threads) t.join();
  for (auto& r : w.ranks) {
    ASSERT_EQ(r.acted(), 1u);
    EXPECT_EQ(r.verdicts[0].notArrived, (std::vector<int64_t>{3}));
    EXPECT_EQ(r.verdicts[0].text, w.ranks[0].verdicts[0].text);
  }
}

// A live request (`torch-ext-diagnose live`), posted by a plain store client as
// the CLI does: every rank answers once with its snapshot at its next step, and
// nothing else happens (no analyst, no verdict, nothing left open).
TEST(IncidentProtocol, ALiveRequestIsAnsweredOnceByEveryRankWithoutAVerdict) {
  World w(3, 2, 1000 * kSec);
  w.ranks[1].alive = false;  // stopped: it cannot answer
  const std::string id = std::string(keys::kLiveRequestPrefix) + "asker-1";
  auto bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  const std::string p = keys::kPrefix;
  const int64_t k = w.shared->add(p + keys::kAlerts, 1);
  w.shared->set(p + keys::alert(k), bytes(id + "\n-1\n"));
  w.step();
  w.step();  // a second read of the alerts finds nothing new
  EXPECT_EQ(w.ranks[0].liveAnswers, 1);
  EXPECT_EQ(w.ranks[1].liveAnswers, 0);
  EXPECT_EQ(w.ranks[2].liveAnswers, 1);
  std::vector<RankSnapshot> snaps;
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(w.ranks[r].protocol->open());
    EXPECT_EQ(w.ranks[r].acted(), 0u);
    const bool there = w.shared->check({p + keys::snapshot(id, r)});
    EXPECT_EQ(there, r != 1);
    if (!there) continue;
    auto v = w.shared->get(p + keys::snapshot(id, r));
    snaps.push_back(readDump({"rank" + std::to_string(r), std::string(v.begin(), v.end())}));
    EXPECT_EQ(snaps.back().incident, id);
  }
  EXPECT_FALSE(w.shared->check({p + keys::report(id)}));
  EXPECT_FALSE(w.shared->check({p + keys::once(id)}));
  // The asker's analysis: rank 2 has not arrived; rank 1 is named from its last status.
  std::map<int64_t, StatusRecord> absent{
      {1, StatusRecord::of(RankPhase::Running, w.now - 4 * kSec, SeqProgress{2, 0})}};
  auto findings = analyzeDumps(snaps, &absent);
  ASSERT_EQ(findings.size(), 1u);
  const Verdict& v = findings[0].verdict;
  EXPECT_EQ(v.kind, Verdict::Kind::Hang);
  EXPECT_EQ(v.notArrived, (std::vector<int64_t>{2}));
  EXPECT_EQ(v.gone, (std::vector<int64_t>{1}));
  EXPECT_NE(v.text.find("rank 1: no heartbeat for"), std::string::npos) << v.text;
  // Its keys go with the group's at leave, like any incident's.
  const auto gone = w.ranks[0].protocol->incidentKeys();
  EXPECT_NE(std::find(gone.begin(), gone.end(), keys::snapshot(id, 2)), gone.end());
}

// `torch-ext-diagnose live --ranks 0-7,12`: only the ranks asked answer.
TEST(IncidentProtocol, ALiveRequestForSomeRanksIsAnsweredByThoseOnly) {
  EXPECT_TRUE(keys::specAsks("", 5));
  EXPECT_TRUE(keys::specAsks("0-7,12", 0));
  EXPECT_TRUE(keys::specAsks("0-7,12", 7));
  EXPECT_FALSE(keys::specAsks("0-7,12", 8));
  EXPECT_TRUE(keys::specAsks("0-7,12", 12));
  EXPECT_FALSE(keys::specAsks("0-7,12", 13));
  EXPECT_FALSE(keys::specAsks("x,", 0));  // nothing readable asks nobody

  World w(3, 2, 1000 * kSec);
  const std::string id = std::string(keys::kLiveRequestPrefix) + "asker-2";
  const std::string p = keys::kPrefix;
  const std::string desc = id + "\n-1\n1-2";
  const int64_t k = w.shared->add(p + keys::kAlerts, 1);
  w.shared->set(p + keys::alert(k), std::vector<uint8_t>(desc.begin(), desc.end()));
  w.step();
  EXPECT_EQ(w.ranks[0].liveAnswers, 0);
  EXPECT_EQ(w.ranks[1].liveAnswers, 1);
  EXPECT_EQ(w.ranks[2].liveAnswers, 1);
  std::vector<RankSnapshot> snaps;
  for (int r = 1; r < 3; ++r) {
    auto v = w.shared->get(p + keys::snapshot(id, r));
    snaps.push_back(readDump({"rank" + std::to_string(r), std::string(v.begin(), v.end())}));
  }
  // Rank 0, not asked, is neither waiting nor gone in the verdict.
  const std::set<int64_t> notAsked{0};
  auto findings = analyzeDumps(snaps, nullptr, &notAsked);
  ASSERT_EQ(findings.size(), 1u);
  const Verdict& v = findings[0].verdict;
  EXPECT_EQ(v.kind, Verdict::Kind::Hang);
  EXPECT_EQ(v.waiting, (std::vector<int64_t>{1}));
  EXPECT_EQ(v.notArrived, (std::vector<int64_t>{2}));
  EXPECT_TRUE(v.gone.empty());
  EXPECT_NE(v.text.find("not asked (outside the live report's ranks): rank 0"), std::string::npos) << v.text;
  // At leave, only the ranks it asked may have left a snapshot behind.
  const auto left = w.ranks[0].protocol->incidentKeys();
  EXPECT_EQ(std::find(left.begin(), left.end(), keys::snapshot(id, 0)), left.end());
  EXPECT_NE(std::find(left.begin(), left.end(), keys::snapshot(id, 2)), left.end());
  EXPECT_EQ(std::find(left.begin(), left.end(), keys::once(id)), left.end());
}

}  // namespace test_incident_protocol
