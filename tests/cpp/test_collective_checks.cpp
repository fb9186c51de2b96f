// CollectiveChecks: strict mode's checks, for 2 and 3 ranks as threads of one
// process. Each rank has its own GroupState over one shared in-memory store,
// and a helper backend that runs its all_reduce (SUM, MAX on int64) and
// _allgather_base across the ranks in memory: the last rank to arrive at a
// call computes the result and completes every rank's work, so the checks
// wait on their helper's future as they do on gloo's.
//
// Every wait is bounded: if the ranks do not all finish in time, every group
// is failed and every pending helper op errored, which ends the waits; the
// test then fails instead of hanging.
#include "guard/collective/CollectiveChecks.h"
#include "guard/modes/Modes.h"

#include "guard/Errors.h"
#include "guard/report/Messages.h"
#include "guard/store/StoreKeys.h"
#include "testkit.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace torch_ext;
using std::chrono::milliseconds;

namespace test_collective_checks {

namespace {

constexpr auto CPU = c10::DeviceType::CPU;
using testkit::MemHelper;
using testkit::Rendezvous;

// `size` ranks (global ranks 10, 11, ...), strict or not, over one store.
struct World {
  World(int size, bool strict, bool withHelper = true) : rv(std::make_shared<Rendezvous>(size)) {
    for (int r = 0; r < size; ++r) {
      Config cfg;
      cfg.check = strict ? CheckMode::Strict : CheckMode::Async;
      std::vector<int64_t> global;
      for (int i = 0; i < size; ++i) global.push_back(10 + i);
      states.push_back(std::make_shared<GroupState>(GroupIdentity{"0", r, size, global}, cfg,
                                                    testkit::groupStore(store, milliseconds(5000)),
                                                    milliseconds(60000)));
      states.back()->setDesc("default_pg");
      helpers.push_back(withHelper ? c10::make_intrusive<MemHelper>(r, size, rv) : nullptr);
      installMode(states.back(), helpers.back());
      checks.push_back(std::make_unique<CollectiveChecks>(states.back()));
    }
  }
  int size() const {
    return static_cast<int>(states.size());
  }

  // What one rank's call did: returned, or threw (which type, what text).
  struct Result {
    bool threw = false;
    bool mismatch = false;  // a CollectiveMismatchError
    std::string text;
  };

  // Runs body(r) on a thread per rank. If they do not all finish within
  // `bound`, fails every group and errors every pending helper op (which ends
  // every wait of the checks), then joins.
  std::vector<Result> run(const std::function<void(int)>& body, std::chrono::seconds bound = std::chrono::seconds(30)) {
    std::vector<Result> results(size());
    std::mutex mu;
    std::condition_variable cv;
    int done = 0;
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) {
      threads.emplace_back([&, r] {
        Result res;
        try {
          body(r);
        } catch (const CollectiveMismatchError& e) {
          res.threw = true;
          res.mismatch = true;
          res.text = e.what_without_backtrace();
        } catch (const std::exception& e) {
          res.threw = true;
          res.text = e.what();
        }
        std::lock_guard<std::mutex> lock(mu);
        results[r] = res;
        ++done;
        cv.notify_all();
      });
    }
    bool inTime;
    {
      std::unique_lock<std::mutex> lock(mu);
      inTime = cv.wait_for(lock, bound, [&] { return done == size(); });
    }
    if (!inTime) {
      ADD_FAILURE() << "the ranks did not finish within " << bound.count() << " s: ending their waits";
      for (auto& st : states) st->fail(GuardErrorKind::Timeout, "test time bound");
      rv->abort("test time bound");
    }
    for (auto& t : threads) t.join();
    return results;
  }

  std::vector<std::string> guardKeys() {
    std::vector<std::string> out;
    for (const auto& k : store->listKeys()) {
      if (k.rfind(keys::kPrefix, 0) == 0) out.push_back(k);
    }
    return out;
  }

