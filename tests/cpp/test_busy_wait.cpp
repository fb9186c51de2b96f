// Busy is not hung (issue 68): a collective past abort_after waits on while
// every rank it waits for progresses (watchdog/BusyWait.h reading status
// records; Deadlines holding the abort: test_deadlines_status.cpp), up to busy_cap.
#include "guard/watchdog/BusyWait.h"
#include "guard/report/LocalReport.h"
#include "guard/report/Messages.h"

#include <gtest/gtest.h>

using namespace torch_ext;

namespace test_busy_wait {

namespace {

constexpr int64_t kSec = 1'000'000'000;
constexpr int64_t kWall = 1'700'000'000 * kSec;

StatusRecord record(uint64_t lastSeq, int64_t quietMs, int64_t heartbeatNs, RankPhase phase = RankPhase::Running) {
  StatusRecord r;
  r.phase = phase;
  r.lastSeq = lastSeq;
  r.quietMs = quietMs;
  r.heartbeatNs = heartbeatNs;
  return r;
}

}  // namespace

TEST(StatusRecord, CarriesHowLongTheRankHasBeenQuiet) {
  StatusRecord s = record(7, 1234, 5);
  EXPECT_EQ(s.encode(), "v2 run 5 7 0000000000000000 0 q 1234");
  auto back = StatusRecord::decode(s.encode());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->quietMs, 1234);
  s.waits = "1:2:3";
  back = StatusRecord::decode(s.encode());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->quietMs, 1234);
  EXPECT_EQ(back->waits, "1:2:3");
  EXPECT_EQ(StatusRecord::decode("v2 run 5 7 0000000000000000 0")->quietMs, -1);  // not known
  EXPECT_FALSE(StatusRecord::decode("v2 run 5 7 0000000000000000 0 q"));
  EXPECT_FALSE(StatusRecord::decode("v2 run 5 7 0000000000000000 0 q -3"));
}

TEST(BusyWait, WaitsOnOnlyWhileEveryAwaitedRankProgresses) {
  BusyWait w(3 * kSec);
  // Rank 1 waits in #4; rank 0 has not issued it and works; rank 2 has.
  std::vector<std::optional<StatusRecord>> recs{record(3, 0, kWall), record(4, 0, kWall), record(4, 9000, kWall)};
  BusyLook look = w.look(recs, 4, 10 * kSec, kWall, false);
  EXPECT_TRUE(look.waitOn);
  EXPECT_EQ(look.busy, std::vector<int>{0});
  EXPECT_TRUE(look.stopped.empty());
  EXPECT_EQ(look.lowestArrived, 1);
  // Once waiting on, a pause of its own work (a flush) is not an end...
  recs[0] = record(3, 3000, kWall + kSec);
  EXPECT_TRUE(w.look(recs, 4, 11 * kSec, kWall + kSec, true).waitOn);
  // (before the wait began, the same pause ends it: a look before abort_after primes nothing)
  BusyWait early(3 * kSec);
  recs[0] = record(3, 0, kWall);
  ASSERT_TRUE(early.look(recs, 4, 10 * kSec, kWall, false).waitOn);
  recs[0] = record(3, 3000, kWall + kSec);
  EXPECT_FALSE(early.look(recs, 4, 11 * kSec, kWall + kSec, false).waitOn);
  // ... quiet for kStoppedAfterNs is.
  recs[0] = record(3, 5000, kWall + 2 * kSec);
  look = w.look(recs, 4, 12 * kSec, kWall + 2 * kSec, true);
  EXPECT_FALSE(look.waitOn);
  EXPECT_EQ(look.stopped, std::vector<int>{0});
  // A rank quiet for more than a second does not start a wait on...
  BusyWait fresh(3 * kSec);
  recs[0] = record(3, 1500, kWall);
  EXPECT_FALSE(fresh.look(recs, 4, 10 * kSec, kWall, false).waitOn);
  // ... nor one whose "busy" record is 1.6 s old: it was not renewed since (it stopped, or its exchange is held up).
  BusyWait aged(3 * kSec);
  recs[0] = record(3, 0, kWall);
  EXPECT_FALSE(aged.look(recs, 4, 10 * kSec, kWall + 1'600'000'000, false).waitOn);
  EXPECT_TRUE(BusyWait(3 * kSec).look(recs, 4, 10 * kSec, kWall + 500'000'000, false).waitOn);
}

TEST(BusyWait, AFrozenGoneOrSilentRankEndsTheWait) {
  BusyWait w(3 * kSec);
  std::vector<std::optional<StatusRecord>> recs{record(3, 0, kWall), record(4, 0, kWall)};
  ASSERT_TRUE(w.look(recs, 4, 10 * kSec, kWall, false).waitOn);
  // SIGSTOP: its record stays as it was, busy; its heartbeat no longer moves.
  EXPECT_TRUE(w.look(recs, 4, 12 * kSec, kWall + 2 * kSec, true).waitOn);
  EXPECT_FALSE(w.look(recs, 4, 13 * kSec + 1, kWall + 3 * kSec, true).waitOn);
  // Frozen before the first look: its heartbeat is old by the wall clock.
  BusyWait first(3 * kSec);
  EXPECT_FALSE(first.look(recs, 4, 100 * kSec, kWall + 11 * kSec, false).waitOn);
  // Exited, no record, or progress not known (no /proc): no wait on.
  for (auto rec : {std::optional<StatusRecord>(record(3, 0, kWall, RankPhase::Exited)), std::optional<StatusRecord>(),
                   std::optional<StatusRecord>(record(3, -1, kWall))}) {
    BusyWait b(3 * kSec);
    recs[0] = rec;
    EXPECT_FALSE(b.look(recs, 4, 10 * kSec, kWall, false).waitOn);
  }
  // Every rank has issued it (the collective is slow in the inner backend): nothing to wait on for.
  BusyWait none(3 * kSec);
  std::vector<std::optional<StatusRecord>> all{record(4, 0, kWall), record(4, 0, kWall)};
  EXPECT_FALSE(none.look(all, 4, 10 * kSec, kWall, false).waitOn);
}

TEST(BusyWait, TheWordsOfTheWaitAndOfItsEnd) {
  LocalFacts f;
  f.groupLabel = "default_pg";
  const std::string text = formatBusyWait(f, {0}, 20, 80);
  EXPECT_NE(text.find("rank 0, which it waits for, is busy, not hung: the wait goes on past abort_after=20 s"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("up to busy_cap=80 s (TORCH_EXT_BUSY_CAP); it fails as a hang if it stops progressing for 5 s"),
            std::string::npos)
      << text;
  const std::string cap = messages::abortReason(20, messages::AbortScope::EveryLiveRank, {80, true});
  EXPECT_EQ(cap.rfind("timeout after busy_cap=80 s", 0), 0u) << cap;
  const std::string stopped = messages::abortReason(20, messages::AbortScope::EveryLiveRank, {80, false});
  EXPECT_EQ(stopped.rfind("timeout after abort_after=20 s", 0), 0u) << stopped;
  EXPECT_NE(stopped.find("until one stopped progressing"), std::string::npos) << stopped;
}

}  // namespace test_busy_wait
