// JoinHandshake (issue 57): the ranks of a guard group agree on their job-wide
// settings (rank 0's) and fail, named, when a rank does not join or cannot
// work with the others. Pure parts directly; the store protocol with one
// thread per rank on a HashStore.

#include "guard/Config.h"
#include "guard/Errors.h"
#include "guard/store/JoinHandshake.h"
#include "guard/store/StoreKeys.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

using namespace torch_ext;

namespace test_join_handshake {

namespace {

JoinRecord recordWith(std::map<std::string, std::string> overrides) {
  return JoinRecord::of(Config::resolve(overrides), "0.1.0", "2.13.0", "host", 1);
}

// A process of global rank `global` that asked for the group `members`.
JoinRecord asked(int64_t global, std::vector<int64_t> members) {
  JoinRecord r = recordWith({});
  r.globalRank = global;
  r.members = std::move(members);
  return r;
}

JoinContext context(int rank, int size, int timeoutMs = 20000) {
  JoinContext ctx;
  ctx.group = "g";
  ctx.rank = rank;
  ctx.size = size;
  ctx.warnAfter = std::chrono::milliseconds(60000);
  ctx.timeout = std::chrono::milliseconds(timeoutMs);
  return ctx;
}

}  // namespace

TEST(JoinHandshake, RecordsCarryTheJobWideSettingsExactlyAndRoundTrip) {
  const JoinRecord r = recordWith({{"check", "strict"}, {"warn_after", "2.5"}, {"interval", "0.1"}});
  EXPECT_EQ(r.settings.at("check"), "strict");
  EXPECT_EQ(r.sources.at("check"), "GuardOptions(check)");
  EXPECT_EQ(r.sources.at("inner"), "default");
  EXPECT_EQ(r.settings.count("dump_dir"), 0u);  // per-rank: not shared
  EXPECT_EQ(r.settings.count("join_timeout"), 0u);
  // Every job-wide value reads back as itself: what a rank adopts is exactly rank 0's value.
  for (const auto& s : settings()) {
    if (s.scope != SettingScope::Job) continue;
    const Config back = Config::resolve({{s.option, r.settings.at(s.option)}});
    EXPECT_EQ(s.show(back), r.settings.at(s.option)) << s.option;
  }
  auto again = JoinRecord::decode(r.encode());
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->settings, r.settings);
  EXPECT_EQ(again->sources, r.sources);
  EXPECT_EQ(again->protocol, kJoinProtocol);
  EXPECT_FALSE(JoinRecord::decode("{not json").has_value());
}

TEST(JoinHandshake, RankZerosJobWideValuesWinAndTheOverruledRankSaysSo) {
  const JoinRecord zero = recordWith({{"check", "strict"}});
  const JoinRecord one = recordWith({});
  const JoinVerdict v = JoinHandshake::conclude(context(0, 2), {zero, one});
  ASSERT_TRUE(v.ok) << v.error;
  const JoinResult r1 = JoinHandshake::apply(context(1, 2), one, v);
  ASSERT_EQ(r1.adopt.size(), 1u);
  EXPECT_EQ(r1.adopt.at("check"), "strict");
  ASSERT_EQ(r1.notes.size(), 1u);
  EXPECT_NE(r1.notes[0].find("check=verify here (the default), rank 0 has check=strict (from GuardOptions(check))"),
            std::string::npos)
      << r1.notes[0];
  EXPECT_TRUE(JoinHandshake::apply(context(0, 2), zero, v).adopt.empty());  // rank 0 says nothing
  // A per-rank setting differing is not part of it.
  const JoinRecord dumps = recordWith({{"check", "strict"}, {"dump_dir", "/tmp/x"}, {"ledger_size", "64"}});
  EXPECT_TRUE(JoinHandshake::apply(context(1, 2), dumps, v).adopt.empty());
}

TEST(JoinHandshake, RanksWhoseProtocolsDifferFailSideBySide) {
  JoinRecord zero = recordWith({});
  JoinRecord other = zero;
  other.protocol = kJoinProtocol + 1;
  other.torchExt = "9.9.9";
  const JoinVerdict v = JoinHandshake::conclude(context(0, 3), {zero, other, zero});
  ASSERT_FALSE(v.ok);
  EXPECT_NE(v.error.find("guard group \"g\" (3 ranks) cannot start"), std::string::npos) << v.error;
  const std::string ours = std::to_string(kJoinProtocol), theirs = std::to_string(kJoinProtocol + 1);
  EXPECT_NE(v.error.find("ranks 0,2: torch_ext 0.1.0 (join protocol " + ours + "), torch 2.13.0"), std::string::npos)
      << v.error;
  EXPECT_NE(v.error.find("rank 1:    torch_ext 9.9.9 (join protocol " + theirs + "), torch 2.13.0"), std::string::npos)
      << v.error;
}

