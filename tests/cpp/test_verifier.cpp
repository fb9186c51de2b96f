// The default check mode (check="verify"): its pacing on a made-up clock
// (BurstPacing), and whole groups of Verifiers in one process, meeting through
// the test kit's in-memory helper backend: rounds, verdicts, differences.

#include "guard/modes/verify/BurstPacing.h"
#include "guard/collective/Fingerprint.h"
#include "guard/collective/GroupState.h"
#include "guard/modes/verify/Verifier.h"
#include "testkit.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

using namespace torch_ext;
using std::chrono::milliseconds;

namespace test_verifier {

namespace {

constexpr int64_t kUs = 1000;
constexpr int64_t kMs = 1000 * kUs;

using OnIssue = BurstPacing::OnIssue;

// Issues a burst of `n` collectives `gapUs` apart from `t`; returns what each
// issue was told, and advances `t` past the burst.
std::vector<OnIssue> burst(BurstPacing& p, int64_t& t, int n, int64_t gapUs = 500) {
  std::vector<OnIssue> out;
  for (int i = 0; i < n; ++i) {
    if (i > 0) t += gapUs * kUs;
    out.push_back(p.issued(t));
  }
  return out;
}

// --- BurstPacing ----------------------------------------------------------------

TEST(BurstPacing, ARoundAtEachIssueUntilThreeBurstsOfOneLengthRepeat) {
  BurstPacing p;
  int64_t t = 0;
  for (int b = 0; b < 3; ++b) {
    for (auto a : burst(p, t, 4)) EXPECT_EQ(a, OnIssue::StartRound) << "burst " << b;
    EXPECT_FALSE(p.predicting());
    t += 30 * kMs;  // a forward pass of silence
  }
  // The fourth burst's first issue ends the third: predicted from here on,
  // one round per burst, at its last collective.
  const auto fourth = burst(p, t, 4);
  EXPECT_TRUE(p.predicting());
  EXPECT_EQ(p.burst(), 4u);
  EXPECT_EQ(fourth, (std::vector<OnIssue>{OnIssue::WaitForBurst, OnIssue::WaitForBurst, OnIssue::WaitForBurst,
                                          OnIssue::EndOfBurst}));
  t += 30 * kMs;
  EXPECT_EQ(burst(p, t, 4).back(), OnIssue::EndOfBurst);
  EXPECT_EQ(p.mispredictions(), 0u);
}

TEST(BurstPacing, BurstsOfDifferentLengthsAreNotPredicted) {
  BurstPacing p;
  int64_t t = 0;
  for (int n : {4, 5, 4, 5, 4, 5, 4}) {
    for (auto a : burst(p, t, n)) EXPECT_EQ(a, OnIssue::StartRound);
    t += 30 * kMs;
  }
  EXPECT_FALSE(p.predicting());
  EXPECT_EQ(p.burst(), 0u);
}

TEST(BurstPacing, ABurstWithAResultAskedForInsideNeverCounts) {
  // FSDP2 waits for each layer's all_gather inside its bursts: a round at
  // each issue, never a prediction.
  BurstPacing p;
  int64_t t = 0;
  for (int b = 0; b < 6; ++b) {
    burst(p, t, 2);
    p.demanded();
    burst(p, t, 2);
    t += 30 * kMs;
  }
  EXPECT_FALSE(p.predicting());
}

TEST(BurstPacing, ADemandEndsAPrediction) {
  BurstPacing p;
  int64_t t = 0;
  for (int b = 0; b < 4; ++b) {
    burst(p, t, 3);
    t += 30 * kMs;
  }
  ASSERT_TRUE(p.predicting());
  p.demanded();
  EXPECT_FALSE(p.predicting());
  EXPECT_EQ(p.issued(t), OnIssue::StartRound);
}

TEST(BurstPacing, ABurstThatGoesQuietEarlyIsMispredictedAndLearnedAnew) {
  BurstPacing p;
  int64_t t = 0;
  for (int b = 0; b < 4; ++b) {
    burst(p, t, 4);
    t += 30 * kMs;
  }
  ASSERT_TRUE(p.predicting());
  // Two of the four predicted: the burst goes quiet at quietAtNs().
  burst(p, t, 2);
  EXPECT_EQ(p.quietAtNs(), t + p.quietGapUs() * kUs);
  p.mispredicted();
  EXPECT_FALSE(p.predicting());
  EXPECT_EQ(p.mispredictions(), 1u);
  EXPECT_EQ(p.issued(t + 40 * kMs), OnIssue::StartRound);
}

TEST(BurstPacing, TheQuietGapIsHalfTheLongestRecentGapWithinBounds) {
  {
    BurstPacing p;  // fewer than 8 gaps known: 1 ms
    int64_t t = 0;
    burst(p, t, 5, 100'000);
    EXPECT_EQ(p.quietGapUs(), 1000);
  }
  {
    BurstPacing p;
    int64_t t = 0;
    burst(p, t, 12, 8000);  // longest 8 ms: 4 ms
    EXPECT_EQ(p.quietGapUs(), 4000);
  }
  {
    BurstPacing p;
    int64_t t = 0;
    burst(p, t, 12, 100'000);  // 100 ms gaps: at most 20 ms
    EXPECT_EQ(p.quietGapUs(), 20000);
  }
  {
    BurstPacing p;
    int64_t t = 0;
    burst(p, t, 12, 200);  // 0.2 ms gaps: at least 0.5 ms
    EXPECT_EQ(p.quietGapUs(), 500);
  }
}

// --- Verifier: a group in one process ----------------------------------------------

Fingerprint allReduce(int64_t n) {
  return FingerprintBuilder(Op::AllReduce).meta(at::kFloat, {n}, c10::DeviceType::CPU).finish();
}

// `size` ranks, each with a GroupState and a Verifier over the kit's helper;
// every Verifier reads the same made-up clock.
struct Group {
  explicit Group(int size) : rv(std::make_shared<testkit::Rendezvous>(size)) {
    for (int r = 0; r < size; ++r) {
      Config cfg;
      cfg.check = CheckMode::Verify;
      states.push_back(std::make_shared<GroupState>(GroupIdentity{"0", r, size, {}}, cfg, testkit::groupStore(),
                                                    milliseconds(60000)));
      states.back()->setDesc("default_pg");
      auto helper = c10::make_intrusive<testkit::MemHelper>(r, size, rv);
      verifiers.push_back(std::make_shared<Verifier>(states.back(), helper, [this] { return now.load(); }));
    }
  }
  ~Group() {
    // Stopped first: a round the abort fails then fails nothing else.
    for (auto& v : verifiers) v->stop();
    rv->abort("the test ended");
  }
  // Rank r issues an all_reduce of n floats, recorded in its ledger as the guard does.
  void issue(int r, int64_t n) {
    uint64_t seq = 0, rolling = 0;
    Fingerprint fp = allReduce(n);
    const uint64_t hash = fp.hash;
    states[r]->ledger().record(std::move(fp), 0, &seq, nullptr, &rolling);
    verifiers[r]->issued(seq, rolling, hash, 0, 0);
  }
  std::shared_ptr<testkit::Rendezvous> rv;
  std::vector<std::shared_ptr<GroupState>> states;
  std::vector<std::shared_ptr<Verifier>> verifiers;
  std::atomic<int64_t> now{0};
};

TEST(Verifier, MatchingCollectivesAreVerifiedOnEveryRank) {
  Group g(3);
  for (int i = 0; i < 5; ++i) {
    for (int r = 0; r < 3; ++r) g.issue(r, 4);
  }
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(g.verifiers[r]->drain(milliseconds(5000))) << "rank " << r;
    EXPECT_EQ(g.verifiers[r]->verifiedSeq(), 5u);
    EXPECT_FALSE(g.states[r]->failed());
  }
}

TEST(Verifier, NothingIsVerifiedBeforeEveryRankIssuedIt) {
  Group g(2);
  g.issue(0, 4);
  g.issue(0, 4);
  g.issue(1, 4);
  // Rank 1 has issued #1 only: #2 cannot be verified, on either rank.
  EXPECT_TRUE(g.verifiers[1]->drain(milliseconds(5000)));
  EXPECT_FALSE(g.verifiers[0]->verified(2));
  EXPECT_FALSE(g.verifiers[0]->drain(milliseconds(200)));
  g.issue(1, 4);
  EXPECT_TRUE(g.verifiers[0]->drain(milliseconds(5000)));
  EXPECT_TRUE(g.verifiers[1]->drain(milliseconds(5000)));
  EXPECT_EQ(g.verifiers[0]->verifiedSeq(), 2u);
}

TEST(Verifier, ADifferenceBlocksItsResultAndFailsEveryRankWithOneReport) {
  Group g(2);
  g.issue(0, 4);
  g.issue(1, 4);
  g.issue(0, 4);
  g.issue(1, 6);  // #2 differs: 6 floats on rank 1
  for (int r = 0; r < 2; ++r) {
    g.verifiers[r]->want(2);
    ASSERT_TRUE(g.states[r]->waitUntil([] { return false; }, milliseconds(5000)) || g.states[r]->failed());
    EXPECT_TRUE(g.verifiers[r]->verified(1)) << "the agreeing prefix is released";
    EXPECT_FALSE(g.verifiers[r]->verified(2));
    EXPECT_TRUE(g.verifiers[r]->blocked(2));
    EXPECT_EQ(g.verifiers[r]->firstUnverifiable(), 2u);
  }
  const auto f0 = g.states[0]->failure(), f1 = g.states[1]->failure();
  ASSERT_TRUE(f0 && f1);
  EXPECT_EQ(f0->kind, GuardErrorKind::Mismatch);
  EXPECT_EQ(f0->report, f1->report) << "every rank reads the same words";
  EXPECT_NE(f0->report.find("collective #2"), std::string::npos) << f0->report;
  EXPECT_NE(f0->report.find("float32[4]"), std::string::npos) << f0->report;
  EXPECT_NE(f0->report.find("float32[6]"), std::string::npos) << f0->report;
}

TEST(Verifier, ReleasesParkedResultsWhenVerifiedAndFailsThemOnADifference) {
  Group g(2);
  g.issue(0, 4);
  std::atomic<int> released{0}, failed{0};
  g.verifiers[0]->whenVerified(1, [&] { ++released; }, [&](std::exception_ptr) { ++failed; });
  EXPECT_EQ(released.load(), 0) << "rank 1 has not issued #1";
  g.issue(1, 4);
  EXPECT_TRUE(g.verifiers[0]->drain(milliseconds(5000)));
  EXPECT_EQ(released.load(), 1);

  g.issue(0, 4);
  g.issue(1, 8);
  g.verifiers[0]->whenVerified(2, [&] { ++released; }, [&](std::exception_ptr) { ++failed; });
  g.verifiers[0]->want(2);
  g.states[0]->waitUntil([] { return false; }, milliseconds(5000));
  ASSERT_TRUE(g.states[0]->failed());
  g.verifiers[0]->failParked(g.states[0]->failureError());
  EXPECT_EQ(released.load(), 1) << "a differing result is never released";
  EXPECT_EQ(failed.load(), 1);
}

TEST(Verifier, StatsCountRoundsAndTheLearnedBurstOnTheInjectedClock) {
  Group g(2);
  // DDP-like: bursts of 3 collectives 0.5 ms apart, 30 ms between the last
  // of one and the first of the next, on the made-up clock (no sleeping).
  for (int step = 0; step < 6; ++step) {
    for (int i = 0; i < 3; ++i) {
      if (i > 0) g.now += 500 * kUs;
      for (int r = 0; r < 2; ++r) g.issue(r, 4);
    }
    g.now += 30 * kMs;
  }
  // Read before draining: a result asked for ends a prediction.
  const auto s = g.verifiers[0]->stats();
  EXPECT_EQ(s.burst, 3u);
  EXPECT_EQ(s.quietMicros, 15000u);  // half the 30 ms gap
  EXPECT_EQ(s.issuedSeq, 18u);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(g.verifiers[r]->drain(milliseconds(5000)));
  const auto after = g.verifiers[0]->stats();
  EXPECT_EQ(after.verifiedSeq, 18u);
  // A round per issue for the three bursts it learned from, then one per burst.
  EXPECT_GT(after.rounds, 0u);
  EXPECT_LT(after.rounds, 18u);
}

}  // namespace

}  // namespace test_verifier
