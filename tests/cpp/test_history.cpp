// History and OpWords (issue 39): how each rank reached the collective
// where the ranks differ, folded into runs, and the words every rank sends in
// the default check mode's difference report.
#include "guard/report/OpWords.h"
#include "guard/report/History.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace torch_ext;

namespace test_history {

namespace {

// `n` collectives `op` at `where`, seqs from `from`.
void add(std::vector<HistoryItem>& items, uint64_t& seq, int n, const std::string& op, const std::string& where) {
  for (int i = 0; i < n; ++i) items.push_back(HistoryItem{seq++, op, where});
}

// A rank that issued `steps` gradient all_reduces at train.py:67, then `then` (if any).
RankHistory loopRank(int64_t rank, int steps, const std::string& then = "", const std::string& thenWhere = "") {
  std::vector<HistoryItem> items;
  uint64_t seq = 1;
  add(items, seq, 1, "broadcast", "train.py:50 in <module>");
  add(items, seq, steps, "all_reduce", "train.py:67 in <module>");
  if (!then.empty()) add(items, seq, 1, then, thenWhere);
  return RankHistory{rank, true, historyRuns(items, kHistoryRuns)};
}

}  // namespace

TEST(History, RunsFoldConsecutiveCollectivesFromOneSite) {
  std::vector<HistoryItem> items;
  uint64_t seq = 1;
  add(items, seq, 1, "broadcast", "a.py:1 in f");
  add(items, seq, 3, "all_reduce", "a.py:2 in f");
  add(items, seq, 1, "all_reduce", "a.py:3 in f");  // same op, other site: a new run
  add(items, seq, 2, "all_reduce", "a.py:2 in f");
  const auto all = historyRuns(items, 10);
  ASSERT_EQ(all.size(), 4u);
  EXPECT_EQ(all[1], (HistoryRun{2, 4, 3, "all_reduce", "a.py:2 in f"}));
  EXPECT_EQ(all[3], (HistoryRun{6, 7, 2, "all_reduce", "a.py:2 in f"}));
  // Only the newest runs kept.
  const auto last2 = historyRuns(items, 2);
  ASSERT_EQ(last2.size(), 2u);
  EXPECT_EQ(last2[0].firstSeq, 5u);
  // A gap in seqs (a window with a hole) starts a new run.
  std::vector<HistoryItem> gap{{1, "all_reduce", "a.py:2"}, {3, "all_reduce", "a.py:2"}};
  EXPECT_EQ(historyRuns(gap, 10).size(), 2u);
}

TEST(History, EncodeDecodeRoundTrip) {
  std::vector<HistoryRun> runs{{1, 1, 1, "broadcast", "train.py:50 in <module>"},
                               {2, 27, 26, "all_reduce", "train.py:67 in <module> (via torch .../x.py:3 in y)"}};
  EXPECT_EQ(decodeHistory(encodeHistory(runs)), runs);
  // Tabs and newlines in a text cannot break the format.
  std::vector<HistoryRun> odd{{5, 5, 1, "all\treduce", "a\nb.py:1"}};
  const auto back = decodeHistory(encodeHistory(odd));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].op, "all reduce");
  EXPECT_EQ(back[0].where, "a b.py:1");
  // A cut-short text drops the partial run, never misreads it.
  const std::string text = encodeHistory(runs);
  EXPECT_EQ(decodeHistory(text.substr(0, text.size() - 10)).size(), 1u);
  EXPECT_TRUE(decodeHistory("garbage\tx\ty\tz\tw\n").empty());
}

