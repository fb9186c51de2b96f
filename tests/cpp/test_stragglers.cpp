// WaitWindows (a rank's collective waits by windows of seqs, as its status
// record carries them), StragglerBoard (rank 0's analysis of every rank's)
// and DumpStragglers (the same rule on the windows dumps carry).
#include "guard/collective/WaitWindows.h"
#include "guard/report/DumpStragglers.h"
#include "guard/report/Snapshot.h"
#include "guard/report/StatusRecord.h"
#include "guard/report/StragglerBoard.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

using namespace torch_ext;

namespace test_stragglers {

namespace {

constexpr int64_t kMs = 1000000;
constexpr uint64_t kTrainSite = 0x7a11, kValSite = 0x5e1d;

// Collectives `from`..`to` on one rank: each issued `stepMs` after the last
// completion, waiting `waitMs`.
void run(WaitWindows& w, uint64_t from, uint64_t to, int64_t stepMs, int64_t waitMs, int64_t* clock,
         uint32_t site = 1) {
  for (uint64_t seq = from; seq <= to; ++seq) {
    *clock += stepMs * kMs;
    w.add(seq, *clock, *clock + waitMs * kMs, site);
    *clock += waitMs * kMs;
  }
}

RankWaits published(const WaitWindows& w, uint64_t siteKey, const std::string& host = "h") {
  RankWaits r;
  r.host = host;
  r.windows = w.closed();
  for (auto& x : r.windows) x.siteKey = siteKey;
  return r;
}

// A window of the finest level, as one rank would publish it.
WaitWindow window(uint64_t index, int64_t waitMs, int64_t spanMs, uint64_t site) {
  WaitWindow w;
  w.level = 0;
  w.index = index;
  w.waitNs = waitMs * kMs;
  w.spanNs = spanMs * kMs;
  w.siteKey = site;
  w.siteWaitNs = waitMs * kMs;
  return w;
}

// Every rank's record showing window `index` only; rank `late` waited `lateWaitMs`, the others `waitMs`.
std::vector<std::optional<RankWaits>> look(int ranks, uint64_t index, int late, int64_t waitMs, int64_t lateWaitMs,
                                           uint64_t site = kTrainSite, int64_t spanMs = 200) {
  std::vector<std::optional<RankWaits>> out(ranks);
  for (int r = 0; r < ranks; ++r) {
    RankWaits w;
    w.host = "host" + std::to_string(r);
    w.windows.push_back(window(index, r == late ? lateWaitMs : waitMs, spanMs, site));
    out[r] = w;
  }
  return out;
}

}  // namespace

TEST(WaitWindows, SumsWaitsPerWindowOfSeqsAtEveryLevel) {
  WaitWindows w;
  int64_t clock = 0;
  run(w, 1, 3, 10, 2, &clock);
  EXPECT_TRUE(w.closed().empty());  // 3 of 4
  run(w, 4, 8, 10, 2, &clock);
  auto closed = w.closed();
  ASSERT_EQ(closed.size(), 2u);
  EXPECT_EQ(closed[0].firstSeq(), 1u);
  EXPECT_EQ(closed[1].lastSeq(), 8u);
  EXPECT_EQ(closed[1].waitNs, 4 * 2 * kMs);
  // The second window's span runs from the first's last completion: 4 x (10 + 2) ms.
  EXPECT_EQ(closed[1].spanNs, 4 * 12 * kMs);
  run(w, 9, 40, 10, 2, &clock);
  closed = w.closed();
  ASSERT_EQ(closed.size(), WaitWindows::kKept + 1);  // 3 of the finest level kept, 1 of 32
  EXPECT_EQ(closed.back().level, 1);
  EXPECT_EQ(closed.back().waitNs, 32 * 2 * kMs);
  EXPECT_EQ(closed[WaitWindows::kKept - 1].lastSeq(), 40u);
}

TEST(WaitWindows, OverlappingCollectivesCountTheirTimeOnce) {
  // DDP's bucket all_reduces: issued one after another, in flight together.
  WaitWindows w;
  w.add(1, 0 * kMs, 10 * kMs, 1);
  w.add(2, 2 * kMs, 11 * kMs, 1);
  w.add(3, 4 * kMs, 12 * kMs, 1);
  w.add(4, 20 * kMs, 25 * kMs, 1);  // after a gap: its own 5 ms
  auto closed = w.closed();
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].waitNs, 17 * kMs);  // 0-12 and 20-25, not 10 + 9 + 8 + 5
  EXPECT_LE(closed[0].waitNs, closed[0].spanNs);
}

