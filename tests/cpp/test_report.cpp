// Report: from the snapshots of all ranks of a group to "who is where". Inputs
// are built the way the watchdog builds them: one ledger per rank, entries
// turned into views, views put into responded snapshots.
#include "guard/report/Report.h"
#include "guard/collective/CallSite.h"
#include "guard/watchdog/Dumps.h"

#include <gtest/gtest.h>

#include <deque>
#include <string>
#include <vector>

using namespace torch_ext;

namespace test_report {

namespace {

constexpr auto CPU = c10::DeviceType::CPU;
constexpr int64_t kSec = 1000000000;
constexpr int64_t kNow = 1700000000 * kSec;

uint32_t site(const std::string& file, int line, const std::string& fn) {
  return CallSites::instance().intern({Frame{"/work/proj/" + file, line, fn}});
}

Fingerprint allReduce(int64_t n) {
  return FingerprintBuilder(Op::AllReduce)
      .meta(at::kFloat, {n}, CPU)
      .reduceOp(c10d::ReduceOp(c10d::ReduceOp::SUM))
      .finish();
}

Fingerprint broadcast(int64_t n, int64_t src) {
  return FingerprintBuilder(Op::Broadcast).meta(at::kFloat, {n}, CPU).root(src).finish();
}

Fingerprint p2p(Op op, int64_t n, int64_t peer, int64_t tag = 0) {
  return FingerprintBuilder(op).meta(at::kFloat, {n}, CPU).peer(peer, tag).finish();
}

// all_to_all_single on `me` with m[from][to] rows of 4 floats.
Fingerprint a2a(const std::vector<std::vector<int64_t>>& m, int64_t me) {
  std::vector<int64_t> recv;
  for (const auto& row : m) recv.push_back(row[me]);
  return FingerprintBuilder(Op::AllToAllSingle).meta(at::kFloat, {3, 4}, CPU).splits(me, m[me], recv).finish();
}

// One rank of a simulated group: its own ledger, like the real guard keeps.
struct Sim {
  explicit Sim(size_t capacity = 64) : ledger(capacity) {}
  Ledger ledger;
  // Records and (unless `pending`) completes; returns the record id.
  uint64_t op(Fingerprint fp, uint32_t where = 0, bool pending = false) {
    uint64_t seq = 0;
    uint64_t id = ledger.record(std::move(fp), where, &seq);
    if (!pending) ledger.complete(id, true);
    return id;
  }
};

GroupView viewOf(Sim& sim, const std::string& name, int rank, const std::vector<int64_t>& globals, size_t window = 64) {
  GroupView g;
  g.name = name;
  g.rank = rank;
  g.size = static_cast<int>(globals.size());
  g.globalRanks = globals;
  Progress p = sim.ledger.progress();
  g.lastSeq = p.lastSeq;
  g.lastCompletedSeq = p.lastCompletedSeq;
  g.lastCompletedNs = p.lastCompletedNs;
  g.rolling = p.rolling;
  for (const auto& e : sim.ledger.entries(window)) g.entries.push_back(entryView(e));
  return g;
}

RankInput responded(int groupRank, int64_t globalRank, const GroupView& g, MainThreadStack main = {}) {
  RankInput r;
  r.groupRank = groupRank;
  r.globalRank = globalRank;
  r.responded = true;
  r.groupName = g.name;
  r.snapshot.rank = globalRank;
  r.snapshot.main = std::move(main);
  r.snapshot.groups.push_back(g);
  return r;
}

RankInput silent(int groupRank, int64_t globalRank, const std::string& name, int64_t heartbeatNs) {
  RankInput r;
  r.groupRank = groupRank;
  r.globalRank = globalRank;
  r.groupName = name;
  r.heartbeatNs = heartbeatNs;
  return r;
}

// Inputs for `sims` (group rank i <-> sims[i]) of a group of global ranks `globals`.
std::vector<RankInput> inputs(std::deque<Sim>& sims, const std::vector<int64_t>& globals, const std::string& name = "0",
                              size_t window = 64) {
  std::vector<RankInput> out;
  for (size_t i = 0; i < sims.size(); ++i) {
    out.push_back(
        responded(static_cast<int>(i), globals[i], viewOf(sims[i], name, static_cast<int>(i), globals, window)));
  }
  return out;
}

// Sets the start time of the entry with collective seq `seq` (or record id, for p2p).
void setStart(RankInput& r, uint64_t seq, int64_t startNs, bool byId = false) {
  for (auto& e : r.snapshot.groups[0].entries) {
    if ((byId ? e.id : e.seq) == seq && (byId || !e.isP2P)) e.startNs = startNs;
  }
}

Incident incident(const std::string& kind, const std::string& subject, int64_t poster = 0) {
  Incident i;
  i.kind = parseIncidentKind(kind).value();
  i.subject = IncidentSubject::parse(subject).value();
  i.poster = poster;
  return i;
}

}  // namespace

TEST(Report, FormatRanksAndMismatch) {
  EXPECT_EQ(formatRanks({2}), "rank 2");
  EXPECT_EQ(formatRanks({0, 1, 3}), "ranks 0,1,3");
  EXPECT_EQ(incident("hang", "57").id(), "hang:57");
  {
    SCOPED_TRACE("FormatMismatchGroupsRanksByTextAndCallSiteInOrderOfAppearance");
    std::vector<RankOp> ops = {
        {0, true, "all_reduce(float32[10], SUM)", "train.py:20 in step", 1},
        {1, true, "broadcast(float32[10], src=0)", "train.py:30 in eval", 2},
        {2, true, "all_reduce(float32[10], SUM)", "train.py:20 in step", 1},
        {3, false, "has not issued #5 yet (last #4)", "", 0},
    };
    EXPECT_EQ(formatMismatch("default_pg", 4, 5, ops, "a note"),
              "collective #5 on group \"default_pg\" (4 ranks) differs across ranks:\n"
              "  ranks 0,2: all_reduce(float32[10], SUM)     at train.py:20 in step\n"
              "  rank 1:    broadcast(float32[10], src=0)    at train.py:30 in eval\n"
              "  rank 3:    has not issued #5 yet (last #4)\n"
              "  a note");
  }
}

TEST(Report, CollectiveMismatchAtTheFirstDifferingSeq) {
  const uint32_t step20 = site("train.py", 20, "step"), step21 = site("train.py", 21, "step"),
                 eval30 = site("train.py", 30, "eval"), init = site("train.py", 10, "setup");
  std::deque<Sim> sims(5);
  for (auto& s : sims) s.op(allReduce(10), init);  // #1 agrees
  sims[0].op(allReduce(10), step20, true);
  sims[1].op(allReduce(10), step20, true);
  sims[2].op(allReduce(10), step21, true);  // same op, another call site
  sims[3].op(broadcast(10, 0), eval30, true);
  // rank 4 has not issued #2; ranks 0 and 3 go on and differ again at #3.
  sims[0].op(allReduce(3), step20, true);
  sims[3].op(allReduce(4), step20, true);

  auto in = inputs(sims, {0, 1, 2, 3, 4});
  Verdict v = analyze("default_pg", in, incident("mismatch", "2"), kNow);
  EXPECT_EQ(v.kind, Verdict::Kind::Mismatch);
  EXPECT_EQ(v.seq, 2u);
  EXPECT_EQ(v.reporter, 0);
  EXPECT_EQ(v.text,
            "collective #2 on group \"default_pg\" (5 ranks) differs across ranks:\n"
            "  ranks 0,1: all_reduce(float32[10], SUM)     at train.py:20 in step\n"
            "  rank 2:    all_reduce(float32[10], SUM)     at train.py:21 in step\n"
            "  rank 3:    broadcast(float32[10], src=0)    at train.py:30 in eval\n"
            "  rank 4:    has not issued #2 yet (last #1)");
  EXPECT_EQ(v.group, "default_pg");
  EXPECT_EQ(v.incident, "mismatch:2");
  const auto& lines = v.ops;
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[3].text, "broadcast(float32[10], src=0)");
  EXPECT_EQ(lines[3].where, "train.py:30 in eval");
  EXPECT_TRUE(lines[3].issued);
  EXPECT_EQ(lines[4].globalRank, 4);
  EXPECT_FALSE(lines[4].issued);
  // The facts of each op the text names, once per text, and through the verdict's JSON.
  ASSERT_EQ(v.shown.size(), 2u);
  EXPECT_EQ(v.shown[0], (OpFacts{"all_reduce(float32[10], SUM)", "all_reduce", "float32", {10}, 1, "SUM"}));
  EXPECT_EQ(v.shown[1], (OpFacts{"broadcast(float32[10], src=0)", "broadcast", "float32", {10}, 1, ""}));
  EXPECT_EQ(Verdict::fromJson(Json::parse(v.toJson().dump())).shown, v.shown);
  {
    SCOPED_TRACE("MismatchNamesRanksThatDidNotAnswerOrForgotTheSeq");
    // Group of global ranks 7, 3, 5, 9: the reporter is the lowest that answered.
    const uint32_t a = site("a.py", 1, "f"), b = site("b.py", 2, "g");
    std::deque<Sim> sims;
    sims.emplace_back(64);
    sims.emplace_back(64);
    sims.emplace_back(2);  // a small ring: #1 falls out of it
    sims[0].op(allReduce(8), a);
    sims[1].op(allReduce(9), b);
    for (int i = 0; i < 3; ++i) sims[2].op(allReduce(8), a);
    auto in = inputs(sims, {7, 3, 5, 9});
    in.push_back(silent(3, 9, "0", 0));
    Verdict v = analyze("tp", in, incident("hang", "1"), kNow);
    EXPECT_EQ(v.kind, Verdict::Kind::Mismatch);
    EXPECT_EQ(v.seq, 1u);
    EXPECT_EQ(v.reporter, 3);
    const std::string gone = "#1 is no longer in its ledger (raise TORCH_EXT_LEDGER_SIZE)";
    auto pad = [&](const std::string& t) { return t + std::string(gone.size() - t.size(), ' '); };
    EXPECT_EQ(v.text,
              "collective #1 on group \"tp\" (4 ranks) differs across ranks:\n"
              "  rank 7: " +
                  pad("all_reduce(float32[8], SUM)") +
                  "  at a.py:1 in f\n"
                  "  rank 3: " +
                  pad("all_reduce(float32[9], SUM)") +
                  "  at b.py:2 in g\n"
                  "  rank 5: " +
                  gone +
                  "\n"
                  "  rank 9: did not answer (process gone or frozen)");
  }
}