TEST(History, AnEarlierEndOfALoopIsRead) {
  // Rank 1 ran one step fewer: it reaches the barrier after the loop where
  // rank 0 still issues a gradient all_reduce (#28).
  const std::vector<RankHistory> ranks{loopRank(0, 27), loopRank(1, 26, "barrier", "train.py:74 in <module>")};
  const std::string text28 = formatHistories(ranks, 28);
  EXPECT_EQ(text28,
            "\n  how each rank got to #28 (its collectives from #1 on, each run from one call site counted):"
            "\n    rank 0: #1       1 x broadcast at train.py:50 in <module>"
            "\n            #2-#28  27 x all_reduce at train.py:67 in <module>"
            "\n    rank 1: #1       1 x broadcast at train.py:50 in <module>"
            "\n            #2-#27  26 x all_reduce at train.py:67 in <module>"
            "\n            #28      1 x barrier at train.py:74 in <module>"
            "\n  reading: rank 1 issued barrier at train.py:74 in <module> after 26 x all_reduce at train.py:67 in "
            "<module>, where rank 0 issued a 27th all_reduce there: rank 1 left that loop earlier (fewer batches than "
            "rank 0: uneven data per rank, such as a sampler or shard split that gives ranks different batch counts) "
            "or took a branch the others did not (a collective under `if rank == ...`)");
  // Windows that reach back to different collectives are shown from the same one on.
  RankHistory late = loopRank(0, 27);
  late.runs.erase(late.runs.begin());
  late.runs[0].firstSeq = 5;  // rank 0's window begins at #5, inside the loop
  late.runs[0].count = 24;
  const std::string cut = formatHistories({late, loopRank(1, 26, "barrier", "train.py:74 in <module>")}, 28);
  EXPECT_NE(cut.find("its collectives from #5 on"), std::string::npos) << cut;
  EXPECT_NE(cut.find("\n    rank 1: #5-#27  23 x all_reduce"), std::string::npos) << cut;
  EXPECT_NE(cut.find("where rank 0 issued a 24th all_reduce there"), std::string::npos) << cut;
  // Ranks with the same history share a line; the reading names them together.
  const std::vector<RankHistory> four{loopRank(0, 9), loopRank(1, 8, "barrier", "t.py:9 in main"), loopRank(2, 9),
                                      loopRank(3, 8, "barrier", "t.py:9 in main")};
  const std::string text = formatHistories(four, 10);
  EXPECT_NE(text.find("\n    ranks 0,2: #1"), std::string::npos) << text;
  EXPECT_NE(text.find("reading: ranks 1,3 issued barrier at t.py:9 in main after 8 x all_reduce"), std::string::npos)
      << text;
  EXPECT_NE(text.find("where ranks 0,2 issued a 9th all_reduce there"), std::string::npos) << text;
}

TEST(History, RunsOfOneLoopInterruptedByOtherCollectivesCountTogether) {
  // DDP: the first step's all_reduce (#2), its bucket-rebuild broadcasts (#3-#4),
  // then the other steps': rank 1 ran 21 steps, rank 0 is in its 22nd.
  auto ddp = [](int64_t rank, int steps, bool barrier) {
    std::vector<HistoryItem> items;
    uint64_t seq = 1;
    add(items, seq, 1, "broadcast", "t.py:40 in main");
    add(items, seq, 1, "all_reduce", "t.py:53 in train");
    add(items, seq, 2, "broadcast", "t.py:52 in train");
    add(items, seq, steps - 1, "all_reduce", "t.py:53 in train");
    if (barrier) add(items, seq, 1, "barrier", "t.py:56 in train");
    return RankHistory{rank, true, historyRuns(items, kHistoryRuns)};
  };
  const std::string text = formatHistories({ddp(0, 22, false), ddp(1, 21, true)}, 25);
  EXPECT_NE(text.find("reading: rank 1 issued barrier at t.py:56 in train after 21 x all_reduce at t.py:53 in train, "
                      "where rank 0 issued a 22nd all_reduce there"),
            std::string::npos)
      << text;
}