TEST(WaitWindows, AWindowMissingACompletionNeverCloses) {
  WaitWindows w;
  int64_t clock = 0;
  run(w, 1, 2, 10, 2, &clock);
  run(w, 4, 8, 10, 2, &clock);  // seq 3 completed untimed (polled)
  auto closed = w.closed();
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].firstSeq(), 5u);
}

TEST(WaitWindows, NamesTheCallSiteWhereItWaitedMost) {
  WaitWindows w;
  int64_t clock = 0;
  run(w, 1, 3, 10, 1, &clock, 7);
  run(w, 4, 4, 10, 30, &clock, 9);
  auto closed = w.closed();
  ASSERT_EQ(closed.size(), 1u);
  EXPECT_EQ(closed[0].site, 9u);
  EXPECT_EQ(closed[0].siteWaitNs, 30 * kMs);
  EXPECT_EQ(closed[0].siteCount, 1u);
}

TEST(RankWaits, RoundTripsThroughTheStatusRecord) {
  WaitWindows w;
  int64_t clock = 0;
  run(w, 1, 40, 10, 3, &clock);
  RankWaits r = published(w, 0xabcdef0123ull, "node7");
  StatusRecord s;
  s.lastSeq = 40;
  s.waits = r.encode();
  auto back = StatusRecord::decode(s.encode());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->lastSeq, 40u);
  auto waits = RankWaits::decode(back->waits);
  ASSERT_TRUE(waits);
  EXPECT_EQ(waits->host, "node7");
  ASSERT_EQ(waits->windows.size(), r.windows.size());
  EXPECT_EQ(waits->windows.back().waitNs, r.windows.back().waitNs);
  EXPECT_EQ(waits->windows.back().siteKey, 0xabcdef0123ull);
  // A record without waits still decodes; garbage after "w" does not.
  s.waits.clear();
  EXPECT_TRUE(StatusRecord::decode(s.encode()));
  // The record carries the waits as text; reading them is RankWaits' job.
  auto partial = StatusRecord::decode(s.encode() + " w node 0:1:2");
  ASSERT_TRUE(partial);
  EXPECT_FALSE(RankWaits::decode(partial->waits));
  EXPECT_FALSE(RankWaits::decode("node 0:1:2:3:ab:4:5:6"));
  EXPECT_FALSE(StatusRecord::decode(s.encode() + " x"));
}

TEST(StragglerBoard, NamesTheRankTheOthersWaitedForAfterThreeWindows) {
  StragglerBoard board(0.05);
  for (uint64_t i = 0; i < 2; ++i) EXPECT_EQ(board.look(look(4, i, 2, 40, 2)), 1u);
  EXPECT_TRUE(board.named().empty());  // two windows prove nothing yet
  EXPECT_EQ(board.look(look(4, 2, 2, 40, 2)), 1u);
  auto named = board.named();
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].rank, 2);
  EXPECT_EQ(named[0].host, "host2");
  EXPECT_EQ(named[0].windows, 3);
  EXPECT_EQ(named[0].firstSeq, 1u);
  EXPECT_EQ(named[0].lastSeq, 12u);
  EXPECT_EQ(named[0].lostNs, 3 * 38 * kMs);
  EXPECT_NEAR(named[0].share(), 38.0 / 200.0, 1e-9);
  EXPECT_NEAR(named[0].ownWaitShare, 2.0 / 200.0, 1e-9);
  EXPECT_NEAR(named[0].othersWaitShare, 40.0 / 200.0, 1e-9);
  // The same windows again are not counted twice.
  EXPECT_EQ(board.look(look(4, 2, 2, 40, 2)), 0u);
}