TEST(JoinHandshake, MissingRanksAreNamedWithWhatIsKnown) {
  const std::string t = JoinHandshake::missingText(context(0, 4), {{1, "gloo"}, {3, ""}}, 1.5);
  EXPECT_NE(t.find("ranks 1,3 did not join it (found after 1.5 s)"), std::string::npos) << t;
  EXPECT_NE(t.find("rank 1: created a plain gloo group here"), std::string::npos) << t;
  EXPECT_NE(t.find("rank 3: never reached this group's creation"), std::string::npos) << t;
  EXPECT_NE(t.find("joined: ranks 0,2"), std::string::npos) << t;
  const std::string late = JoinHandshake::missingText(context(0, 2, 4000), {{1, ""}}, 4.0);
  EXPECT_NE(late.find("rank 1 did not join it within join_timeout (4 s)"), std::string::npos) << late;
  EXPECT_NE(late.find("set TORCH_EXT_JOIN_TIMEOUT"), std::string::npos) << late;
  const std::string old = JoinHandshake::missingText(context(0, 2), {{1, "guard"}}, 1.0);
  EXPECT_NE(old.find("without the join handshake (an older torch_ext)"), std::string::npos) << old;
}

TEST(JoinHandshake, EveryRankJoinsThroughTheStoreAndAdoptsRankZeros) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const int size = 4;
  std::vector<JoinResult> results(size);
  std::vector<std::thread> ranks;
  for (int r = size - 1; r >= 0; --r) {  // rank 0 last: the others wait for its verdict
    ranks.emplace_back([&, r] {
      const JoinRecord mine = recordWith(r == 2 ? std::map<std::string, std::string>{{"check", "off"}}
                                                : std::map<std::string, std::string>{});
      results[r] = JoinHandshake::join(*store, context(r, size), mine);
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < size; ++r) {
    if (r == 2) {
      EXPECT_EQ(results[r].adopt.at("check"), "verify");
    } else {
      EXPECT_TRUE(results[r].adopt.empty()) << r;
    }
  }
}

TEST(JoinHandshake, AGlooRankFailsEveryGuardRankAtOnceNamingIt) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  // Rank 1 created a plain gloo group at this prefix: its rendezvous key is there, no join record.
  store->set(keys::glooRendezvous(1), std::vector<uint8_t>{'x'});
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> errors(3);
  std::vector<std::thread> ranks;
  for (int r : {0, 2}) {
    ranks.emplace_back([&, r] {
      try {
        JoinHandshake::join(*store, context(r, 3), recordWith({}));
      } catch (const GroupJoinError& e) {
        errors[r] = e.what_without_backtrace();
      }
    });
  }
  for (auto& t : ranks) t.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 10.0);  // found, not waited out (join_timeout 20 s here)
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find("rank 1: created a plain gloo group here"), std::string::npos) << r << errors[r];
    EXPECT_EQ(errors[r], errors[0]);  // one verdict, the same text on every rank
  }
}