TEST(Report, NoMismatchWhenAllRanksAgree) {
  std::deque<Sim> sims(3);
  for (auto& s : sims) {
    s.op(allReduce(10), site("t.py", 1, "f"));
    s.op(broadcast(10, 2), site("t.py", 2, "f"));
    s.op(p2p(Op::Send, 4, 1), 0);  // p2p ops never enter the collective comparison
  }
  sims[0].op(allReduce(5), 0, true);  // only one rank has issued #3: nothing to compare
  auto in = inputs(sims, {0, 1, 2});
  Verdict v = analyze("g", in, incident("mismatch", "3"), kNow);
  EXPECT_EQ(v.kind, Verdict::Kind::None);
  EXPECT_EQ(v.text, "no mismatch found in the ledger windows of group \"g\" for incident mismatch:3");
  EXPECT_EQ(v.reporter, -1);
  Verdict p = analyze("g", in, incident("p2p", "p2p-0-3"), kNow);
  EXPECT_EQ(p.kind, Verdict::Kind::None);
  EXPECT_EQ(p.text, "no mismatch found in the ledger windows of group \"g\" for incident p2p:p2p-0-3");
}

TEST(Report, DifferentHistoriesBeforeTheWindow) {
  // Both rings hold #3..#6 with equal fingerprints; #1 differed and is gone.
  const uint32_t w = site("loop.py", 9, "step");
  std::deque<Sim> sims;
  sims.emplace_back(4);
  sims.emplace_back(4);
  sims[0].op(allReduce(10), w);
  sims[1].op(allReduce(11), w);
  for (auto& s : sims) {
    for (int i = 0; i < 5; ++i) s.op(allReduce(4), w);
  }
  auto in = inputs(sims, {0, 1});
  ASSERT_EQ(in[0].group()->entries.front().seq, 3u);
  Verdict v = analyze("default_pg", in, incident("mismatch", "6"), kNow);
  EXPECT_EQ(v.kind, Verdict::Kind::Mismatch);
  EXPECT_EQ(v.seq, 3u);
  EXPECT_EQ(v.text,
            "collective #3 on group \"default_pg\" (2 ranks) differs across ranks:\n"
            "  ranks 0,1: all_reduce(float32[4], SUM)  at loop.py:9 in step\n"
            "  the ranks' histories already differ before #3: the first differing collective is no longer in the "
            "ledger (raise TORCH_EXT_LEDGER_SIZE)");
}