TEST(StragglerBoard, NoiseBelowTheThresholdOrWanderingNamesNobody) {
  StragglerBoard board(0.05);
  // 5 ms of 200 is 2.5%: below the bar, whoever it is.
  for (uint64_t i = 0; i < 10; ++i) board.look(look(4, i, static_cast<int>(i % 4), 10, 5));
  EXPECT_TRUE(board.named().empty());
  // Above the bar, but a different rank each window: nobody in half of them.
  for (uint64_t i = 10; i < 30; ++i) board.look(look(4, i, static_cast<int>(i % 4), 40, 2));
  EXPECT_TRUE(board.named().empty());
}

TEST(StragglerBoard, ARankSlowOnlyInValidationIsNamedWithValidationsSite) {
  StragglerBoard board(0.05);
  uint64_t i = 0;
  for (int round = 0; round < 3; ++round) {
    for (int k = 0; k < 5; ++k, ++i) board.look(look(4, i, static_cast<int>(i % 4), 10, 9));  // balanced training
    board.look(look(4, i++, 0, 60, 5, kValSite));  // validation: everyone waits for rank 0
  }
  auto named = board.named();
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].rank, 0);
  EXPECT_EQ(named[0].siteKey, kValSite);
  EXPECT_EQ(named[0].windows, 3);
  EXPECT_EQ(named[0].siteWindows, 3);
}

TEST(StragglerBoard, UsesTheFinestLevelEveryRankShows) {
  // Rank 1 published later than rank 0: their finest windows do not meet, the next level's do.
  std::vector<std::optional<RankWaits>> ranks(2);
  for (int r = 0; r < 2; ++r) {
    RankWaits w;
    for (uint64_t i = 0; i < 3; ++i) w.windows.push_back(window(r == 0 ? 10 + i : 20 + i, 5, 100, 1));
    WaitWindow coarse = window(0, r == 0 ? 100 : 1, 1000, 1);
    coarse.level = 1;
    w.windows.push_back(coarse);
    ranks[r] = w;
  }
  StragglerBoard board(0.05);
  EXPECT_EQ(board.look(ranks), 1u);
  ASSERT_EQ(board.history().size(), 1u);
  EXPECT_EQ(board.history()[0].lastSeq, 32u);
  ASSERT_EQ(board.history()[0].late.size(), 1u);
  EXPECT_EQ(board.history()[0].late[0].rank, 1);
  // A rank without a record: nothing is analysed.
  ranks[1].reset();
  EXPECT_EQ(StragglerBoard(0.05).look(ranks), 0u);
}

TEST(StragglerBoard, WindowsShorterThanATenthOfASecondWaitForTheNextLevel) {
  // A few of DDP's bucket all_reduces: 20 ms windows, where 2 ms of scheduling noise is 10%.
  std::vector<std::optional<RankWaits>> ranks(2);
  for (int r = 0; r < 2; ++r) {
    RankWaits w;
    w.windows.push_back(window(5, r == 0 ? 10 : 2, 20, 1));
    ranks[r] = w;
  }
  StragglerBoard board(0.05);
  EXPECT_EQ(board.look(ranks), 0u);
  for (int r = 0; r < 2; ++r) {
    WaitWindow coarse = window(0, 40, 300, 1);
    coarse.level = 1;
    ranks[r]->windows.push_back(coarse);
  }
  EXPECT_EQ(board.look(ranks), 1u);
  EXPECT_EQ(board.history().back().lastSeq, 32u);
  EXPECT_TRUE(board.history().back().late.empty());
}

