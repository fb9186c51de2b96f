// The watchdog's local parts, which do no store I/O: the status record and its
// encoding, the deadlines of the oldest pending op (driven by a fake clock),
// and the report a rank makes alone when the store is gone.
#include "guard/watchdog/Deadlines.h"
#include "guard/report/LocalReport.h"
#include "guard/report/StatusRecord.h"

#include <gtest/gtest.h>

using namespace torch_ext;
using std::chrono::milliseconds;

namespace test_deadlines_status {

namespace {

constexpr int64_t kSec = 1'000'000'000;

Progress pendingAt(uint64_t id, uint64_t seq, int64_t startNs) {
  Progress p;
  p.lastSeq = seq;
  p.hasPending = true;
  p.oldestPending.id = id;
  p.oldestPending.seq = seq;
  p.oldestPending.startSteadyNs = startNs;
  return p;
}

}  // namespace

TEST(StatusRecord, EncodesEveryPhaseAndRejectsAnythingElse) {
  Progress p;
  p.lastSeq = 57;
  p.rolling = 0x0123456789abcdefULL;
  p.lastCompletedSeq = 56;
  for (auto phase : {RankPhase::Running, RankPhase::Left, RankPhase::Exited}) {
    StatusRecord s = StatusRecord::of(phase, 1700000000 * kSec, p);
    auto back = StatusRecord::decode(s.encode());
    ASSERT_TRUE(back.has_value()) << s.encode();
    EXPECT_EQ(back->phase, phase);
    EXPECT_EQ(back->heartbeatNs, 1700000000 * kSec);
    EXPECT_EQ(back->lastSeq, 57u);
    EXPECT_EQ(back->rolling, 0x0123456789abcdefULL);
    EXPECT_EQ(back->lastCompletedSeq, 56u);
    EXPECT_TRUE(back->sameProgress(s));
  }
  EXPECT_EQ(StatusRecord::of(RankPhase::Exited, 5, p).encode(), "v2 exit 5 57 0123456789abcdef 56");
  for (const char* bad : {"", "v1 5 57 0123456789abcdef 56", "v2 gone 5 57 0123456789abcdef 56", "v2 run 5 57 xyz 56",
                          "v2 run 5 57 0123456789abcdef", "v2 run 5 57 0123456789abcdef 56 7"}) {
    EXPECT_FALSE(StatusRecord::decode(bad).has_value()) << bad;
  }
  StatusRecord a = StatusRecord::of(RankPhase::Running, 1, p);
  StatusRecord b = StatusRecord::of(RankPhase::Running, 2, p);
  EXPECT_TRUE(a.sameProgress(b));  // only the heartbeat moved
  b.lastCompletedSeq = 57;
  EXPECT_FALSE(a.sameProgress(b));
}

TEST(Deadlines, WarnThenAbortOncePerOpOnAFakeClock) {
  Deadlines d(milliseconds(3000), milliseconds(10000), 0.2, /*compares=*/true);
  const int64_t t0 = 100 * kSec;
  Progress p = pendingAt(7, 3, t0);
  EXPECT_FALSE(d.check(p, 1, t0 + 2 * kSec).raise);
  auto warn = d.check(p, 1, t0 + 3 * kSec + 1);
  ASSERT_TRUE(warn.raise);
  EXPECT_EQ(warn.raise->kind, IncidentKind::Hang);
  EXPECT_EQ(warn.raise->id(), "hang:3");
  EXPECT_EQ(warn.raise->poster, 1);
  EXPECT_FALSE(d.check(p, 1, t0 + 4 * kSec).raise);  // once per op
  auto abort = d.check(p, 1, t0 + 10 * kSec + 1);
  ASSERT_TRUE(abort.raise);
  EXPECT_EQ(abort.raise->id(), "abort:3");
  EXPECT_EQ(abort.waitedNs, 10 * kSec + 1);
  EXPECT_FALSE(d.check(p, 1, t0 + 11 * kSec).raise);
  // A new op starts its own deadlines.
  Progress q = pendingAt(8, 4, t0 + 20 * kSec);
  EXPECT_EQ(d.check(q, 1, t0 + 23 * kSec + 1).raise->id(), "hang:4");
  // Nothing pending, nothing to do.
  EXPECT_FALSE(d.check(Progress{}, 1, t0 + 100 * kSec).raise);
}

TEST(Deadlines, LocalFallbacksFireWhenNoVerdictComes) {
  Deadlines d(milliseconds(1000), milliseconds(4000), 0.2, /*compares=*/true);
  EXPECT_EQ(d.fallbackNs(), 5 * kSec);  // max(5 s, 25 ticks)
  const int64_t t0 = 0;
  Progress p = pendingAt(1, 1, t0);
  ASSERT_TRUE(d.check(p, 0, t0 + kSec + 1).raise);  // hang incident
  // The cross-rank report came: no local warning.
  d.reported(IncidentSubject::collective(1));
  auto a = d.check(p, 0, t0 + 3 * kSec);
  EXPECT_FALSE(a.localWarn);
  ASSERT_TRUE(d.check(p, 0, t0 + 4 * kSec + 1).raise);    // abort incident
  EXPECT_FALSE(d.check(p, 0, t0 + 8 * kSec).localAbort);  // the protocol still has time
  auto late = d.check(p, 0, t0 + 9 * kSec + 2);
  EXPECT_TRUE(late.localAbort);
  EXPECT_EQ(late.entry.id, 1u);
  EXPECT_FALSE(d.check(p, 0, t0 + 20 * kSec).localAbort);  // once

  // No report for a hang: one local warning after the fallback.
  Deadlines w(milliseconds(1000), milliseconds(60000), 0.2, /*compares=*/true);
  Progress q = pendingAt(2, 5, 0);
  ASSERT_TRUE(w.check(q, 0, kSec + 1).raise);
  EXPECT_FALSE(w.check(q, 0, 5 * kSec).localWarn);
  EXPECT_TRUE(w.check(q, 0, 6 * kSec + 2).localWarn);
  EXPECT_FALSE(w.check(q, 0, 7 * kSec).localWarn);
}

TEST(Deadlines, AWaitThatEndedByItselfIsLookedAtAgainOnlyOnceItOutlastsIt) {
  // Rank 0 checkpoints 11 s every epoch; this rank waits at the same call site each time.
  Deadlines d(milliseconds(10000), milliseconds(1800000), 0.2, /*compares=*/true);
  auto at = [](uint64_t id, uint64_t seq, int64_t start, uint32_t site) {
    Progress p = pendingAt(id, seq, start);
    p.oldestPending.callSite = site;
    return p;
  };
  EXPECT_EQ(d.warnAfterNs(5), 10 * kSec);
  // Epoch 1: looked at 10 s in, then it ends by itself at 11 s.
  Progress e1 = at(1, 4, 0, 5);
  ASSERT_TRUE(d.check(e1, 1, 10 * kSec + 1).raise);
  EXPECT_FALSE(d.check(e1, 1, 11 * kSec).raise);
  EXPECT_FALSE(d.check(Progress{}, 1, 11 * kSec + kSec / 5).raise);  // it ended
  EXPECT_EQ(d.warnAfterNs(5), 11 * kSec + 11 * kSec / 4);            // a quarter more than 11 s
  EXPECT_EQ(d.warnAfterNs(6), 10 * kSec);                            // other sites as before
  // Epoch 2: the same 11 s wait at the same site is not looked at again.
  const int64_t t2 = 100 * kSec;
  Progress e2 = at(2, 9, t2, 5);
  for (int64_t s = 1; s <= 11; ++s) EXPECT_FALSE(d.check(e2, 1, t2 + s * kSec).raise) << s;
  // A wait that outlasts it by more than a quarter is looked at.
  auto late = d.check(e2, 1, t2 + 14 * kSec);
  ASSERT_TRUE(late.raise);
  EXPECT_EQ(late.raise->id(), "hang:9");
  // Another site waiting 10 s is looked at on time.
  Progress other = at(3, 10, 200 * kSec, 6);
  EXPECT_TRUE(d.check(other, 1, 210 * kSec + 1).raise);
  // An aborted wait teaches nothing: it did not end by itself.
  Deadlines a(milliseconds(1000), milliseconds(2000), 0.2, /*compares=*/true);
  Progress x = at(4, 1, 0, 7);
  ASSERT_TRUE(a.check(x, 0, kSec + 1).raise);
  ASSERT_TRUE(a.check(x, 0, 2 * kSec + 1).raise);  // abort
  a.check(Progress{}, 0, 3 * kSec);
  EXPECT_EQ(a.warnAfterNs(7), kSec);
}

TEST(Deadlines, PendingSendRecvGetsOnePairingCheckUnlessChecksAreOff) {
  Deadlines d(milliseconds(60000), milliseconds(60000), 0.2, /*compares=*/true);
  Progress p = pendingAt(9, 0, 0);  // seq 0: point-to-point
  EXPECT_FALSE(d.check(p, 2, kSec / 2).raise);
  auto c = d.check(p, 2, kSec + 1);
  ASSERT_TRUE(c.raise);
  EXPECT_EQ(c.raise->id(), "p2p:p2p-2-9");
  EXPECT_FALSE(d.check(p, 2, 2 * kSec).raise);
  Deadlines off(milliseconds(60000), milliseconds(60000), 0.2, /*compares=*/false);
  EXPECT_FALSE(off.check(p, 2, 2 * kSec).raise);
}

namespace {

LocalFacts facts() {
  LocalFacts f;
  f.groupLabel = "default_pg";
  f.groupSize = 3;
  f.groupRank = 1;
  f.nowWallNs = 1000 * kSec;
  f.storeHostRank = 0;
  f.progress.lastSeq = 3;
  f.progress.lastCompletedSeq = 2;
  EntryView e;
  e.seq = 3;
  e.text = "all_reduce(float32[4], SUM)";
  e.frames = {Frame{"/work/train.py", 20, "<module>"}};
  f.pending = e;
  f.pendingForNs = 1200'000'000;
  Progress p0;
  p0.lastSeq = 2;
  p0.lastCompletedSeq = 2;
  f.peers[0] = PeerState{StatusRecord::of(RankPhase::Running, 1000 * kSec - 1400'000'000, p0), 0};
  Progress p2;
  p2.lastSeq = 3;
  p2.lastCompletedSeq = 2;
  f.peers[2] = PeerState{StatusRecord::of(RankPhase::Running, 1000 * kSec - 200'000'000, p2), 0};
  return f;
}

}  // namespace

TEST(LocalReport, StoreLostNamesTheStoreItsHostThisRanksOpAndEachPeer) {
  LocalFacts f = facts();
  EXPECT_EQ(formatStoreLost(f,
                            "the store at 127.0.0.1:29500 (hosted by rank 0's process) is gone: connection failed "
                            "during add: Broken pipe"),
            "the store at 127.0.0.1:29500 (hosted by rank 0's process) is gone: connection failed during add: Broken "
            "pipe; group \"default_pg\" (3 ranks) fails on rank 1: without the store no cross-rank check or report "
            "can be made\n"
            "  pending here: collective #3 all_reduce(float32[4], SUM) at train.py:20 in <module>, waiting 1.2 s\n"
            "  rank 0 (hosts the store): last heartbeat 1.4 s ago, issued #2, completed #2; its process most likely "
            "exited, was killed or froze\n"
            "  rank 2: last heartbeat 0.2 s ago, issued #3, completed #2");
  EXPECT_FALSE(f.allPeersDone());

  // Nothing pending; peers that left or exited; peers not watched by this rank.
  f.pending.reset();
  f.groupSize = 6;
  f.peers[0].status.phase = RankPhase::Exited;
  f.peers[2].status.phase = RankPhase::Left;
  const std::string t = formatStoreLost(f, "the store at h:1 is gone: x");
  EXPECT_NE(t.find("\n  nothing pending here (last issued #3, completed #2): the next operation on the group raises "
                   "this error\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("\n  rank 0 (hosts the store): exited 1.4 s ago after issuing #2 (its process ended)\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("\n  rank 2: left the group (destroy_process_group) 0.2 s ago after issuing #3\n"),
            std::string::npos)
      << t;
  // Rank 1 of 6 watches ranks 0 and 2; ranks 3-5 are not watched.
  EXPECT_NE(t.find("\n  ranks 3-5: not watched by this rank (each rank reads its two ring neighbours)"),
            std::string::npos)
      << t;
  f.peers.erase(2);
  EXPECT_NE(formatStoreLost(f, "x").find("\n  rank 2: no status read by this rank before the store was lost"),
            std::string::npos);
  // An op the inner backend failed (a peer's connection closed) is named as such.
  EntryView failed;
  failed.seq = 4;
  failed.text = "all_reduce(float32[4], SUM)";
  failed.frames = {Frame{"/work/train.py", 20, "<module>"}};
  failed.error = "Connection closed by peer [127.0.0.1]:4242\nmore";
  f.lastFailed = failed;
  EXPECT_NE(formatStoreLost(f, "x").find("\n  failed here: collective #4 all_reduce(float32[4], SUM) at train.py:20 in "
                                         "<module> (the inner backend: Connection closed by peer [127.0.0.1]:4242)\n"),
            std::string::npos)
      << formatStoreLost(f, "x");
  f.groupSize = 3;
  f.lastFailed.reset();
  f.peers[2] = PeerState{StatusRecord::of(RankPhase::Left, 0, Progress{}), 0};
  EXPECT_TRUE(f.allPeersDone());
}

TEST(LocalReport, TimeoutAndHangWithoutAVerdictSayWhy) {
  LocalFacts f = facts();
  const std::string t = formatLocalTimeout(f, 20, "the store answers, but no verdict arrived within 5 s");
  EXPECT_EQ(t.substr(0, t.find('\n')),
            "collective #3 all_reduce(float32[4], SUM) on group \"default_pg\" has waited 1.2 s: timeout after "
            "abort_after=20 s (TORCH_EXT_ABORT_AFTER), the collective fails on this rank; no cross-rank report: the "
            "store answers, but no verdict arrived within 5 s");
  EXPECT_NE(t.find("\n  waiting: rank 1 (this rank) at train.py:20 in <module>\n  rank 0 (hosts the store): last "
                   "heartbeat 1.4 s ago"),
            std::string::npos)
      << t;
  const std::string h = formatLocalHang(f, "why");
  EXPECT_EQ(h.substr(0, h.find('\n')),
            "collective #3 all_reduce(float32[4], SUM) on group \"default_pg\" has waited 1.2 s (no cross-rank report: "
            "why)");
}

TEST(LocalReport, AStoppedRankSaysWhereItStoodAndWhatTheStoreHasOfEachPeer) {
  LocalFacts f = facts();
  f.everyPeerRead = true;  // read from the store just now: the host is answering, rank 2's status is missing
  f.peers.erase(2);
  EXPECT_EQ(formatStandingAtStop(f),
            "\n  group \"default_pg\" (3 ranks):\n"
            "  pending here: collective #3 all_reduce(float32[4], SUM) at train.py:20 in <module>, waiting 1.2 s\n"
            "  rank 0 (hosts the store): last heartbeat 1.4 s ago, issued #2, completed #2\n"
            "  rank 2: no status in the store");
}

TEST(Deadlines, ABusyWaitGoesOnPastAbortAfterUpToTheCapAndSaysHowItEnded) {
  using Awaited = Deadlines::Awaited;
  Deadlines d(milliseconds(1000), milliseconds(4000), 0.2, /*compares=*/true, milliseconds(16000));
  EXPECT_EQ(d.busyLookAfterNs(), 4 * kSec);  // looked at from abort_after on
  const Progress p = pendingAt(1, 9, 0);
  Awaited now = Awaited::Unknown;
  int asked = 0;
  const auto awaited = [&](const Entry& e) {
    ++asked;
    EXPECT_EQ(e.seq, 9u);
    return now;
  };
  ASSERT_TRUE(d.check(p, 1, kSec + 1, awaited).raise);  // warn_after's look
  EXPECT_EQ(asked, 0);                                  // asked only past abort_after
  auto a = d.check(p, 1, 4 * kSec + 1, awaited);        // the first look is on its way: the abort waits for it
  EXPECT_FALSE(a.raise);
  EXPECT_FALSE(a.busyWaitBegins);
  now = Awaited::Busy;
  a = d.check(p, 1, 4 * kSec + 300'000'000, awaited);
  EXPECT_FALSE(a.raise);
  EXPECT_TRUE(a.busyWaitBegins);
  a = d.check(p, 1, 5 * kSec, awaited);
  EXPECT_FALSE(a.raise);
  EXPECT_FALSE(a.busyWaitBegins);  // said once
  now = Awaited::NotBusy;          // it stopped progressing
  a = d.check(p, 1, 6 * kSec, awaited);
  ASSERT_TRUE(a.raise);
  EXPECT_EQ(a.raise->id(), "abort:9");
  EXPECT_EQ(a.raise->error, "busy-stopped");

  // Busy to the end: busy_cap.
  Deadlines c(milliseconds(1000), milliseconds(4000), 0.2, true, milliseconds(16000));
  const auto always = [](const Entry&) { return Awaited::Busy; };
  EXPECT_FALSE(c.check(p, 1, 15 * kSec, always).raise);
  auto end = c.check(p, 1, 16 * kSec + 1, always);
  ASSERT_TRUE(end.raise);
  EXPECT_EQ(end.raise->error, "busy-cap");

  // No look comes (the store is slow): the abort waits 2 s for one, then fires as before.
  Deadlines slow(milliseconds(1000), milliseconds(4000), 0.2, true, milliseconds(16000));
  const auto unknown = [](const Entry&) { return Awaited::Unknown; };
  EXPECT_FALSE(slow.check(p, 1, 5 * kSec, unknown).raise);
  auto late = slow.check(p, 1, 6 * kSec + 1, unknown);
  ASSERT_TRUE(late.raise);
  EXPECT_EQ(late.raise->error, "");

  // No cap above abort_after (busy_cap=0), a send/recv, or nothing busy: aborts at abort_after as before.
  Deadlines off(milliseconds(1000), milliseconds(4000), 0.2, true, milliseconds(0));
  EXPECT_EQ(off.busyLookAfterNs(), INT64_MAX);
  auto at = off.check(p, 1, 4 * kSec + 1, always);
  ASSERT_TRUE(at.raise);
  EXPECT_EQ(at.raise->kind, IncidentKind::Abort);
  EXPECT_EQ(at.raise->error, "");
  Deadlines p2p(milliseconds(100000), milliseconds(4000), 0.2, false, milliseconds(16000));
  EXPECT_TRUE(p2p.check(pendingAt(2, 0, 0), 1, 4 * kSec + 1, always).raise);
  Deadlines idle(milliseconds(1000), milliseconds(4000), 0.2, true, milliseconds(16000));
  EXPECT_TRUE(idle.check(p, 1, 4 * kSec + 1, [](const Entry&) { return Awaited::NotBusy; }).raise);
}

}  // namespace test_deadlines_status