TEST(Report, AllToAllSplitsThatDoNotPair) {
  const std::vector<std::vector<int64_t>> m = {{1, 2, 0}, {3, 1, 1}, {0, 2, 2}};
  const uint32_t w = site("moe.py", 40, "dispatch");
  {
    std::deque<Sim> sims(3);
    for (int r = 0; r < 3; ++r) sims[r].op(a2a(m, r), w, true);
    EXPECT_EQ(analyze("ep", inputs(sims, {0, 1, 2}), incident("mismatch", "1"), kNow).kind, Verdict::Kind::None);
  }
  // Rank 2 expects 1 row from rank 0, which sends it none.
  std::deque<Sim> sims(3);
  sims[0].op(a2a(m, 0), w, true);
  sims[1].op(a2a(m, 1), w, true);
  sims[2].op(
      FingerprintBuilder(Op::AllToAllSingle).meta(at::kFloat, {3, 4}, CPU).splits(2, {0, 2, 2}, {1, 1, 2}).finish(), w,
      true);
  auto in = inputs(sims, {0, 1, 2});
  Verdict v = analyze("ep", in, incident("mismatch", "1"), kNow);
  EXPECT_EQ(v.kind, Verdict::Kind::Mismatch);
  EXPECT_EQ(v.seq, 1u);
  EXPECT_EQ(v.text,
            "collective #1 on group \"ep\" (3 ranks) differs across ranks:\n"
            "  rank 0: all_to_all_single(float32[*, 4], send=[1,2,0], recv=[1,3,0])  at moe.py:40 in dispatch\n"
            "  rank 1: all_to_all_single(float32[*, 4], send=[3,1,1], recv=[2,1,2])  at moe.py:40 in dispatch\n"
            "  rank 2: all_to_all_single(float32[*, 4], send=[0,2,2], recv=[1,1,2])  at moe.py:40 in dispatch\n"
            "  all-to-all splits do not pair: what ranks send differs from what their peers expect to receive");
  // With a rank that has not issued it yet, the sums cannot be judged.
  std::deque<Sim> partial(3);
  partial[0].op(a2a(m, 0), w, true);
  partial[2].op(
      FingerprintBuilder(Op::AllToAllSingle).meta(at::kFloat, {3, 4}, CPU).splits(2, {0, 2, 2}, {1, 1, 2}).finish(), w,
      true);
  EXPECT_EQ(analyze("ep", inputs(partial, {0, 1, 2}), incident("mismatch", "1"), kNow).kind, Verdict::Kind::None);
}