  c10::intrusive_ptr<c10d::HashStore> store = c10::make_intrusive<c10d::HashStore>();
  std::shared_ptr<Rendezvous> rv;
  std::vector<std::shared_ptr<GroupState>> states;
  std::vector<c10::intrusive_ptr<MemHelper>> helpers;
  std::vector<std::unique_ptr<CollectiveChecks>> checks;
};

Fingerprint allReduce(int64_t n, c10::ScalarType dtype = at::kFloat) {
  return FingerprintBuilder(Op::AllReduce).meta(dtype, {n}, CPU).reduceOp(c10d::ReduceOp(c10d::ReduceOp::SUM)).finish();
}

Fingerprint allToAll(int me, const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  return FingerprintBuilder(Op::AllToAll).meta(at::kFloat, {4, 2}, CPU).splits(me, send, recv).finish();
}

Fingerprint send(int dst, int64_t n, int tag, c10::ScalarType dtype = at::kFloat) {
  return FingerprintBuilder(Op::Send).meta(dtype, {n}, CPU).peer(dst, tag).finish();
}

Fingerprint recv(int src, int64_t n, int tag, c10::ScalarType dtype = at::kFloat) {
  return FingerprintBuilder(Op::Recv).meta(dtype, {n}, CPU).peer(src, tag).finish();
}

// `fp` as the pipeline describes it at `seq` (collectives) or `ordinal` (p2p).
Operation operation(const Fingerprint& fp, uint64_t seq, uint64_t ordinal) {
  Operation op;
  op.op = fp.op;
  op.seq = seq;
  op.ordinal = ordinal;
  op.kept = fp;
  return op;
}

// Runs the strict check of `fps[r]` at `seq` on every rank.
std::vector<World::Result> check(World& w, const std::vector<Fingerprint>& fps, uint64_t seq) {
  return w.run([&](int r) {
    Operation op = operation(fps[r], seq, 0);
    w.checks[r]->beforeInner(op);
  });
}

std::string text(const std::vector<World::Result>& results) {
  std::string out;
  for (size_t r = 0; r < results.size(); ++r) {
    out += "\nrank " + std::to_string(r) + (results[r].threw ? " threw: " : " returned") + results[r].text;
  }
  return out;
}

}  // namespace

TEST(CollectiveChecks, EqualFingerprintsPassOnEveryRankWithOneAllReduceSumAtTwoRanks) {
  World w(2, /*strict=*/true);
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    const auto results = check(w, {allReduce(8), allReduce(8)}, seq);
    for (const auto& r : results) EXPECT_FALSE(r.threw) << text(results);
  }
  // Two ranks: one element summed (v0 + v1 == 2 v), one helper op per check.
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(w.rv->calls(r), (std::vector<std::string>(3, "allreduce SUM x1")));
    EXPECT_FALSE(w.states[r]->failed());
  }
  EXPECT_TRUE(w.guardKeys().empty());  // the fast path does not touch the store
}

TEST(CollectiveChecks, EqualFingerprintsPassOnEveryRankWithOneAllReduceMaxAtThreeRanks) {
  World w(3, /*strict=*/true);
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    const auto results = check(w, {allReduce(8), allReduce(8), allReduce(8)}, seq);
    for (const auto& r : results) EXPECT_FALSE(r.threw) << text(results);
  }
  // Three ranks: [v, ~v] under MAX gives max(v) and min(v) in one op.
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(w.rv->calls(r), (std::vector<std::string>(3, "allreduce MAX x2")));
    EXPECT_FALSE(w.states[r]->failed());
  }
}

TEST(CollectiveChecks, AFingerprintDifferingOnOneRankFailsEveryRankWithTheSameReport) {
  for (int size : {2, 3}) {
    SCOPED_TRACE(std::to_string(size) + " ranks");
    World w(size, /*strict=*/true);
    std::vector<Fingerprint> fps;
    for (int r = 0; r < size; ++r) fps.push_back(allReduce(r == 1 ? 10 : 8));
    const auto results = check(w, fps, 4);
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(results[r].mismatch) << text(results);
      const std::string& t = results[r].text;
      EXPECT_EQ(t, results[0].text);  // one report, raised everywhere
      EXPECT_NE(
          t.find("collective #4 on group \"default_pg\" (" + std::to_string(size) + " ranks) differs across ranks"),
          std::string::npos)
          << t;
      EXPECT_NE(t.find("all_reduce(float32[8], SUM)"), std::string::npos) << t;
      EXPECT_NE(t.find("all_reduce(float32[10], SUM)"), std::string::npos) << t;
      EXPECT_NE(t.find("rank 11:"), std::string::npos) << t;  // global ranks
      ASSERT_TRUE(w.states[r]->failure().has_value());
      EXPECT_EQ(w.states[r]->failure()->kind, GuardErrorKind::Mismatch);
    }
    // The fingerprints went through the store, and their readers removed them.
    EXPECT_TRUE(w.guardKeys().empty());
  }
}

