// WaitGraph: waits across process groups, from each rank's position in each
// of its groups (what RankSnapshot::waits carries).
#include "guard/report/WaitGraph.h"
#include "guard/report/Report.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace torch_ext;

namespace test_wait_graph {

namespace {

constexpr int64_t kSec = 1000000000;
constexpr int64_t kNow = 1700000000 * kSec;

// Rank's position in a group: issued up to `lastSeq`, waiting in `pendingSeq` (0: none).
GroupWait pos(const std::string& group, const std::string& label, std::vector<int64_t> ranks, uint64_t lastSeq,
              uint64_t pendingSeq = 0, const std::string& where = "", int64_t startNs = kNow - 2 * kSec) {
  GroupWait w;
  w.group = group;
  w.label = label;
  w.ranks = std::move(ranks);
  w.lastSeq = lastSeq;
  if (pendingSeq) {
    w.pending = true;
    w.seq = pendingSeq;
    w.op = "all_reduce(float32[4], SUM)";
    w.where = where;
    w.startNs = startNs;
  }
  return w;
}

const std::vector<int64_t> kAll{0, 1, 2};

// torchrec#4149: rank 0 in dp #1, ranks 1,2 in mp #1, over the same ranks.
WaitGraph crossed() {
  WaitGraph g;
  g.addRank(0, {pos("1", "dp", kAll, 1, 1, "t.py:10 in sync_grads"), pos("2", "mp", kAll, 0)});
  for (int64_t r : {1, 2})
    g.addRank(r, {pos("1", "dp", kAll, 0), pos("2", "mp", kAll, 1, 1, "t.py:20 in sync_embeddings")});
  return g;
}

}  // namespace

TEST(WaitGraph, CrossedGroupsAreACycleNamingEveryEdge) {
  const WaitGraph g = crossed();
  const WaitFinding f = g.follow("1", 1, {1, 2});
  ASSERT_EQ(f.shape, WaitShape::Cycle);
  EXPECT_EQ(f.groups, (std::vector<std::string>{"dp", "mp"}));
  EXPECT_EQ(f.headline(), "deadlock across groups dp and mp");
  EXPECT_EQ(f.owner, "1");
  EXPECT_EQ(f.loop, kAll);
  ASSERT_EQ(f.sites.size(), 2u);
  EXPECT_EQ(f.sites[0].label, "dp");  // starts at the owner's site
  EXPECT_EQ(f.sites[0].waiters, (std::vector<int64_t>{0}));
  EXPECT_EQ(f.sites[0].waitsFor, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(f.sites[1].waiters, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(f.sites[1].waitsFor, (std::vector<int64_t>{0}));
  const std::string text = f.describe(kNow);
  EXPECT_NE(text.find("\n  rank 0 waits in collective #1 all_reduce(float32[4], SUM) on group \"dp\" (at t.py:10 in "
                      "sync_grads, 2.0 s) for ranks 1,2, which wait in #1 on group \"mp\""),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\n  ranks 1,2 wait in collective #1 all_reduce(float32[4], SUM) on group \"mp\" (at t.py:20 in "
                      "sync_embeddings, 2.0 s) for rank 0, which waits in #1 on group \"dp\""),
            std::string::npos)
      << text;
  // The same cycle seen from the other group, and with no stuck collective given.
  const WaitFinding fromMp = g.follow("2", 1, {0});
  ASSERT_EQ(fromMp.shape, WaitShape::Cycle);
  EXPECT_EQ(fromMp.describe(kNow), text);
  EXPECT_EQ(g.anyCycle().describe(kNow), text);
}

TEST(WaitGraph, ThreeGroupCycle) {
  // 0 waits in a for 1; 1 waits in b for 2; 2 waits in c for 0 (pairwise groups).
  WaitGraph g;
  g.addRank(0, {pos("a", "a", {0, 1}, 1, 1, "x"), pos("c", "c", {2, 0}, 0)});
  g.addRank(1, {pos("a", "a", {0, 1}, 0), pos("b", "b", {1, 2}, 1, 1, "y")});
  g.addRank(2, {pos("b", "b", {1, 2}, 0), pos("c", "c", {2, 0}, 1, 1, "z")});
  const WaitFinding f = g.follow("a", 1, {1});
  ASSERT_EQ(f.shape, WaitShape::Cycle);
  EXPECT_EQ(f.groupList(), "a, b and c");
  ASSERT_EQ(f.sites.size(), 3u);
  // Walked in wait order: a's waiter waits for b's, which waits for c's.
  EXPECT_EQ(f.sites[0].group, "a");
  EXPECT_EQ(f.sites[1].group, "b");
  EXPECT_EQ(f.sites[2].group, "c");
  // No group holds all three ranks: the lowest-named group on the loop logs it
  // (its analyst follows the waits through the positions ranks publish).
  EXPECT_EQ(f.owner, "a");
  // Seen from group a alone (ranks 0,1), the waits leave the view at rank 2: a chain.
  WaitGraph onlyA;
  onlyA.addRank(0, {pos("a", "a", {0, 1}, 1, 1, "x"), pos("c", "c", {2, 0}, 0)});
  onlyA.addRank(1, {pos("a", "a", {0, 1}, 0), pos("b", "b", {1, 2}, 1, 1, "y")});
  const WaitFinding partial = onlyA.follow("a", 1, {1});
  EXPECT_EQ(partial.shape, WaitShape::Chain);
  EXPECT_EQ(partial.endUnknown, (std::vector<int64_t>{2}));
}

TEST(WaitGraph, ThreeGroupsOverTheSameRanksAreOneLoopWhicheverGroupLooks) {
  // a, b, c over ranks 0,1,2: rank 0 issued a then b, rank 1 b then c, rank 2 c then a.
  WaitGraph g;
  g.addRank(0, {pos("a", "a", kAll, 1, 1, "x"), pos("b", "b", kAll, 0), pos("c", "c", kAll, 0)});
  g.addRank(1, {pos("a", "a", kAll, 0), pos("b", "b", kAll, 1, 1, "y"), pos("c", "c", kAll, 0)});
  g.addRank(2, {pos("a", "a", kAll, 0), pos("b", "b", kAll, 0), pos("c", "c", kAll, 1, 1, "z")});
  for (const auto& [group, missing] :
       std::vector<std::pair<std::string, std::vector<int64_t>>>{{"a", {1, 2}}, {"b", {0, 2}}, {"c", {0, 1}}}) {
    const WaitFinding f = g.follow(group, 1, missing);
    ASSERT_EQ(f.shape, WaitShape::Cycle) << group;
    EXPECT_EQ(f.headline(), "deadlock across groups a, b and c") << group;
    EXPECT_EQ(f.owner, "a") << group;  // every view agrees on who logs it
    EXPECT_EQ(f.loop, kAll) << group;
  }
}

TEST(WaitGraph, ChainEndsAtTheComputingRank) {
  // dp = {0,1,2}, mp = {1,2}: 0 waits in dp for 1,2; 1 waits in mp for 2; 2 computes.
  WaitGraph g;
  g.addRank(0, {pos("dp", "dp", kAll, 1, 1, "a")});
  g.addRank(1, {pos("dp", "dp", kAll, 0), pos("mp", "mp", {1, 2}, 1, 1, "b")});
  g.addRank(2, {pos("dp", "dp", kAll, 0), pos("mp", "mp", {1, 2}, 0)});
  const WaitFinding f = g.follow("dp", 1, {1, 2});
  ASSERT_EQ(f.shape, WaitShape::Chain);
  EXPECT_EQ(f.end, (std::vector<int64_t>{2}));
  EXPECT_TRUE(f.endUnknown.empty());
  EXPECT_EQ(f.headline(), "");
  const std::string text = f.describe(kNow);
  EXPECT_NE(text.find("\n  rank 1 waits in collective #1 all_reduce(float32[4], SUM) on group \"mp\""),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("\n  everything waits for rank 2: in no guarded collective"), std::string::npos) << text;
  EXPECT_EQ(g.anyCycle().shape, WaitShape::None);
}

TEST(WaitGraph, ChainEndOutsideTheViewIsSaidToBeUnknown) {
  // dp = {0,1} seen alone: 1 waits in mp = {1,2} for 2, whose position is not known here.
  WaitGraph g;
  g.addRank(0, {pos("dp", "dp", {0, 1}, 1, 1, "a")});
  g.addRank(1, {pos("dp", "dp", {0, 1}, 0), pos("mp", "mp", {1, 2}, 1, 1, "b")});
  const WaitFinding f = g.follow("dp", 1, {1});
  ASSERT_EQ(f.shape, WaitShape::Chain);
  EXPECT_EQ(f.endUnknown, (std::vector<int64_t>{2}));
  EXPECT_NE(f.describe(kNow).find("everything waits for rank 2 (not a member of this group"), std::string::npos);
}

TEST(WaitGraph, ASingleSleepingRankIsNeitherChainNorCycle) {
  WaitGraph g;
  g.addRank(0, {pos("w", "default_pg", kAll, 2, 2, "a")});
  g.addRank(1, {pos("w", "default_pg", kAll, 2, 2, "a")});
  g.addRank(2, {pos("w", "default_pg", kAll, 1)});
  EXPECT_EQ(g.follow("w", 2, {2}).shape, WaitShape::None);
  EXPECT_EQ(g.anyCycle().shape, WaitShape::None);
}

TEST(WaitGraph, ARankWaitsWhereItIssuedLast) {
  // An older async op pending in dp, the main thread blocked in mp since.
  WaitGraph g;
  g.addRank(0, {pos("dp", "dp", kAll, 3, 3, "a", kNow - 5 * kSec), pos("mp", "mp", kAll, 1, 1, "b", kNow - kSec)});
  ASSERT_NE(g.waitOf(0), nullptr);
  EXPECT_EQ(g.waitOf(0)->group, "mp");
  EXPECT_TRUE(g.issued(0, "dp", 3));
  EXPECT_FALSE(g.issued(0, "dp", 4));
  EXPECT_FALSE(g.issued(7, "dp", 1));  // unknown rank
}

TEST(WaitGraph, JsonRoundTrip) {
  const GroupWait w = pos("1", "dp", kAll, 4, 3, "t.py:1 in f", kNow);
  const GroupWait back = groupWaitFromJson(toJson(w));
  EXPECT_EQ(back.group, "1");
  EXPECT_EQ(back.label, "dp");
  EXPECT_EQ(back.ranks, kAll);
  EXPECT_EQ(back.lastSeq, 4u);
  EXPECT_TRUE(back.pending);
  EXPECT_EQ(back.seq, 3u);
  EXPECT_EQ(back.where, "t.py:1 in f");
  EXPECT_EQ(back.startNs, kNow);
  const GroupWait idle = groupWaitFromJson(toJson(pos("2", "mp", kAll, 0)));
  EXPECT_FALSE(idle.pending);
}

TEST(WaitGraph, VerdictCarriesTheShapeThroughTheStore) {
  Verdict v;
  v.kind = Verdict::Kind::Hang;
  v.text = "deadlock across groups dp and mp: ...";
  v.shape = WaitShape::Cycle;
  v.cycleGroups = {"dp", "mp"};
  const Verdict back = Verdict::fromJson(Json::parse(v.toJson().dump()));
  EXPECT_EQ(back.shape, WaitShape::Cycle);
  EXPECT_EQ(back.cycleGroups, (std::vector<std::string>{"dp", "mp"}));
  v.sites = crossed().follow("1", 1, {1, 2}).sites;
  const Verdict withSites = Verdict::fromJson(Json::parse(v.toJson().dump()));
  ASSERT_EQ(withSites.sites.size(), 2u);
  EXPECT_EQ(withSites.sites[1].what(), "collective #1 all_reduce(float32[4], SUM)");
  EXPECT_EQ(withSites.sites[1].waiters, (std::vector<int64_t>{1, 2}));
  Verdict chain;
  chain.kind = Verdict::Kind::Hang;
  chain.shape = WaitShape::Chain;
  chain.waitsFor = {2};
  const Verdict c = Verdict::fromJson(Json::parse(chain.toJson().dump()));
  EXPECT_EQ(c.shape, WaitShape::Chain);
  EXPECT_EQ(c.waitsFor, (std::vector<int64_t>{2}));
  // A verdict from before the field: no shape.
  Verdict plain;
  plain.kind = Verdict::Kind::Hang;
  EXPECT_EQ(Verdict::fromJson(Json::parse(plain.toJson().dump())).shape, WaitShape::None);
}

namespace {

// Rank's pending send/recv with `peer` (global rank) in a group.
GroupWait p2p(const std::string& group, const std::string& label, std::vector<int64_t> ranks, int64_t peer, bool recv,
              const std::string& where, int32_t tag = 0) {
  GroupWait w = pos(group, label, std::move(ranks), 0);
  w.pending = true;
  w.seq = 0;
  w.peer = peer;
  w.recv = recv;
  w.tag = tag;
  w.op = recv ? "recv(float32[3], src=0, tag=0)" : "send(float32[3], dst=1, tag=0)";
  w.where = where;
  w.startNs = kNow - 2 * kSec;
  return w;
}

// Two pipeline stages of two replicas: dp {0,1} and {2,3}, pp {0,2} and {1,3}.
// 0 waits in dp for 1; 1 receives from 3; 3 waits in dp for 2; 2 receives from 0.
WaitGraph pipeline() {
  WaitGraph g;
  g.addRank(0, {pos("dp0", "dp", {0, 1}, 1, 1, "a"), pos("pp0", "pp", {0, 2}, 0)});
  g.addRank(1, {pos("dp0", "dp", {0, 1}, 0), p2p("pp1", "pp", {1, 3}, 3, true, "b")});
  g.addRank(2, {pos("dp1", "dp", {2, 3}, 0), p2p("pp0", "pp", {0, 2}, 0, true, "c")});
  g.addRank(3, {pos("dp1", "dp", {2, 3}, 1, 1, "d"), pos("pp1", "pp", {1, 3}, 0)});
  return g;
}

}  // namespace

TEST(WaitGraph, SendRecvAcrossPipelineStagesCloseALoopWithCollectives) {
  const WaitGraph g = pipeline();
  const WaitFinding f = g.follow("dp0", 1, {1});
  ASSERT_EQ(f.shape, WaitShape::Cycle);
  EXPECT_EQ(f.headline(), "deadlock across groups dp and pp");
  EXPECT_EQ(f.loop, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(f.owner, "dp0");  // no group holds the loop: the lowest-named group on it
  ASSERT_EQ(f.sites.size(), 4u);
  const std::string text = f.describe(kNow);
  EXPECT_NE(text.find("\n  rank 1 waits in recv(float32[3], src=0, tag=0) from rank 3 on group \"pp\" (at b, 2.0 s) "
                      "for rank 3, which waits in #1 on group \"dp\""),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("for rank 1, which waits in recv(float32[3], src=0, tag=0) from rank 3 on group \"pp\""),
            std::string::npos)
      << text;
  // From the receive's side (a p2p incident): the same loop.
  auto site = g.siteOf(2);
  ASSERT_TRUE(site.has_value());
  EXPECT_TRUE(site->p2p());
  EXPECT_EQ(site->waitsFor, (std::vector<int64_t>{0}));
  EXPECT_EQ(g.followFrom(*site, {0}).describe(kNow), text);
}

TEST(WaitGraph, APostedPairIsNoWait) {
  // 0 sends to 1 and 1 receives from 0: both pending on the transport, neither waits for the other.
  WaitGraph g;
  g.addRank(0, {p2p("pp", "pp", {0, 1}, 1, false, "s")});
  g.addRank(1, {p2p("pp", "pp", {0, 1}, 0, true, "r")});
  EXPECT_TRUE(g.siteOf(0)->waitsFor.empty());
  EXPECT_TRUE(g.siteOf(1)->waitsFor.empty());
  EXPECT_EQ(g.anyCycle().shape, WaitShape::None);
  // Both receiving from each other: a loop of two.
  WaitGraph both;
  both.addRank(0, {p2p("pp", "pp", {0, 1}, 1, true, "r0")});
  both.addRank(1, {p2p("pp", "pp", {0, 1}, 0, true, "r1")});
  const WaitFinding f = both.anyCycle();
  ASSERT_EQ(f.shape, WaitShape::Cycle);
  EXPECT_EQ(f.loop, (std::vector<int64_t>{0, 1}));
  // Another tag does not pair.
  WaitGraph tags;
  tags.addRank(0, {p2p("pp", "pp", {0, 1}, 1, false, "s", 1)});
  tags.addRank(1, {p2p("pp", "pp", {0, 1}, 0, true, "r", 2)});
  EXPECT_EQ(tags.siteOf(1)->waitsFor, (std::vector<int64_t>{0}));
}

TEST(WaitGraph, PositionsAndSitesSurviveJson) {
  PublishedWaits p{kNow, {pos("dp0", "dp", {0, 1}, 3, 3, "a"), p2p("pp1", "pp", {1, 3}, 3, true, "b", 7)}};
  auto back = decodePublishedWaits(encodePublishedWaits(p));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->timeNs, kNow);
  ASSERT_EQ(back->waits.size(), 2u);
  EXPECT_TRUE(back->waits[0].waitsInCollective());
  EXPECT_EQ(back->waits[0].seq, 3u);
  EXPECT_TRUE(back->waits[1].waitsInP2P());
  EXPECT_EQ(back->waits[1].peer, 3);
  EXPECT_TRUE(back->waits[1].recv);
  EXPECT_EQ(back->waits[1].tag, 7);
  EXPECT_FALSE(decodePublishedWaits("not json").has_value());
  EXPECT_FALSE(decodePublishedWaits("{\"waits\": []}").has_value());

  const WaitFinding f = pipeline().follow("dp0", 1, {1});
  for (const auto& s : f.sites) {
    const WaitSite r = waitSiteFromJson(toJson(s));
    EXPECT_EQ(r.what(), s.what());
    EXPECT_EQ(r.group, s.group);
    EXPECT_EQ(r.waiters, s.waiters);
    EXPECT_EQ(r.waitsFor, s.waitsFor);
  }
}

namespace {

// The positions with each wait blocked in (GroupWait::blocked).
std::vector<GroupWait> marked(std::vector<GroupWait> waits) {
  for (auto& w : waits) w.blocked = w.waits();
  return waits;
}

}  // namespace

TEST(WaitGraph, ACycleIsCertainOnlyWhenEveryRankOfItBlocksInItsWait) {
  // Every rank blocked in the wait the loop is made of: it can never complete.
  WaitGraph all;
  all.addRank(0, marked({pos("1", "dp", kAll, 1, 1, "a"), pos("2", "mp", kAll, 0)}));
  for (int64_t r : {1, 2}) all.addRank(r, marked({pos("1", "dp", kAll, 0), pos("2", "mp", kAll, 1, 1, "b")}));
  WaitFinding f = all.follow("1", 1, {1, 2});
  ASSERT_EQ(f.shape, WaitShape::Cycle);
  EXPECT_TRUE(f.certain);
  EXPECT_TRUE(f.unblocked.empty());
  EXPECT_NE(f.describe(kNow).find("every rank of the loop blocks in its wait"), std::string::npos) << f.describe(kNow);
  EXPECT_TRUE(all.anyCycle().certain);

  // Rank 0 only has dp's collective pending (async_op=True, computing): it may still
  // issue mp's, so the loop may resolve. Named, not certain.
  WaitGraph async;
  async.addRank(0, {pos("1", "dp", kAll, 1, 1, "a"), pos("2", "mp", kAll, 0)});
  for (int64_t r : {1, 2}) async.addRank(r, marked({pos("1", "dp", kAll, 0), pos("2", "mp", kAll, 1, 1, "b")}));
  f = async.follow("1", 1, {1, 2});
  ASSERT_EQ(f.shape, WaitShape::Cycle);
  EXPECT_FALSE(f.certain);
  EXPECT_EQ(f.unblocked, (std::vector<int64_t>{0}));
  EXPECT_NE(f.describe(kNow).find("\n  possibly temporary: rank 0 has its operation pending without blocking in it"),
            std::string::npos)
      << f.describe(kNow);

  // A rank the graph does not know is never taken for blocked.
  WaitGraph partial;
  partial.addRank(0, marked({pos("1", "dp", kAll, 1, 1, "a"), pos("2", "mp", kAll, 0)}));
  partial.addRank(1, marked({pos("1", "dp", kAll, 0), pos("2", "mp", kAll, 1, 1, "b")}));
  EXPECT_EQ(partial.notBlocked({0, 1, 2}), (std::vector<int64_t>{2}));
}

TEST(WaitGraph, CertaintyAndBlockedSurviveJson) {
  GroupWait w = pos("dp0", "dp", {0, 1}, 3, 3, "a");
  w.blocked = true;
  EXPECT_TRUE(groupWaitFromJson(toJson(w)).blocked);
  w.blocked = false;
  EXPECT_FALSE(groupWaitFromJson(toJson(w)).blocked);
  Verdict v;
  v.kind = Verdict::Kind::Hang;
  v.text = "t";
  v.shape = WaitShape::Cycle;
  v.cycleGroups = {"dp", "mp"};
  v.certain = true;
  EXPECT_TRUE(Verdict::fromJson(v.toJson()).certain);
  v.certain = false;
  EXPECT_FALSE(Verdict::fromJson(v.toJson()).certain);
}

}  // namespace test_wait_graph