TEST(StragglerBoard, TheStepIsThePeriodOfTheCollectivesPattern) {
  EXPECT_EQ(StragglerBoard::period({1, 1, 1, 1}), 1u);
  EXPECT_EQ(StragglerBoard::period({1, 2, 3, 1, 2, 3, 1, 2, 3}), 3u);
  EXPECT_EQ(StragglerBoard::period({1, 2, 3, 4}), 0u);
}

TEST(StragglerBoard, TheWarningSaysWhoHowMuchWhereAndWhatToDo) {
  StragglerBoard board(0.05);
  for (uint64_t i = 0; i < 3; ++i) board.look(look(4, i, 2, 40, 2));
  StragglerContext ctx;
  ctx.group = "default_pg";
  ctx.globalRanks = {0, 1, 5, 7};
  ctx.sites[kTrainSite] = "train.py:40 in step";
  ctx.collectivesPerStep = 2;
  const std::string text = stragglerText(board.named().at(0), 4, ctx);
  EXPECT_NE(text.find("rank 5 (host host2) is the straggler"), std::string::npos) << text;
  EXPECT_NE(text.find("the other 3 ranks waited on average 19.0 ms per step (9.50 ms per collective)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("over collectives 1-12 (about 19% of their time), most at train.py:40 in step"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("own wait share is 1% against a median of 20%"), std::string::npos) << text;
  EXPECT_NE(text.find("TORCH_EXT_STRAGGLER=off"), std::string::npos) << text;
  const Json j = stragglersJson(board, board.named(), 4, ctx);
  EXPECT_EQ(j.dump().find("\"rank\":5") != std::string::npos, true) << j.dump();
}

// --- the same rule on dumps (DumpStragglers) ---------------------------------

namespace {

// Rank `rank`'s snapshot of a 4-rank group after `windows` level-0 windows of
// 4 collectives (each `spanMs` long); rank `late` waited `lateWaitMs` per
// window, the others `waitMs`. Goes through the dump's JSON both ways.
RankSnapshot dumped(int rank, uint64_t windows, int late, int64_t waitMs, int64_t lateWaitMs, int64_t spanMs = 200) {
  RankSnapshot s;
  s.rank = rank;
  s.hostname = "host" + std::to_string(rank);
  GroupView g;
  g.name = "0";
  g.desc = "default_pg";
  g.rank = rank;
  g.size = 4;
  g.globalRanks = {0, 1, 2, 3};
  for (uint64_t i = 0; i < windows; ++i) {
    g.waitWindows.push_back(window(i, rank == late ? lateWaitMs : waitMs, spanMs, kTrainSite));
  }
  g.waitSites[kTrainSite] = "train.py:40 in step";
  s.groups.push_back(g);
  return snapshotFromJson(Json::parse(toJson(s).dump()));
}

}  // namespace

TEST(WaitWindows, KeepsAStragglerBoardsHistoryForDumpsAndPublishesThree) {
  WaitWindows w;
  int64_t clock = 0;
  run(w, 1, 40 * 4, 20, 5, &clock);  // 40 windows of level 0
  auto level0 = [](const std::vector<WaitWindow>& v) {
    return std::count_if(v.begin(), v.end(), [](const WaitWindow& x) { return x.level == 0; });
  };
  EXPECT_EQ(level0(w.closed()), static_cast<long>(WaitWindows::kKept));
  const auto dump = w.closed(WaitWindows::kHistory);
  EXPECT_EQ(level0(dump), static_cast<long>(StragglerBoard::kHistory));
  EXPECT_EQ(dump.front().index, 40u - StragglerBoard::kHistory);  // the newest, oldest first
}

TEST(DumpStragglers, TheWindowsRoundTripThroughTheDumpAndNameTheRankAsTheWatchdogWould) {
  std::vector<RankSnapshot> snaps;
  for (int r = 0; r < 4; ++r) snaps.push_back(dumped(r, 10, 2, 40, 2));
  ASSERT_EQ(snaps[2].groups[0].waitWindows.size(), 10u);
  EXPECT_EQ(snaps[2].groups[0].waitWindows[3].waitNs, 2 * kMs);
  EXPECT_EQ(snaps[0].groups[0].waitSites.at(kTrainSite), "train.py:40 in step");

  auto out = stragglersFromSnapshots(snaps, 0.05);
  ASSERT_EQ(out.size(), 1u);
  const Json& g = out[0];
  EXPECT_EQ(g.at("group").asString(), "default_pg");
  EXPECT_EQ(g.at("first_seq").asInt(), 1);
  EXPECT_EQ(g.at("last_seq").asInt(), 40);
  EXPECT_EQ(g.at("collectives").asInt(), 40);
  const auto& named = g.at("stragglers").asArray();
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].at("rank").asInt(), 2);
  EXPECT_EQ(named[0].at("site").asString(), "train.py:40 in step");
  EXPECT_NEAR(named[0].at("lost_s").asDouble(), 10 * 0.038, 1e-9);
  EXPECT_NE(named[0].at("text").asString().find("rank 2 (host host2) is the straggler"), std::string::npos);
  const auto& ranks = g.at("ranks").asArray();
  ASSERT_EQ(ranks.size(), 4u);
  EXPECT_NEAR(ranks[2].at("wait_share").asDouble(), 2.0 / 200.0, 1e-9);
  EXPECT_NEAR(ranks[0].at("wait_s").asDouble(), 10 * 0.040, 1e-9);

  // The live rule, window by window, says the same.
  StragglerBoard board(0.05);
  std::vector<std::optional<RankWaits>> ranksWaits;
  for (const auto& s : snaps) ranksWaits.push_back(RankWaits{s.hostname, s.groups[0].waitWindows});
  board.look(ranksWaits);
  ASSERT_EQ(board.named().size(), 1u);
  EXPECT_EQ(board.named()[0].lostNs, static_cast<int64_t>(named[0].at("lost_s").asDouble() * 1e9 + 0.5));
}

