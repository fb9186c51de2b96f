// FailureDesk: the one code that fails a group, and the one that renders a
// difference a check mode hands it as a value (report/Difference.h).
#include "guard/watchdog/FailureDesk.h"

#include "guard/collective/GroupState.h"
#include "testkit.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace torch_ext;
using std::chrono::milliseconds;

namespace test_failure_desk {

namespace {

struct Desk {
  std::vector<uint64_t> dumped;
  std::vector<Verdict> published;
  FailureDesk desk{[this](GroupState&, uint64_t seq) { dumped.push_back(seq); },
                   [this](GroupState&, const Verdict& v) { published.push_back(v); }};
};

std::shared_ptr<GroupState> group(int rank) {
  auto st = std::make_shared<GroupState>(GroupIdentity{"0", rank, 2, {10, 11}}, Config(), testkit::groupStore(),
                                         milliseconds(60000));
  st->setDesc("default_pg");
  return st;
}

RankOp op(int64_t rank, const std::string& text, uint64_t hash) {
  RankOp o;
  o.globalRank = rank;
  o.text = text;
  o.where = "train.py:" + std::to_string(rank);
  o.hash = hash;
  return o;
}

}  // namespace

TEST(FailureDesk, RendersACollectiveDifferenceDumpsItsSeqAndFailsTheGroup) {
  Desk d;
  auto st = group(1);
  Difference diff;
  diff.group = st->label();
  diff.groupSize = 2;
  diff.seq = 7;
  diff.ops = {op(10, "all_reduce(float32[4], SUM)", 1), op(11, "all_reduce(float32[6], SUM)", 2)};
  ASSERT_TRUE(d.desk.file(*st, GroupFailure::of(diff, Telling{Telling::Who::GroupRankZero})));
  EXPECT_EQ(d.dumped, std::vector<uint64_t>{7});
  EXPECT_TRUE(d.published.empty());  // every rank found it: nothing to publish
  const auto f = st->failure();
  ASSERT_TRUE(f);
  EXPECT_EQ(f->kind, GuardErrorKind::Mismatch);
  // The failure's report is the renderer's, its facts the rendered verdict.
  const Verdict want = renderDifference(diff);
  EXPECT_EQ(f->report, want.text);
  EXPECT_NE(f->report.find("all_reduce(float32[6], SUM)"), std::string::npos) << f->report;
  ASSERT_TRUE(f->facts);
  EXPECT_EQ(f->facts->seq, 7u);
  EXPECT_EQ(f->facts->ops.size(), 2u);
  // The group's first failure stands.
  EXPECT_FALSE(d.desk.file(*st, GroupFailure{GuardErrorKind::Timeout, "later"}));
  EXPECT_EQ(st->failure()->report, want.text);
}

TEST(FailureDesk, PublishesASendRecvDifferenceFoundAloneAndDumpsNothing) {
  Desk d;
  auto st = group(1);
  Difference diff;
  diff.kind = Difference::Kind::SendRecv;
  diff.group = st->label();
  diff.groupSize = 2;
  diff.sender = {10, "send(float32[4], dst=1, tag=0)", 1, "a.py:3"};
  diff.receiver = {11, "recv(float32[6], src=0, tag=0)", 1, "a.py:9"};
  ASSERT_TRUE(d.desk.file(*st, GroupFailure::of(diff)));
  EXPECT_TRUE(d.dumped.empty());
  ASSERT_EQ(d.published.size(), 1u);
  EXPECT_EQ(d.published[0].reporter, 11);
  EXPECT_EQ(d.published[0].text, st->failure()->report);
  EXPECT_NE(st->failure()->report.find("do not pair"), std::string::npos) << st->failure()->report;
  EXPECT_NE(st->failure()->report.find("recv(float32[6], src=0, tag=0)"), std::string::npos);
}

TEST(FailureDesk, AFailureThatIsNoDifferenceIsFiledAsGiven) {
  Desk d;
  auto st = group(0);
  ASSERT_TRUE(d.desk.file(*st, GroupFailure{GuardErrorKind::StoreLost, "the store is gone"}));
  EXPECT_TRUE(d.dumped.empty());
  EXPECT_TRUE(d.published.empty());
  EXPECT_EQ(st->failure()->report, "the store is gone");
  EXPECT_EQ(st->failure()->kind, GuardErrorKind::StoreLost);
}

TEST(FailureDesk, ARangeDifferenceSaysWhatIsKnown) {
  Difference diff;
  diff.kind = Difference::Kind::Range;
  diff.group = "default_pg";
  diff.groupSize = 3;
  diff.seq = 4;
  diff.last = 9;
  const Verdict v = renderDifference(diff);
  EXPECT_EQ(v.kind, Verdict::Kind::Mismatch);
  EXPECT_EQ(v.seq, 4u);
  EXPECT_NE(v.text.find("collectives #4..#9+ on group \"default_pg\" (3 ranks) differ"), std::string::npos) << v.text;
  EXPECT_EQ(diff.dumpAt(), 4u);
  EXPECT_FALSE(diff.foundAlone());
}

}  // namespace test_failure_desk