TEST(CollectiveChecks, AllToAllSplitsThatDoNotPairFailEveryRank) {
  for (int size : {2, 3}) {
    SCOPED_TRACE(std::to_string(size) + " ranks");
    // send[r][j]: what rank r sends to rank j; it pairs when recv[j][r] == send[r][j].
    std::vector<std::vector<int64_t>> sendTo(size, std::vector<int64_t>(size));
    for (int r = 0; r < size; ++r) {
      for (int j = 0; j < size; ++j) sendTo[r][j] = 1 + r * size + j;
    }
    auto recvFrom = [&](int me) {
      std::vector<int64_t> v(size);
      for (int j = 0; j < size; ++j) v[j] = sendTo[j][me];
      return v;
    };
    {
      SCOPED_TRACE("splits that pair");
      World w(size, /*strict=*/true);
      std::vector<Fingerprint> fps;
      for (int r = 0; r < size; ++r) fps.push_back(allToAll(r, sendTo[r], recvFrom(r)));
      const auto results = check(w, fps, 1);
      for (const auto& r : results) EXPECT_FALSE(r.threw) << text(results);
    }
    {
      SCOPED_TRACE("rank 1 expects 5 more elements from rank 0 than rank 0 sends");
      World w(size, /*strict=*/true);
      std::vector<Fingerprint> fps;
      for (int r = 0; r < size; ++r) {
        auto in = recvFrom(r);
        if (r == 1) in[0] += 5;
        fps.push_back(allToAll(r, sendTo[r], in));
      }
      ASSERT_EQ(fps[0].hash, fps[1].hash);  // equal shapes: only the pairing can tell
      const auto results = check(w, fps, 1);
      for (int r = 0; r < size; ++r) {
        ASSERT_TRUE(results[r].mismatch) << text(results);
        EXPECT_NE(results[r].text.find(messages::kSplitsDoNotPair), std::string::npos) << results[r].text;
        EXPECT_EQ(results[r].text, results[0].text);
      }
      // The pairing sums needed a second helper op after the fingerprint check.
      EXPECT_EQ(w.rv->calls(0).size(), 2u);
    }
  }
}

TEST(CollectiveChecks, StrictSendAndRecvPairThroughTheStore) {
  World w(2, /*strict=*/true);
  const std::vector<Fingerprint> fps{send(1, 4, 3), recv(0, 4, 3)};
  for (uint64_t ordinal = 1; ordinal <= 2; ++ordinal) {
    // A receive issued before its sender published is deferred, not held.
    Operation early = operation(fps[1], 0, ordinal);
    ASSERT_TRUE(w.states[1]->mode().keepsFingerprint(early));
    w.checks[1]->beforeInner(early);
    EXPECT_EQ(early.route, Route::Deferred);
    // Once the send published its print, the receive pairs at issue.
    Operation sent = operation(fps[0], 0, ordinal);
    ASSERT_TRUE(w.states[0]->mode().keepsFingerprint(sent));
    w.checks[0]->beforeInner(sent);
    EXPECT_EQ(sent.route, Route::Inner);
    Operation received = operation(fps[1], 0, ordinal);
    w.checks[1]->beforeInner(received);
    EXPECT_EQ(received.route, Route::Inner);
  }
  EXPECT_TRUE(w.guardKeys().empty());   // the receiver deleted the sender's prints
  EXPECT_TRUE(w.rv->calls(0).empty());  // p2p checks use the store, not the helper
  EXPECT_FALSE(w.states[1]->failed());
}