TEST(DumpStragglers, TwoWindowsOrAMissingRankOrOldDumpsNameNobody) {
  std::vector<RankSnapshot> two;
  for (int r = 0; r < 4; ++r) two.push_back(dumped(r, 2, 2, 40, 2));
  auto out = stragglersFromSnapshots(two, 0.05);
  EXPECT_TRUE(out[0].at("stragglers").asArray().empty());  // as the board: three windows at least
  EXPECT_EQ(out[0].at("collectives").asInt(), 8);

  std::vector<RankSnapshot> three;  // rank 3's dump is missing: no window is every rank's
  for (int r = 0; r < 3; ++r) three.push_back(dumped(r, 10, 2, 40, 2));
  out = stragglersFromSnapshots(three, 0.05);
  EXPECT_TRUE(out[0].at("stragglers").asArray().empty());
  EXPECT_EQ(out[0].at("collectives").asInt(), 0);
  EXPECT_TRUE(out[0].at("first_seq").isNull());
  EXPECT_TRUE(out[0].at("ranks").asArray().empty());

  std::vector<RankSnapshot> old;  // dumps without windows (torch_ext before they were carried)
  for (int r = 0; r < 4; ++r) {
    old.push_back(dumped(r, 10, 2, 40, 2));
    old.back().groups[0].waitWindows.clear();
  }
  EXPECT_EQ(stragglersFromSnapshots(old, 0.05)[0].at("collectives").asInt(), 0);
  // TORCH_EXT_STRAGGLER=off: nothing analysed.
  EXPECT_EQ(stragglersFromSnapshots(std::vector<RankSnapshot>(three.begin(), three.end()), 0.0).size(), 1u);
}

}  // namespace test_stragglers