TEST(History, RankZeroAloneReadsAsARankZeroOnlyBlockFirst) {
  const std::vector<RankHistory> ranks{loopRank(0, 4, "barrier", "m.py:27 in train"), loopRank(1, 5), loopRank(2, 5)};
  const std::string text = formatHistories(ranks, 6);
  EXPECT_NE(text.find("reading: rank 0 issued barrier at m.py:27 in train after 4 x all_reduce at train.py:67 in "
                      "<module>, where ranks 1,2 issued a 5th all_reduce there: rank 0 took a branch the others did "
                      "not (a collective inside `if rank == 0:`"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("or rank 0 left that loop earlier (fewer batches than ranks 1,2"), std::string::npos) << text;
}

TEST(History, SaysNothingTheMismatchLinesDoNotAlreadySay) {
  // Same history up to the differing collective: nothing to add.
  const std::vector<RankHistory> same{loopRank(0, 3, "all_reduce", "a.py:1 in f"),
                                      loopRank(1, 3, "broadcast", "a.py:2 in f")};
  EXPECT_EQ(formatHistories(same, 5), "");
  // Fewer than two known histories.
  EXPECT_EQ(formatHistories({loopRank(0, 3), RankHistory{1, false, {}}}, 4), "");
  EXPECT_EQ(formatHistories({}, 4), "");
  // Histories that part before the differing collective are shown, without a
  // reading when the pattern is not one it knows.
  RankHistory a{0, true, {{1, 3, 3, "all_reduce", "a.py:1 in f"}, {4, 4, 1, "all_reduce", "a.py:2 in f"}}};
  RankHistory b{1, true, {{1, 3, 3, "all_reduce", "a.py:1 in f"}, {4, 4, 1, "all_reduce", "a.py:9 in g"}}};
  const std::string text = formatHistories({a, b, RankHistory{2, true, {{1, 5, 5, "all_reduce", "a.py:1 in f"}}}}, 5);
  EXPECT_NE(text.find("how each rank got to #5"), std::string::npos) << text;
  EXPECT_EQ(text.find("reading:"), std::string::npos) << text;
}

TEST(History, WhereLookAlikesFromDifferentLinesPartTheReadingNamesTheLineSkipped) {
  // One helper gathers each module's shard; rank 1 skips the vision tower's gather.
  const std::string vision = "m.py:28 in gather from m.py:36 in step";
  const std::string text = "m.py:28 in gather from m.py:38 in step";
  const std::string loss = "m.py:40 in step";
  std::vector<HistoryItem> zero, one;
  uint64_t a = 1, b = 1;
  add(zero, a, 1, "all_gather", vision);
  add(zero, a, 1, "all_gather", text);
  add(zero, a, 1, "all_reduce", loss);
  add(zero, a, 1, "all_gather", vision);
  add(zero, a, 1, "all_gather", text);  // #5, against rank 1's all_reduce
  add(one, b, 1, "all_gather", vision);
  add(one, b, 1, "all_gather", text);
  add(one, b, 1, "all_reduce", loss);
  add(one, b, 1, "all_gather", text);  // #4: rank 0's vision gather's pair
  add(one, b, 1, "all_reduce", loss);
  const std::string out =
      formatHistories({RankHistory{0, true, historyRuns(zero, 8)}, RankHistory{1, true, historyRuns(one, 8)}}, 5);
  EXPECT_NE(out.find("reading: the histories part at #4: rank 0 issued all_gather at " + vision +
                     ", rank 1 issued it at " + text + "; rank 1 skipped rank 0's"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("so #4 paired look-alikes (one signature, two lines)"), std::string::npos) << out;
  // A skipped branch: the reading says how to take it together (issue 68).
  EXPECT_NE(out.find("Decide such a branch together: `if torch_ext.agree(flag, \"any\"):`"), std::string::npos) << out;
  // The line that called a site shows where a site is reached from more than one line only.
  EXPECT_NE(out.find("1 x all_reduce at m.py:40 in step\n"), std::string::npos) << out;
  EXPECT_NE(out.find("1 x all_gather at " + vision), std::string::npos) << out;
}

TEST(History, ALookAlikeAtTheDifferingCollectiveIsWhereThePathsPart) {
  // A gradient hook's all_reduce against a norm all_reduce of one signature, call paths compared.
  const std::string hook = "t.py:13 in sync_grad from t.py:22 in <module>";
  const std::string norm = "t.py:24 in <module>";
  std::vector<HistoryItem> zero, one;
  uint64_t a = 1, b = 1;
  for (auto* items : {&zero, &one}) {
    uint64_t& seq = items == &zero ? a : b;
    add(*items, seq, 1, "all_reduce", hook);
    add(*items, seq, 1, "all_reduce", norm);
  }
  add(zero, a, 1, "all_reduce", hook);  // #3: rank 1's hook did not run
  add(one, b, 1, "all_reduce", norm);
  const std::vector<RankHistory> ranks{RankHistory{0, true, historyRuns(zero, 8)},
                                       RankHistory{1, true, historyRuns(one, 8)}};
  const std::string out = formatHistories(ranks, 3, /*lookAlike=*/true);
  EXPECT_NE(out.find("reading: the histories part at #3: rank 0 issued all_reduce at " + hook +
                     ", rank 1 issued it at " + norm + "; a collective issued on some ranks only"),
            std::string::npos)
      << out;
  // Signatures that differ at #3 are no look-alike: no parting read there.
  EXPECT_EQ(formatHistories(ranks, 3).find("the histories part"), std::string::npos);
}

TEST(OpWords, RoundTripAndFitsItsBudget) {
  OpWords w;
  w.text = "all_reduce(float32[9], SUM)";
  w.where = "train.py:67 in <module>";
  w.caller = "train.py:90 in main";
  w.hint = "a hint";
  w.hash = 0xfedcba9876543210ULL;
  w.metricSync = true;
  w.metrics = {"val_loss", "val_acc"};
  w.history = {{1, 1, 1, "broadcast", "train.py:50"}, {2, 27, 26, "all_reduce", "train.py:67"}};
  w.facts = OpFacts{w.text, "all_reduce", "float32", {3, 3}, 1, "SUM"};
  const OpWords back = OpWords::decode(w.encode(2047));
  EXPECT_EQ(back.facts, w.facts);
  EXPECT_EQ(back.text, w.text);
  EXPECT_EQ(back.where, w.where);
  EXPECT_EQ(back.caller, w.caller);
  EXPECT_EQ(back.hint, w.hint);
  EXPECT_EQ(back.hash, w.hash);
  EXPECT_TRUE(back.metricSync);
  EXPECT_EQ(back.metrics, w.metrics);
  EXPECT_EQ(back.history, w.history);
  // Separators inside a text are replaced, never misread as fields.
  OpWords odd;
  odd.where = std::string("a\x1f") + "b";
  EXPECT_EQ(OpWords::decode(odd.encode(2047)).where, "a b");
  // Over budget: the oldest runs go first, then the text is cut.
  const std::string full = w.encode(2047);
  const OpWords fewer = OpWords::decode(w.encode(full.size() - 1));
  ASSERT_EQ(fewer.history.size(), 1u);
  EXPECT_EQ(fewer.history[0].firstSeq, 2u);
  EXPECT_EQ(fewer.text, w.text);
  // The hash goes first: a cut keeps it.
  const size_t head = std::to_string(w.hash).size() + 1;
  EXPECT_LE(w.encode(head + 10).size(), head + 10);
  EXPECT_EQ(OpWords::decode(w.encode(head + 10)).text, w.text.substr(0, 10));
  EXPECT_EQ(OpWords::decode(w.encode(head + 10)).hash, w.hash);
  // The report's row.
  const RankOp row = back.rankOp(7);
  EXPECT_EQ(row.globalRank, 7);
  EXPECT_EQ(row.text, w.text);
  EXPECT_EQ(row.where, w.where);
  EXPECT_EQ(row.caller, w.caller);
  EXPECT_EQ(row.hint, w.hint);
  EXPECT_EQ(row.hash, w.hash);
  EXPECT_EQ(row.facts, w.facts);
  // Nothing sent: the defaults.
  EXPECT_TRUE(OpWords::decode("").history.empty());
  EXPECT_FALSE(OpWords::decode("").facts.known());
  // A rank whose ledger no longer holds the op sends no facts.
  OpWords none;
  EXPECT_FALSE(OpWords::decode(none.encode(2047)).facts.known());
}

}  // namespace test_history