TEST(JoinHandshake, ARankThatNeverComesFailsTheOthersAtTheTimeout) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(3);
  std::vector<std::thread> ranks;
  for (int r : {0, 1}) {
    ranks.emplace_back([&, r] {
      try {
        JoinHandshake::join(*store, context(r, 3, 1500), recordWith({}));
      } catch (const GroupJoinError& e) {
        errors[r] = e.what_without_backtrace();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r : {0, 1}) {
    EXPECT_NE(errors[r].find("rank 2 did not join it within join_timeout (1.5 s)"), std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("rank 2: never reached this group's creation"), std::string::npos) << errors[r];
  }
}

TEST(JoinHandshake, MembersRoundTripAndListsThatDifferFailNamingEach) {
  const JoinRecord r = asked(2, {2, 3});
  const auto again = JoinRecord::decode(r.encode());
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->globalRank, 2);
  EXPECT_EQ(again->members, (std::vector<int64_t>{2, 3}));
  // Rank 0 concludes from one list: the verdict carries it.
  const JoinVerdict same = JoinHandshake::conclude(context(0, 2), {asked(0, {0, 1}), asked(1, {0, 1})});
  ASSERT_TRUE(same.ok) << same.error;
  EXPECT_EQ(same.members, (std::vector<int64_t>{0, 1}));
  // Each pair's first claimant of a group rank: new_group([0, 1]) on one, new_group([2, 3]) on the other.
  const JoinVerdict pairs = JoinHandshake::conclude(context(0, 2), {asked(0, {0, 1}), asked(3, {2, 3})});
  ASSERT_FALSE(pairs.ok);
  EXPECT_NE(pairs.error.find("asked for different member lists"), std::string::npos) << pairs.error;
  EXPECT_NE(pairs.error.find("new_group([0, 1]) on global rank 0"), std::string::npos) << pairs.error;
  EXPECT_NE(pairs.error.find("new_group([2, 3]) on global rank 3"), std::string::npos) << pairs.error;
  // One list, but a process stands where the list puts another.
  const JoinVerdict moved = JoinHandshake::conclude(context(0, 2), {asked(0, {0, 1}), asked(2, {0, 1})});
  EXPECT_FALSE(moved.ok);
}

TEST(JoinHandshake, TwoProcessesClaimingOneGroupRankFailEveryOneOfThem) {
  // Two pairs, each creating "its" group: torch gives both one name and one store. Whichever
  // claims come first, every process ends up with the refusal naming both lists: in the error
  // it raises, or in the group's alerts if its pair concluded first.
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(4);
  std::vector<std::thread> ranks;
  const auto start = std::chrono::steady_clock::now();
  for (int g = 0; g < 4; ++g) {
    ranks.emplace_back([&, g] {
      const std::vector<int64_t> pair = g < 2 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{2, 3};
      try {
        JoinHandshake::join(*store, context(g % 2, 2), asked(g, pair));
        // Both first claims were this pair's: its group concluded, and the other pair's refusal
        // reaches it in the group's alerts, as its watchdog reads them.
        const std::string prefix = keys::kPrefix;
        while (store->add(prefix + keys::kAlerts, 0) < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        const auto raw = store->get(prefix + keys::alert(1));
        errors[g] = keys::AlertRecord::decode(std::string(raw.begin(), raw.end()))->body;
        store->add(prefix + keys::kJoinSeen, 1);
      } catch (const GroupJoinError& e) {
        errors[g] = e.what_without_backtrace();
      }
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
  for (int g = 0; g < 4; ++g) {
    EXPECT_NE(errors[g].find("new_group([0, 1])"), std::string::npos) << g << errors[g];
    EXPECT_NE(errors[g].find("new_group([2, 3])"), std::string::npos) << g << errors[g];
  }
}

TEST(JoinHandshake, AClaimAfterTheGroupConcludedRefusesItThroughTheAlerts) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> first;
  for (int g : {0, 1}) first.emplace_back([&, g] { JoinHandshake::join(*store, context(g, 2), asked(g, {0, 1})); });
  for (auto& t : first) t.join();  // ranks 0 and 1 concluded: their group exists
  const std::string prefix = keys::kPrefix;
  // Ranks 0 and 1's watchdogs: they read the alert and say so, and the late
  // process, which may host the store, leaves then, not at kSeenWithin.
  std::thread watchdogs([&] {
    while (store->add(prefix + keys::kAlerts, 0) < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    store->add(prefix + keys::kJoinSeen, 2);
  });
  std::string error;
  const auto start = std::chrono::steady_clock::now();
  try {
    JoinHandshake::join(*store, context(0, 2), asked(2, {2, 3}));
  } catch (const GroupJoinError& e) {
    error = e.what_without_backtrace();
  }
  watchdogs.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, JoinHandshake::kSeenWithin);
  EXPECT_NE(error.find("two processes claim group rank 0"), std::string::npos) << error;
  // The group's watchdogs read it in the alerts (IncidentProtocol, kJoinRefused).
  const auto n = store->add(prefix + keys::kAlerts, 0);
  ASSERT_EQ(n, 1);
  const auto raw = store->get(prefix + keys::alert(1));
  const auto alert = keys::AlertRecord::decode(std::string(raw.begin(), raw.end()));
  ASSERT_TRUE(alert.has_value());
  EXPECT_EQ(alert->id, keys::kJoinRefused);
  EXPECT_EQ(alert->body, error);
}

}  // namespace test_join_handshake
