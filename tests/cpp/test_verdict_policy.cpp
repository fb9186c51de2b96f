// VerdictPolicy: what a verdict does to a rank's group, decided from facts
// alone (no group, no store, no watchdog).
#include "guard/watchdog/VerdictPolicy.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace torch_ext;

namespace test_verdict_policy {

namespace {

VerdictFacts facts(Verdict::Kind verdict, IncidentKind incident) {
  VerdictFacts f;
  f.verdict = verdict;
  f.incident = incident;
  return f;
}

std::string describe(const VerdictActions& a) {
  std::string s = "logger " + std::to_string(static_cast<int>(a.logger)) + ", level " +
                  std::to_string(static_cast<int>(a.level)) + ", wording " +
                  std::to_string(static_cast<int>(a.wording)) + ", fail " +
                  (a.fail ? guardErrorKindName(*a.fail) : std::string("none"));
  return s + (a.endCycle ? ", ends the cycle" : "") + (a.deadlineReported ? ", deadline reported" : "");
}

}  // namespace

TEST(VerdictPolicy, AMismatchFailsTheGroupWhereTheModeComparesAndOnlyWarnsWhereChecksAreOff) {
  for (auto incident : {IncidentKind::Mismatch, IncidentKind::Hang, IncidentKind::Failure}) {
    const auto a = decideVerdict(facts(Verdict::Kind::Mismatch, incident));
    EXPECT_EQ(a.fail, GuardErrorKind::Mismatch) << describe(a);
    EXPECT_EQ(a.logger, VerdictLogger::Reporter);
    EXPECT_EQ(a.level, LogLevel::Error);
    EXPECT_EQ(a.wording, VerdictWording::AsFound);
  }
  VerdictFacts off = facts(Verdict::Kind::Mismatch, IncidentKind::Hang);
  off.compares = false;
  auto a = decideVerdict(off);
  EXPECT_FALSE(a.fail.has_value()) << describe(a);
  EXPECT_EQ(a.level, LogLevel::Warning);
  // Checks off, deadline on: the abort fails the group as a timeout, saying what differs.
  off.incident = IncidentKind::Abort;
  a = decideVerdict(off);
  EXPECT_EQ(a.fail, GuardErrorKind::Timeout) << describe(a);
  EXPECT_EQ(a.wording, VerdictWording::Abort);
  EXPECT_EQ(a.level, LogLevel::Error);
}

TEST(VerdictPolicy, AHangWarnsAtWarnAfterAndFailsAtAbortAfter) {
  auto a = decideVerdict(facts(Verdict::Kind::Hang, IncidentKind::Hang));
  EXPECT_FALSE(a.fail.has_value()) << describe(a);
  EXPECT_TRUE(a.deadlineReported);
  EXPECT_EQ(a.level, LogLevel::Warning);
  EXPECT_FALSE(a.remembersCycle);
  a = decideVerdict(facts(Verdict::Kind::Hang, IncidentKind::Abort));
  EXPECT_EQ(a.fail, GuardErrorKind::Timeout) << describe(a);
  EXPECT_EQ(a.wording, VerdictWording::Abort);
  EXPECT_FALSE(a.deadlineReported);
  EXPECT_FALSE(a.endCycle);
}

TEST(VerdictPolicy, ACertainDeadlockEndsEveryGroupOfItsCycleBeforeAnyDeadline) {
  VerdictFacts f = facts(Verdict::Kind::Hang, IncidentKind::Hang);
  f.cycle = true;
  f.certain = true;
  auto a = decideVerdict(f);
  EXPECT_EQ(a.fail, GuardErrorKind::Deadlock) << describe(a);
  EXPECT_TRUE(a.endCycle);
  EXPECT_TRUE(a.remembersCycle);
  EXPECT_EQ(a.logger, VerdictLogger::LowestOfLoop);
  EXPECT_EQ(a.wording, VerdictWording::Deadlock);
  // Not certain (a rank of the loop may still move), or ending deadlocks switched off:
  // a warning, remembered for the abort of the same collective.
  for (int which = 0; which < 2; ++which) {
    VerdictFacts g = f;
    (which == 0 ? g.certain : g.endDeadlocks) = false;
    a = decideVerdict(g);
    EXPECT_FALSE(a.fail.has_value()) << describe(a);
    EXPECT_FALSE(a.endCycle);
    EXPECT_TRUE(a.remembersCycle);
    EXPECT_TRUE(a.deadlineReported);
  }
  // At abort_after the loop is a timeout like any other (its headline comes from the warning).
  f.incident = IncidentKind::Abort;
  a = decideVerdict(f);
  EXPECT_EQ(a.fail, GuardErrorKind::Timeout) << describe(a);
  EXPECT_FALSE(a.endCycle);
}

TEST(VerdictPolicy, AnInnerFailureFailsTheGroupOnlyWhenItCannotRecover) {
  auto a = decideVerdict(facts(Verdict::Kind::Failure, IncidentKind::Failure));
  EXPECT_FALSE(a.fail.has_value()) << describe(a);
  EXPECT_EQ(a.level, LogLevel::Error);
  VerdictFacts gone = facts(Verdict::Kind::Failure, IncidentKind::Failure);
  gone.rankGone = true;
  EXPECT_EQ(decideVerdict(gone).fail, GuardErrorKind::Failure);
  VerdictFacts stream = facts(Verdict::Kind::Failure, IncidentKind::Failure);
  stream.streamOrdered = true;
  EXPECT_EQ(decideVerdict(stream).fail, GuardErrorKind::Failure);
}

TEST(VerdictPolicy, NoVerdictFailsNothingAndIsLoggedAtDebugOnly) {
  for (auto incident :
       {IncidentKind::Hang, IncidentKind::Abort, IncidentKind::Mismatch, IncidentKind::P2P, IncidentKind::Failure}) {
    const auto a = decideVerdict(facts(Verdict::Kind::None, incident));
    EXPECT_FALSE(a.fail.has_value()) << describe(a);
    EXPECT_EQ(a.logger, VerdictLogger::Everyone);
    EXPECT_EQ(a.level, LogLevel::Debug);
  }
}

}  // namespace test_verdict_policy