TEST(Report, P2PCounterpartWithAnotherSizeDoesNotPair) {
  const uint32_t a = site("pipe.py", 11, "send_act"), b = site("pipe.py", 22, "recv_act");
  std::deque<Sim> sims(2);
  sims[0].op(p2p(Op::Send, 4, 1), a, true);
  sims[1].op(p2p(Op::Recv, 8, 0), b, true);
  // Subgroup of global ranks 6 and 2; peers in the texts are group ranks.
  auto in = inputs(sims, {6, 2}, "pp");
  Verdict v = analyze("pp", in, incident("p2p", "p2p-0-1"), kNow);
  EXPECT_EQ(v.kind, Verdict::Kind::Mismatch);
  EXPECT_EQ(v.reporter, 6);
  EXPECT_EQ(v.text,
            "send/recv on group \"pp\" do not pair (dtype, element count or tag differ):\n"
            "  rank 6: send(float32[4], dst=1, tag=0) (#1) at pipe.py:11 in send_act\n"
            "    but rank 2 has recv(float32[8], src=0, tag=0) (#1) at pipe.py:22 in recv_act\n"
            "  rank 2: recv(float32[8], src=0, tag=0) (#1) at pipe.py:22 in recv_act\n"
            "    but rank 6 has send(float32[4], dst=1, tag=0) (#1) at pipe.py:11 in send_act");

  // Matching dtype and count (any shape): no mismatch, just a transport wait.
  std::deque<Sim> ok(2);
  ok[0].op(p2p(Op::Send, 4, 1), a, true);
  ok[1].op(FingerprintBuilder(Op::Recv).meta(at::kFloat, {2, 2}, CPU).peer(0, 0).finish(), b, true);
  EXPECT_EQ(analyze("pp", inputs(ok, {6, 2}, "pp"), incident("p2p", "p2p-0-1"), kNow).kind, Verdict::Kind::None);
  {
    SCOPED_TRACE("P2PPairsByOrdinal");
    // The second send pairs with the second recv, which has the wrong size.
    const uint32_t a = site("pipe.py", 11, "send_act"), b = site("pipe.py", 22, "recv_act");
    std::deque<Sim> sims(2);
    sims[0].op(p2p(Op::Send, 4, 1), a);
    sims[0].op(p2p(Op::Send, 4, 1), a, true);
    sims[1].op(p2p(Op::Recv, 4, 0), b);
    sims[1].op(p2p(Op::Recv, 5, 0), b, true);
    Verdict v = analyze("pp", inputs(sims, {0, 1}), incident("p2p", "p2p-0-2"), kNow);
    EXPECT_EQ(v.kind, Verdict::Kind::Mismatch);
    EXPECT_NE(v.text.find("rank 0: send(float32[4], dst=1, tag=0) (#2) at pipe.py:11 in send_act\n"
                          "    but rank 1 has recv(float32[5], src=0, tag=0) (#2)"),
              std::string::npos)
        << v.text;
  }
}

TEST(Report, EveryRankBlockedInP2PWithoutCounterpart) {
  const uint32_t a = site("ring.py", 5, "exchange"), b = site("ring.py", 6, "exchange");
  // Both ranks receive first: nobody sends.
  std::deque<Sim> sims(2);
  sims[0].op(allReduce(1), 0);
  sims[1].op(allReduce(1), 0);
  sims[0].op(p2p(Op::Recv, 4, 1), a, true);
  sims[1].op(p2p(Op::Recv, 4, 0), b, true);
  auto in = inputs(sims, {0, 1});
  Verdict v = analyze("default_pg", in, incident("hang", "p2p-0-2"), kNow);
  EXPECT_EQ(v.kind, Verdict::Kind::Mismatch);
  EXPECT_EQ(v.reporter, 0);
  EXPECT_EQ(
      v.text,
      "send/recv on group \"default_pg\" do not pair: every rank waits in a point-to-point op whose counterpart "
      "no peer has posted:\n"
      "  rank 0: recv(float32[4], src=1, tag=0) (#1) at ring.py:5 in exchange; rank 1 has posted no matching send\n"
      "  rank 1: recv(float32[4], src=0, tag=0) (#1) at ring.py:6 in exchange; rank 0 has posted no matching send");

  // Tags that differ: the send on tag 1 and the recv on tag 0 never meet.
  std::deque<Sim> tags(2);
  tags[0].op(p2p(Op::Send, 4, 1, 1), a, true);
  tags[1].op(p2p(Op::Recv, 4, 0, 0), b, true);
  Verdict t = analyze("default_pg", inputs(tags, {0, 1}), incident("hang", "p2p-0-1"), kNow);
  EXPECT_EQ(t.kind, Verdict::Kind::Mismatch);
  EXPECT_NE(t.text.find("rank 0: send(float32[4], dst=1, tag=1) (#1) at ring.py:5 in exchange; rank 1 has posted no "
                        "matching recv"),
            std::string::npos)
      << t.text;

  // One rank blocked elsewhere (a collective): no p2p verdict, a hang report instead.
  std::deque<Sim> other(2);
  other[0].op(p2p(Op::Recv, 4, 1), a, true);
  other[1].op(allReduce(1), b, true);
  EXPECT_EQ(analyze("default_pg", inputs(other, {0, 1}), incident("hang", "p2p-0-1"), kNow).kind, Verdict::Kind::Hang);

  // A peer whose window does not reach back to its first record cannot prove
  // it never posted the counterpart: no verdict.
  std::deque<Sim> lost;
  lost.emplace_back(64);
  lost.emplace_back(2);
  lost[0].op(p2p(Op::Recv, 4, 1), a, true);
  for (int i = 0; i < 3; ++i) lost[1].op(allReduce(1), b);
  lost[1].op(p2p(Op::Recv, 4, 0), b, true);
  EXPECT_NE(analyze("default_pg", inputs(lost, {0, 1}), incident("hang", "p2p-0-1"), kNow).kind,
            Verdict::Kind::Mismatch);
}