TEST(CollectiveChecks, AStrictRecvThatDoesNotPairFailsTheReceiver) {
  struct Case {
    std::string name;
    Fingerprint recv;
    std::string theirs;
  };
  const std::vector<Case> cases = {
      {"another size", recv(0, 5, 3), "recv(float32[5], src=0, tag=3)"},
      {"another dtype", recv(0, 4, 3, at::kDouble), "recv(float64[4], src=0, tag=3)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    World w(2, /*strict=*/true);
    const std::vector<Fingerprint> fps{send(1, 4, 3), c.recv};
    // The sender publishes its print and goes on; the receiver raises.
    Operation sent = operation(fps[0], 0, 1);
    w.checks[0]->beforeInner(sent);
    std::string t;
    try {
      Operation received = operation(fps[1], 0, 1);
      w.checks[1]->beforeInner(received);
      ADD_FAILURE() << "the receive that does not pair was let through";
    } catch (const CollectiveMismatchError& e) {
      t = e.what_without_backtrace();
    }
    EXPECT_NE(t.find("send/recv on group \"default_pg\" do not pair"), std::string::npos) << t;
    EXPECT_NE(t.find("rank 10: send(float32[4], dst=1, tag=3) (#1)"), std::string::npos) << t;
    EXPECT_NE(t.find("but rank 11 has " + c.theirs + " (#1)"), std::string::npos) << t;
    EXPECT_EQ(w.states[1]->failure()->kind, GuardErrorKind::Mismatch);
    EXPECT_TRUE(w.guardKeys().empty());
  }
}

TEST(CollectiveChecks, TheAsyncAllToAllAuditGathersThePairingSumsNextToTheOp) {
  World w(3, /*strict=*/false);
  const auto results = w.run([&](int r) {
    Operation op;
    op.op = Op::AllToAll;
    op.splitSend = 100 + r;
    op.splitRecv = 200 + r;
    w.checks[r]->beforeInner(op);  // nothing before the op
    w.checks[r]->afterInner(op, /*issued=*/true);
  });
  for (const auto& r : results) EXPECT_FALSE(r.threw) << text(results);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(w.rv->calls(r), (std::vector<std::string>{"allgather x2"}));
}

TEST(Modes, WhatEachModeAnswers) {
  // mode: compares, resultsWaitForTheCheck, comparesInStatusRing (before any collective), holds results
  struct Row {
    CheckMode mode;
    bool answers[4];
  };
  const Row rows[] = {
      {CheckMode::Off, {false, false, false, false}},
      {CheckMode::Async, {true, false, true, false}},
      {CheckMode::Verify, {true, true, false, true}},
      {CheckMode::Strict, {true, true, false, false}},
  };
  auto helper = c10::make_intrusive<MemHelper>(0, 2, std::make_shared<Rendezvous>(2));
  for (const auto& row : rows) {
    SCOPED_TRACE(checkModeName(row.mode));
    for (CallPathMode paths : {CallPathMode::Auto, CallPathMode::On, CallPathMode::Off}) {
      Config cfg;
      cfg.check = row.mode;
      cfg.callPaths = paths;
      auto state =
          std::make_shared<GroupState>(GroupIdentity{"0", 0, 2, {}}, cfg, testkit::groupStore(), milliseconds(60000));
      installMode(state, helper);
      const Mode& m = state->mode();
      const bool got[4] = {m.compares(), m.resultsWaitForTheCheck(), m.comparesInStatusRing(),
                           state->gate() != nullptr};
      for (int i = 0; i < 4; ++i) EXPECT_EQ(got[i], row.answers[i]) << "answer " << i;
      // Call paths: compared in strict by default, in any comparing mode when on, never when off.
      const bool paths_ = paths == CallPathMode::On ? row.mode != CheckMode::Off
                                                    : paths == CallPathMode::Auto && row.mode == CheckMode::Strict;
      EXPECT_EQ(m.comparesCallPaths(), paths_) << enumName(paths);
      state->mode().shutdown(milliseconds(0));
    }
  }
}

TEST(Modes, WhatEachModeKeepsOfAnOperation) {
  // Strict keeps every fingerprint but a receive from any source (no peer to
  // pair with); verify a send's and a receive's on CPU transports (their
  // pairing words); async and off none.
  auto helper = c10::make_intrusive<MemHelper>(0, 2, std::make_shared<Rendezvous>(2));
  for (CheckMode mode : {CheckMode::Off, CheckMode::Async, CheckMode::Verify, CheckMode::Strict}) {
    Config cfg;
    cfg.check = mode;
    auto state =
        std::make_shared<GroupState>(GroupIdentity{"0", 0, 2, {}}, cfg, testkit::groupStore(), milliseconds(60000));
    installMode(state, helper);
    for (size_t i = 0; i < static_cast<size_t>(Op::NumOps); ++i) {
      for (bool streamOrdered : {false, true}) {
        Operation op;
        op.op = static_cast<Op>(i);
        op.streamOrdered = streamOrdered;
        SCOPED_TRACE(std::string(checkModeName(mode)) + " " + opName(op.op) + (streamOrdered ? " stream" : ""));
        const bool p2p = op.op == Op::Send || op.op == Op::Recv;
        const bool want = mode == CheckMode::Strict   ? op.op != Op::RecvAnySource
                          : mode == CheckMode::Verify ? p2p && !streamOrdered
                                                      : false;
        EXPECT_EQ(state->mode().keepsFingerprint(op), want);
      }
    }
    state->mode().shutdown(milliseconds(0));
  }
}

TEST(Modes, StrictWithoutAHelperIsRefusedAndALoneVerifyingRankHoldsNothing) {
  Config strict;
  strict.check = CheckMode::Strict;
  auto state =
      std::make_shared<GroupState>(GroupIdentity{"0", 0, 2, {}}, strict, testkit::groupStore(), milliseconds(60000));
  EXPECT_THROW(installMode(state, nullptr), c10::Error);
  Config verify;
  verify.check = CheckMode::Verify;
  auto alone =
      std::make_shared<GroupState>(GroupIdentity{"0", 0, 1, {}}, verify, testkit::groupStore(), milliseconds(60000));
  installMode(alone, c10::make_intrusive<MemHelper>(0, 1, std::make_shared<Rendezvous>(1)));
  EXPECT_EQ(alone->gate(), nullptr);
  EXPECT_TRUE(alone->mode().resultsWaitForTheCheck());
  EXPECT_TRUE(alone->mode().counters().empty());
}

}  // namespace test_collective_checks