TEST(Report, HangReportSaysWhoWaitsWhoIsMissingAndWhoIsGone) {
  const uint32_t step = site("train.py", 50, "step"), other = site("train.py", 60, "other"),
                 fetch = site("data.py", 70, "fetch"), loop = site("train.py", 40, "loop");
  std::deque<Sim> sims(4);
  for (auto& s : sims) {
    for (int i = 0; i < 6; ++i) s.op(allReduce(10), loop);
  }
  sims[0].op(allReduce(10), step, true);
  sims[1].op(allReduce(10), step, true);
  sims[2].op(allReduce(10), other, true);
  sims[3].op(p2p(Op::Recv, 4, 0), fetch, true);  // waits for a send rank 0 never posts
  const std::vector<int64_t> globals = {0, 1, 2, 3, 4, 5};
  auto in = inputs(sims, globals);
  setStart(in[0], 7, kNow - 19 * kSec);
  setStart(in[1], 7, kNow - 20 * kSec);
  setStart(in[2], 7, kNow - 18 * kSec);
  in[3].snapshot.groups[0].lastCompletedNs = kNow - 12500000000;
  MainThreadStack main;
  main.available = true;
  main.frames = {Frame{"/x/data.py", 33, "next_batch"}, Frame{"/x/train.py", 44, "main"}};
  main.note = "main thread holds the GIL";
  in[3].snapshot.main = main;
  in.push_back(silent(4, 4, "0", kNow - 30 * kSec));
  RankInput left = silent(5, 5, "0", kNow - 5 * kSec);
  left.statusKnown = true;
  left.phase = RankPhase::Left;
  left.lastSeq = 6;
  in.push_back(left);
  RankInput exited = silent(6, 6, "0", kNow - 2 * kSec);
  exited.statusKnown = true;
  exited.phase = RankPhase::Exited;
  exited.lastSeq = 5;
  in.push_back(exited);

  Verdict v = analyze("default_pg", in, incident("hang", "7", 1), kNow);
  EXPECT_EQ(v.kind, Verdict::Kind::Hang);
  EXPECT_EQ(v.seq, 7u);
  EXPECT_EQ(v.reporter, 0);
  EXPECT_EQ(v.text,
            "collective #7 all_reduce(float32[10], SUM) on group \"default_pg\" has waited 20.0 s\n"
            "  waiting: ranks 0,1 at train.py:50 in step\n"
            "  waiting: rank 2 at train.py:60 in other\n"
            "  rank 3 has not arrived: last completed #6 12.5 s ago; waiting in recv(float32[4], src=0, tag=0) at "
            "data.py:70 in fetch; main thread now at\n"
            "    data.py:33 in next_batch <- train.py:44 in main [main thread holds the GIL]\n"
            "  rank 4: no heartbeat for 30.0 s (process gone or frozen)\n"
            "  rank 5: left the group (destroy_process_group) 5.0 s ago after issuing #6\n"
            "  rank 6: exited 2.0 s ago after issuing #5: its process ended without destroy_process_group (an "
            "uncaught exception, sys.exit or the end of its script)\n"
            "  ranks 0-3 issued collectives that ranks 5,6 never issued before ending:\n"
            "    #6 all_reduce(float32[10], SUM) at train.py:40 in loop\n"
            "    #7 all_reduce(float32[10], SUM) at train.py:50 in step (ranks 0,1)\n"
            "    #7 all_reduce(float32[10], SUM) at train.py:60 in other (rank 2)");
  EXPECT_EQ(v.waiting, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(v.notArrived, (std::vector<int64_t>{3}));
  EXPECT_EQ(v.gone, (std::vector<int64_t>{4, 5, 6}));
  EXPECT_TRUE(v.completed.empty());
  EXPECT_EQ(v.op, "all_reduce(float32[10], SUM)");
  EXPECT_EQ(v.incident, "hang:7");
  // Typed fields survive the trip through the store.
  Verdict back = Verdict::fromJson(Json::parse(v.toJson().dump()));
  EXPECT_EQ(back.gone, v.gone);
  EXPECT_EQ(back.waiting, v.waiting);
  EXPECT_EQ(back.notArrived, v.notArrived);
  EXPECT_EQ(back.op, v.op);
}

TEST(Report, RanksThatEndedAreToldApartFromRanksThatRanOutOfData) {
  // Ranks 1 and 2 finish (destroy_process_group after #5); rank 0 goes on to a
  // collective only it issues, from a line nobody ran before: rank-0-only
  // logging. No guess about data.
  const uint32_t loop = site("train.py", 40, "training_step");
  const uint32_t rank0Only = CallSites::instance().intern(
      {Frame{"/work/proj/train.py", 15, "Model.validation_step"},
       Frame{"/venv/site-packages/lightning/pytorch/utilities/distributed.py", 213, "_sync_ddp", "lightning"}});
  auto ended = [](int rank, uint64_t lastSeq) {
    RankInput r = silent(rank, rank, "0", kNow - kSec);
    r.statusKnown = true;
    r.phase = RankPhase::Left;
    r.lastSeq = lastSeq;
    return r;
  };
  {
    std::deque<Sim> sims(1);
    for (int i = 0; i < 5; ++i) sims[0].op(allReduce(1), loop);
    sims[0].op(allReduce(1), rank0Only, true);
    auto in = inputs(sims, {0});
    setStart(in[0], 6, kNow - kSec);
    in.push_back(ended(1, 5));
    in.push_back(ended(2, 5));
    Verdict v = analyze("default_pg", in, incident("failure", "6"), kNow);
    EXPECT_NE(v.text.find("\n  rank 1: left the group (destroy_process_group) 1.0 s ago after issuing #5\n"),
              std::string::npos)
        << v.text;
    EXPECT_NE(v.text.find("\n  rank 0 issued collectives that ranks 1,2 never issued before ending:\n"
                          "    #6 all_reduce(float32[1], SUM) at train.py:15 in Model.validation_step (via lightning "
                          ".../distributed.py:213 in _sync_ddp)"),
              std::string::npos)
        << v.text;
    EXPECT_EQ(v.text.find("ran out of data"), std::string::npos) << v.text;
  }
  {
    // Rank 1 left while rank 0 was still in the loop: the extra collectives
    // come from lines every rank ran before. That is "ran out of data?".
    std::deque<Sim> sims(1);
    for (int i = 0; i < 7; ++i) sims[0].op(allReduce(1), loop, i == 6);
    auto in = inputs(sims, {0});
    setStart(in[0], 7, kNow - kSec);
    in.push_back(ended(1, 5));
    Verdict v = analyze("default_pg", in, incident("hang", "7"), kNow);
    EXPECT_NE(v.text.find("rank 0 issued collectives that rank 1 never issued before ending:\n"
                          "    #6 all_reduce(float32[1], SUM) at train.py:40 in training_step\n"
                          "    #7 all_reduce(float32[1], SUM) at train.py:40 in training_step\n"
                          "  every rank had issued these from the same lines before: rank 1 stopped while the others "
                          "were still in the loop (ran out of data?)"),
              std::string::npos)
        << v.text;
  }
}

TEST(Report, HangInASubgroupUsesGlobalRanks) {
  // Group ranks 0, 1, 2 are global ranks 6, 2, 4; group rank 1 (global 2) waits.
  const uint32_t step = site("train.py", 50, "step");
  std::deque<Sim> sims(3);
  sims[1].op(allReduce(10), step, true);
  sims[2].op(allReduce(10), step);
  auto in = inputs(sims, {6, 2, 4}, "5");
  setStart(in[1], 1, kNow - 3 * kSec);
  Verdict v = analyze("dp", in, incident("hang", "1", 1), kNow);
  EXPECT_EQ(v.kind, Verdict::Kind::Hang);
  EXPECT_EQ(v.reporter, 2);
  EXPECT_EQ(v.text,
            "collective #1 all_reduce(float32[10], SUM) on group \"dp\" has waited 3.0 s\n"
            "  waiting: rank 2 at train.py:50 in step\n"
            "  completed it: rank 4\n"
            "  rank 6 has not arrived: no collective completed on this group yet; main thread now at\n"
            "    (no Python frames)");
  EXPECT_EQ(v.completed, (std::vector<int64_t>{4}));
}

TEST(Report, AllRanksInOneCollectiveNamesTheRankWhoseStreamHasNotBegunIt) {
  // FlagScale's "all ranks stuck": every host issued #1, one stream stalled
  // before it. Only the stream backend's start state tells the ranks apart.
  const uint32_t step = site("train.py", 50, "step");
  std::deque<Sim> sims(3);
  for (auto& s : sims) s.op(allReduce(10), step, true);
  auto in = inputs(sims, {0, 1, 2});
  for (auto& r : in) setStart(r, 1, kNow - 3 * kSec);
  for (int r = 0; r < 3; ++r) in[r].snapshot.groups[0].entries[0].streamStarted = (r != 1);
  Verdict v = analyze("dp", in, incident("hang", "1", 0), kNow);
  EXPECT_EQ(v.kind, Verdict::Kind::Hang);
  EXPECT_EQ(v.text,
            "collective #1 all_reduce(float32[10], SUM) on group \"dp\" has waited 3.0 s\n"
            "  waiting: ranks 0-2 at train.py:50 in step\n"
            "  rank 1: issued #1, but its stream has not begun it (held up at it or before it: a slow or hung "
            "kernel, or a collective of another group on the same stream); ranks 0,2 are in #1, waiting for it");
  // Unknown start states (gloo, NCCL without timing): nothing is said.
  for (auto& r : in) r.snapshot.groups[0].entries[0].streamStarted.reset();
  EXPECT_EQ(analyze("dp", in, incident("hang", "1", 0), kNow).text.find("stream"), std::string::npos);
}

TEST(Report, HangOfAP2POpNamesTheMissingPeer) {
  const uint32_t a = site("pipe.py", 11, "send_act");
  std::deque<Sim> sims(2);
  sims[0].op(allReduce(1), 0);
  sims[1].op(allReduce(1), 0);
  const uint64_t id = sims[0].op(p2p(Op::Send, 4, 1, 3), a, true);
  sims[1].op(allReduce(2), 0, true);  // rank 1 went on to a collective: no p2p verdict
  auto in = inputs(sims, {0, 1});
  setStart(in[0], id, kNow - 7 * kSec, /*byId=*/true);
  Verdict v = analyze("pp", in, incident("hang", "p2p-0-" + std::to_string(id), 0), kNow);
  EXPECT_EQ(v.kind, Verdict::Kind::Hang);
  EXPECT_EQ(v.reporter, 0);
  EXPECT_EQ(v.seq, 0u);
  EXPECT_EQ(v.text.substr(0, v.text.find('\n')), "send(float32[4], dst=1, tag=3) on group \"pp\" has waited 7.0 s");
  EXPECT_NE(v.text.find("\n  waiting: rank 0 at pipe.py:11 in send_act\n  rank 1 has not arrived: last completed #1"),
            std::string::npos)
      << v.text;
  EXPECT_EQ(v.notArrived, (std::vector<int64_t>{1}));
}

TEST(Report, FailureVerdictQuotesTheInnerError) {
  const uint32_t step = site("train.py", 50, "step");
  std::deque<Sim> sims(2);
  sims[0].op(allReduce(10), step, true);
  sims[1].op(allReduce(10), step, true);
  auto in = inputs(sims, {0, 1});
  setStart(in[0], 1, kNow - kSec);
  setStart(in[1], 1, kNow - kSec);
  Incident inc = incident("failure", "1", 1);
  inc.error = "Connection closed by peer [10.0.0.2]:4242";
  Verdict v = analyze("default_pg", in, inc, kNow);
  EXPECT_EQ(v.kind, Verdict::Kind::Failure);
  EXPECT_EQ(v.text,
            "collective #1 all_reduce(float32[10], SUM) on group \"default_pg\" failed in the inner backend (rank 1 "
            "saw: Connection closed by peer [10.0.0.2]:4242)\n"
            "  waiting: ranks 0,1 at train.py:50 in step");
}

TEST(Report, VerdictJsonRoundTrip) {
  std::deque<Sim> sims(2);
  sims[0].op(allReduce(10), site("t.py", 1, "f"), true);
  sims[1].op(allReduce(12), site("t.py", 1, "f"), true);
  Verdict v = analyze("g", inputs(sims, {3, 1}), incident("mismatch", "1"), kNow);
  ASSERT_EQ(v.kind, Verdict::Kind::Mismatch);
  const std::string text = v.toJson().dump();
  Verdict back = Verdict::fromJson(Json::parse(text));
  EXPECT_EQ(back.kind, v.kind);
  EXPECT_EQ(back.text, v.text);
  EXPECT_EQ(back.reporter, 1);
  EXPECT_EQ(back.seq, 1u);
  EXPECT_EQ(back.toJson().dump(), text);
  EXPECT_EQ(back.ops.size(), 2u);
  EXPECT_EQ(back.ops[0].hash, v.ops[0].hash);

  for (auto k : {Verdict::Kind::None, Verdict::Kind::Mismatch, Verdict::Kind::Hang, Verdict::Kind::Failure}) {
    Verdict x;
    x.kind = k;
    x.text = "t";
    x.seq = 9;
    x.reporter = 4;
    Verdict y = Verdict::fromJson(Json::parse(x.toJson().dump()));
    EXPECT_EQ(y.kind, k) << Verdict::kindName(k);
    EXPECT_EQ(y.seq, 9u);
    EXPECT_EQ(y.reporter, 4);
  }
  EXPECT_STREQ(Verdict::kindName(Verdict::Kind::Hang), "hang");
  EXPECT_STREQ(Verdict::kindName(Verdict::Kind::None), "none");
  Json bad = Json::parse(R"({"kind":"hang","text":"x","reporter":"0","seq":1})");
  try {
    Verdict::fromJson(bad);
    ADD_FAILURE() << "no error";
  } catch (const JsonError& e) {
    EXPECT_STREQ(e.what(), "verdict reporter must be an integer, got string");
  }
  // A kind this release does not know is an unreadable verdict, never "none".
  try {
    Verdict::fromJson(Json::parse(R"({"kind":"stall","text":"x","reporter":0,"seq":1})"));
    ADD_FAILURE() << "no error";
  } catch (const JsonError& e) {
    EXPECT_STREQ(e.what(), "verdict kind 'stall' is not one this torch_ext knows");
  }
}

TEST(Report, MismatchLinesSeparateRanksWhoseFingerprintsDifferBeyondTheText) {
  // 5 tensors: only the first 4 are shown, the 5th differs.
  auto coalesced = [](int64_t last) {
    FingerprintBuilder b(Op::AllReduceCoalesced);
    for (int64_t n : {1, 2, 3, 4}) b.meta(at::kFloat, {n}, CPU);
    b.meta(at::kFloat, {last}, CPU);
    return b.reduceOp(c10d::ReduceOp(c10d::ReduceOp::SUM)).finish();
  };
  ASSERT_EQ(coalesced(5).describe(), coalesced(6).describe());
  ASSERT_NE(coalesced(5).hash, coalesced(6).hash);
  const uint32_t w = site("ddp.py", 3, "sync_grads");
  std::deque<Sim> sims(2);
  sims[0].op(coalesced(5), w, true);
  sims[1].op(coalesced(6), w, true);
  Verdict v = analyze("default_pg", inputs(sims, {0, 1}), incident("mismatch", "1"), kNow);
  ASSERT_EQ(v.kind, Verdict::Kind::Mismatch);
  if (v.text.find("ranks 0,1:") != std::string::npos) {
    GTEST_SKIP() << "bug: formatMismatch groups ranks by (text, call site) only, so ranks whose fingerprints differ "
                    "beyond the text (5th+ tensor of a coalesced op) share one line and the report shows no "
                    "difference:\n"
                 << v.text;
  }
  EXPECT_NE(v.text.find("rank 0:"), std::string::npos) << v.text;
  EXPECT_NE(v.text.find("rank 1:"), std::string::npos) << v.text;
  // Both rows read alike: each shows its fingerprint, not only the first.
  EXPECT_NE(v.text.find("[fingerprint " + hex64(coalesced(5).hash).substr(0, 8) + "]"), std::string::npos) << v.text;
  EXPECT_NE(v.text.find("[fingerprint " + hex64(coalesced(6).hash).substr(0, 8) + "]"), std::string::npos) << v.text;
}

TEST(Report, MismatchRowsThatDifferInTheirPlaceShowNoFingerprint) {
  // One op from two lines: the places tell the rows apart, a hash would only add noise.
  Fingerprint a = allReduce(1), b = allReduce(1);
  b.hash ^= 1;  // what the text does not show differs (a metric's identity)
  std::deque<Sim> sims(2);
  sims[0].op(a, site("train.py", 10, "log_cat"), true);
  sims[1].op(b, site("train.py", 20, "log_dog"), true);
  Verdict v = analyze("default_pg", inputs(sims, {0, 1}), incident("mismatch", "1"), kNow);
  ASSERT_EQ(v.kind, Verdict::Kind::Mismatch) << v.text;
  EXPECT_NE(v.text.find("train.py:10 in log_cat"), std::string::npos) << v.text;
  EXPECT_NE(v.text.find("train.py:20 in log_dog"), std::string::npos) << v.text;
  EXPECT_EQ(v.text.find("[fingerprint"), std::string::npos) << v.text;
}

TEST(Report, LastWordsSayHowARanksProcessEnded) {
  for (const auto& w : {LastWordsWhy{LastWordsCause::Terminated, ""}, LastWordsWhy{LastWordsCause::Exited, ""},
                        LastWordsWhy{LastWordsCause::Raised, "ValueError: empty: shard 7 (at t.py:3 in f)"}}) {
    auto back = LastWordsWhy::decode(w.encode());
    ASSERT_TRUE(back.has_value()) << w.encode();
    EXPECT_EQ(back->cause, w.cause);
    EXPECT_EQ(back->exception, w.exception);
  }
  EXPECT_EQ((LastWordsWhy{LastWordsCause::Raised, "E: x"}.encode()), "raised: E: x");
  EXPECT_FALSE(LastWordsWhy::decode("hang:57").has_value());  // an incident's snapshot, not last words

  RankInput r;
  r.globalRank = 1;
  r.statusKnown = true;
  r.phase = RankPhase::Exited;
  r.lastSeq = 3;
  const int64_t now = 1700000000LL * 1000000000LL;
  r.heartbeatNs = now - 1400000000LL;
  // Without last words: what an exit can be.
  EXPECT_EQ(describeAbsent(r, now),
            "exited 1.4 s ago after issuing #3: its process ended without destroy_process_group (an uncaught "
            "exception, sys.exit or the end of its script)");
  // With them: what it raised.
  r.lastWords = true;
  r.snapshot.incident =
      LastWordsWhy{LastWordsCause::Raised, "ValueError: batch 3 is empty (at t.py:9 in step)"}.encode();
  EXPECT_EQ(describeAbsent(r, now),
            "exited 1.4 s ago after issuing #3, raising ValueError: batch 3 is empty (at t.py:9 in step)");
  EXPECT_EQ(lastWordsNote(r), "then its process exited, raising ValueError: batch 3 is empty (at t.py:9 in step)");
  r.snapshot.incident = "terminated";
  EXPECT_EQ(lastWordsNote(r), "then its process was terminated");
}

}  // namespace test_report
