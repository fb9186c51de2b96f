// CallSites: interned call sites and their text. GroupState: first-wins group
// failure with the abort hook, typed errors, and waitUntil.
#include "guard/collective/CallSite.h"
#include "guard/Errors.h"
#include "guard/collective/GroupState.h"
#include "guard/Runtime.h"

#include "store_testing.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace torch_ext;
using std::chrono::milliseconds;

namespace test_callsite_groupstate {

namespace {

std::shared_ptr<GroupState> makeGroup(GroupIdentity id = GroupIdentity{"3", 1, 2, {4, 6}}, Config cfg = Config()) {
  return std::make_shared<GroupState>(std::move(id), std::move(cfg), testkit::groupStore(), milliseconds(30000));
}

// The message of the GuardError that `f` throws, checking its dynamic type.
template <typename E, typename F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "nothing thrown";
  return "";
}

uint32_t nextProviderId = 0;
uint32_t provider() {
  return nextProviderId;
}

}  // namespace

TEST(CallSites, InterningTextsAndProvider) {
  auto& cs = CallSites::instance();
  const std::vector<Frame> frames = {Frame{"/home/u/proj/train.py", 120, "training_step"},
                                     Frame{"/home/u/proj/main.py", 7, "<module>"}};
  const uint32_t id = cs.intern(frames);
  EXPECT_GE(id, 1u);
  EXPECT_EQ(cs.intern(frames), id);
  EXPECT_EQ(cs.intern(std::vector<Frame>(frames)), id);
  // Any field of any frame makes another site.
  auto other = frames;
  other[1].line = 8;
  const uint32_t id2 = cs.intern(other);
  EXPECT_NE(id2, id);
  other = frames;
  other[0].function = "validation_step";
  EXPECT_NE(cs.intern(other), id);
  EXPECT_NE(cs.intern({frames[0]}), id);
  EXPECT_EQ(cs.intern({}), 0u);

  const auto back = cs.frames(id);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].filename, "/home/u/proj/train.py");
  EXPECT_EQ(back[0].line, 120);
  EXPECT_EQ(back[0].function, "training_step");
  EXPECT_EQ(back[1].function, "<module>");
  EXPECT_EQ(cs.frames(id2)[1].line, 8);
  EXPECT_TRUE(cs.frames(0).empty());
  EXPECT_TRUE(cs.frames(0xfffffff0u).empty());

  // describe(): the innermost frame, basename of the file.
  EXPECT_EQ(cs.describe(id), "train.py:120 in training_step");
  EXPECT_EQ(cs.describe(0), "(unknown call site)");
  EXPECT_EQ(cs.describe(0xfffffff0u), "(unknown call site)");
  {
    SCOPED_TRACE("FrameTexts");
    EXPECT_EQ((Frame{"/a/b/c.py", 3, "f"}).describe(), "c.py:3 in f");
    EXPECT_EQ((Frame{"c.py", 3, "f"}).describe(), "c.py:3 in f");
    EXPECT_EQ((Frame{"/a/b/c.py", 3, ""}).describe(), "c.py:3");
    const std::vector<Frame> fs = {Frame{"/x/a.py", 1, "f"}, Frame{"/x/b.py", 2, "g"}, Frame{"/x/c.py", 3, "h"},
                                   Frame{"/x/d.py", 4, "i"}};
    EXPECT_EQ(describeFrames(fs), "a.py:1 in f <- b.py:2 in g <- c.py:3 in h");
    EXPECT_EQ(describeFrames(fs, 1), "a.py:1 in f");
    EXPECT_EQ(describeFrames(fs, 10), "a.py:1 in f <- b.py:2 in g <- c.py:3 in h <- d.py:4 in i");
    EXPECT_EQ(describeFrames({}), "(unknown call site)");
  }
  {
    SCOPED_TRACE("UserFrameThenTheFrameworkFrameItWentThrough");
    const Frame user{"/home/u/proj/train.py", 15, "Model.validation_step"};
    const Frame via{"/venv/lib/python3.11/site-packages/lightning/pytorch/utilities/distributed.py", 213, "_sync_ddp",
                    "lightning"};
    EXPECT_EQ(via.describe(), "lightning .../distributed.py:213 in _sync_ddp");
    EXPECT_EQ(describeCallSite({user, via}),
              "train.py:15 in Model.validation_step (via lightning .../distributed.py:213 in _sync_ddp)");
    EXPECT_EQ(describeCallSite({user}), "train.py:15 in Model.validation_step");
    // No user frame: the framework frame stands alone, named as such.
    EXPECT_EQ(describeCallSite({via}), "lightning .../distributed.py:213 in _sync_ddp");
    EXPECT_EQ(describeCallSite({}), "(unknown call site)");
    // The library is part of what makes a call site distinct.
    auto& sites = CallSites::instance();
    const uint32_t a = sites.intern({user, via});
    EXPECT_NE(a, sites.intern({user}));
    EXPECT_EQ(sites.describe(a), describeCallSite({user, via}));
    EXPECT_EQ(sites.frames(a)[1].library, "lightning");
  }
  {
    SCOPED_TRACE("StacksShowUserFramesAndFoldFrameworkFrames");
    auto lib = [](const char* name, int line) {
      return Frame{std::string("/site-packages/lightning/x/") + name + ".py", line, name, "lightning"};
    };
    auto torchFrame = Frame{"/site-packages/torch/distributed/distributed_c10d.py", 9, "barrier", "torch"};
    std::vector<Frame> st = {torchFrame, lib("a", 1), lib("b", 2), Frame{"/p/train.py", 15, "validation_step"}};
    for (int i = 0; i < 6; ++i) st.push_back(lib("loop", 100 + i));
    st.push_back(Frame{"/p/train.py", 40, "main"});
    st.push_back(Frame{"/p/train.py", 44, "<module>"});
    EXPECT_EQ(
        describeStack(st),
        "torch .../distributed_c10d.py:9 in barrier <- ... 2 lightning frames ... <- train.py:15 in validation_step"
        " <- ... 6 lightning frames ... <- train.py:40 in main <- train.py:44 in <module>");
    // A single library frame between user frames is shown, not folded.
    EXPECT_EQ(describeStack({Frame{"/p/a.py", 1, "f"}, lib("one", 2), Frame{"/p/b.py", 3, "g"}}),
              "a.py:1 in f <- lightning .../one.py:2 in one <- b.py:3 in g");
    // Mixed libraries in one run are named in order of appearance.
    EXPECT_EQ(describeStack({Frame{"/p/a.py", 1, "f"}, torchFrame, lib("c", 3), torchFrame}),
              "a.py:1 in f <- ... 3 torch, lightning frames ...");
    // At most maxUser user frames; the rest are counted.
    EXPECT_EQ(describeStack({Frame{"/p/a.py", 1, "f"}, Frame{"/p/a.py", 2, "g"}, Frame{"/p/a.py", 3, "h"}}, 2),
              "a.py:1 in f <- a.py:2 in g <- ... 1 outer frame");
    EXPECT_EQ(describeStack({}), "(no Python frames)");
  }
  {
    SCOPED_TRACE("CaptureUsesTheInstalledProvider");
    auto& cs = CallSites::instance();
    EXPECT_EQ(cs.capture(), 0u);  // no provider in C++ tests
    nextProviderId = cs.intern({Frame{"/p/q.py", 5, "r"}});
    cs.setProvider(&provider);
    EXPECT_EQ(cs.capture(), nextProviderId);
    cs.setProvider(nullptr);
    EXPECT_EQ(cs.capture(), 0u);
  }
}

TEST(GroupState, IdentityLabelAndDeadlines) {
  Config cfg;
  cfg.ledgerSize = 32;
  cfg.warnAfterS = 1.5;
  auto st = makeGroup(GroupIdentity{"3", 1, 2, {4, 6}}, cfg);
  EXPECT_EQ(st->id().globalRank(1), 6);
  EXPECT_EQ(st->id().globalRank(0), 4);
  EXPECT_EQ(st->id().globalRank(5), 5);
  EXPECT_EQ(GroupIdentity{}.globalRank(3), 3);  // empty list: identity
  EXPECT_EQ(st->ledger().capacity(), 32u);
  EXPECT_EQ(st->timeout().count(), 30000);
  EXPECT_EQ(st->warnAfter().count(), 1500);
  EXPECT_EQ(st->abortAfter().count(), 30000);  // the group's timeout when unset
  cfg.abortAfterS = 2.5;
  EXPECT_EQ(makeGroup(GroupIdentity{}, cfg)->abortAfter().count(), 2500);
  ASSERT_TRUE(st->store().set("k", "12"));
  EXPECT_EQ(st->store().get("k").value(), "12");
  EXPECT_EQ(st->store().health(), StoreHealth::Healthy);

  EXPECT_EQ(st->label(), "3");
  st->setDesc("default_pg");
  EXPECT_EQ(st->label(), "default_pg");
  st->setDesc("undefined");
  EXPECT_EQ(st->label(), "3");
}

namespace {

// The warnings the core logs while it lives (Runtime's log sink, uninstalled at the end).
struct Warnings {
  std::vector<std::string> logged;
  Warnings() {
    Runtime::instance().install(
        nullptr,
        [this](LogLevel level, const std::string& msg) {
          if (level >= LogLevel::Warning) logged.push_back(msg);
        },
        nullptr);
  }
  ~Warnings() {
    Runtime::instance().uninstall();
  }
};

}  // namespace

TEST(GroupState, FailIsFirstWinsAndRunsTheAbortHookOnce) {
  auto st = makeGroup();
  int hookRuns = 0;
  bool failedInHook = false;
  st->setAbortHook([&] {
    ++hookRuns;
    failedInHook = st->failed();
  });
  EXPECT_FALSE(st->failed());
  EXPECT_FALSE(st->failure().has_value());
  EXPECT_TRUE(st->fail(GuardErrorKind::Mismatch, "collective #3 differs"));
  EXPECT_FALSE(st->fail(GuardErrorKind::Timeout, "later"));
  EXPECT_FALSE(st->fail(GuardErrorKind::Failure, "even later"));
  EXPECT_EQ(hookRuns, 1);
  EXPECT_TRUE(failedInHook);  // the hook sees the group failed
  EXPECT_TRUE(st->failed());
  auto f = st->failure();
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->kind, GuardErrorKind::Mismatch);
  EXPECT_EQ(f->report, "collective #3 differs");
}

TEST(GroupState, AFailureKeepsItsFactsAndItsErrorsFindThem) {
  auto st = makeGroup();
  st->setDesc("tp");
  Verdict facts;
  facts.kind = Verdict::Kind::Mismatch;
  facts.seq = 3;
  facts.shown.push_back(OpFacts{"all_reduce(float32[4], SUM)", "all_reduce", "float32", {4}, 1, "SUM"});
  const std::string report = "collective #3 on group \"tp\" differs (facts test " + std::to_string(getpid()) + ")";
  ASSERT_TRUE(st->fail(GuardErrorKind::Mismatch, report, facts));
  // The raised text, the same with a later operation's note, or nothing else.
  const std::string later = thrown<CollectiveMismatchError>([&] { st->throwFailure("barrier"); });
  for (const std::string& message : {report, later}) {
    auto f = GroupState::failureOf(message);
    ASSERT_NE(f, nullptr) << message;
    EXPECT_EQ(f->kind, GuardErrorKind::Mismatch);
    EXPECT_EQ(f->facts->text, report);  // the finder's facts, with the group and text filled in
    EXPECT_EQ(f->facts->group, "tp");
    EXPECT_EQ(f->facts->seq, 3u);
    EXPECT_EQ(f->facts->shown, facts.shown);
  }
  EXPECT_EQ(GroupState::failureOf(report + "x"), nullptr);
  EXPECT_EQ(GroupState::failureOf(report.substr(1)), nullptr);
  // Without facts: the failure's kind, group and text alone.
  auto bare = makeGroup();
  const std::string lost = "the store is gone (facts test " + std::to_string(getpid()) + ")";
  bare->fail(GuardErrorKind::StoreLost, lost);
  auto f = GroupState::failureOf(lost);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->facts->kind, Verdict::Kind::Failure);
  EXPECT_EQ(f->facts->group, "3");
  EXPECT_TRUE(f->facts->shown.empty() && f->facts->ops.empty());
  // Only the last 64 are kept.
  for (int i = 0; i < 64; ++i) makeGroup()->fail(GuardErrorKind::Failure, "filler " + std::to_string(i));
  EXPECT_EQ(GroupState::failureOf(lost), nullptr);
}

TEST(GroupState, AFailingAbortHookIsLoggedNotThrown) {
  Warnings warnings;
  const std::vector<std::string>& logged = warnings.logged;
  auto st = makeGroup();
  st->setAbortHook([] { throw std::runtime_error("gloo abort unsupported"); });
  bool first = false;
  EXPECT_NO_THROW(first = st->fail(GuardErrorKind::Failure, "peer died"));
  EXPECT_TRUE(first);
  EXPECT_TRUE(st->failed());
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_EQ(logged[0], "aborting the inner backend failed: gloo abort unsupported");
}

// What GuardBackend's abort hooks (torch 2.15's registerAbortHook) run on.
TEST(GroupState, FailureHooksRunOnceBeforeTheAbortHookAndAThrowingOneDoesNotStopTheOthers) {
  Warnings warnings;
  const std::vector<std::string>& logged = warnings.logged;
  auto st = makeGroup();
  st->setDesc("dp");
  std::vector<std::string> order;
  st->setAbortHook([&] { order.push_back("abort"); });
  st->addFailureHook(7, [&] { order.push_back("replaced"); });
  st->addFailureHook(7, [&] {
    order.push_back("7");
    EXPECT_TRUE(st->failed());  // a hook sees the failure it reports
  });
  st->addFailureHook(3, [&] {
    order.push_back("3");
    throw std::runtime_error("dump failed");
  });
  st->addFailureHook(9, [&] { order.push_back("removed"); });
  st->removeFailureHook(9);
  st->removeFailureHook(42);  // never added: nothing
  EXPECT_TRUE(st->fail(GuardErrorKind::Timeout, "collective #5 timed out"));
  EXPECT_FALSE(st->fail(GuardErrorKind::Failure, "later"));
  EXPECT_EQ(order, (std::vector<std::string>{"3", "7", "abort"}));
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_EQ(logged[0], "abort hook 3 of group \"dp\" raised: dump failed (the group's other hooks still ran)");
}

TEST(GroupState, ThrowFailureThrowsTheKindsSubclass) {
  auto mismatch = makeGroup();
  mismatch->setDesc("tp");
  mismatch->fail(GuardErrorKind::Mismatch, "REPORT");
  EXPECT_EQ(thrown<CollectiveMismatchError>([&] { mismatch->throwFailure(""); }), "REPORT");
  EXPECT_EQ(thrown<CollectiveMismatchError>([&] { mismatch->throwFailure("all_reduce #4"); }),
            "REPORT\n(raised by all_reduce #4 on rank 6: group \"tp\" failed earlier and stays failed; destroy and "
            "re-create it to go on)");

  auto timeout = makeGroup(GroupIdentity{"0", 2, 4, {}});
  timeout->fail(GuardErrorKind::Timeout, "T");
  EXPECT_EQ(thrown<CollectiveTimeoutError>([&] { timeout->throwFailure(""); }), "T");
  EXPECT_EQ(thrown<CollectiveTimeoutError>([&] { timeout->throwFailure("barrier"); }),
            "T\n(raised by barrier on rank 2: group \"0\" failed earlier and stays failed; destroy and re-create it to "
            "go on)");

  auto failure = makeGroup();
  failure->fail(GuardErrorKind::Failure, "F");
  EXPECT_EQ(thrown<CollectiveFailureError>([&] { failure->throwFailure(""); }), "F");
  // All are DistBackendErrors carrying their kind.
  try {
    failure->throwFailure("");
  } catch (const c10::DistBackendError& e) {
    auto* g = dynamic_cast<const GuardError*>(&e);
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->kind(), GuardErrorKind::Failure);
  }
  // Mismatch is not caught as a timeout.
  EXPECT_THROW(
      {
        try {
          mismatch->throwFailure("");
        } catch (const CollectiveTimeoutError&) {
        }
      },
      CollectiveMismatchError);

  EXPECT_THROW(makeGroup()->throwFailure("x"), std::logic_error);
  {
    SCOPED_TRACE("ThrowGuardErrorAndKindNames");
    EXPECT_EQ(thrown<CollectiveMismatchError>([] { throwGuardError(GuardErrorKind::Mismatch, "m"); }), "m");
    EXPECT_EQ(thrown<CollectiveTimeoutError>([] { throwGuardError(GuardErrorKind::Timeout, "t"); }), "t");
    EXPECT_EQ(thrown<CollectiveFailureError>([] { throwGuardError(GuardErrorKind::Failure, "f"); }), "f");
    EXPECT_STREQ(guardErrorKindName(GuardErrorKind::Mismatch), "mismatch");
    EXPECT_STREQ(guardErrorKindName(GuardErrorKind::Timeout), "timeout");
    EXPECT_STREQ(guardErrorKindName(GuardErrorKind::Failure), "failure");
  }
}

// The error surface (Errors.h): a group's failure leaves the core as itself
// (and counts as seen) without a surface; with one, as what the surface
// makes, seen only when the surface's translator says so.
struct SurfacedForTest : std::runtime_error {
  SurfacedForTest(GuardErrorKind k, SeenFlag s) : std::runtime_error("surfaced"), kind(k), seen(std::move(s)) {}
  GuardErrorKind kind;
  SeenFlag seen;
};

TEST(GroupState, FailuresLeaveThroughTheErrorSurfaceAndCountAsSeenOnce) {
  {
    SCOPED_TRACE("no surface: the C++ type, seen when it leaves");
    auto st = makeGroup();
    st->fail(GuardErrorKind::Mismatch, "differs");
    std::exception_ptr inside = st->failureError();
    EXPECT_FALSE(st->failureRaised());  // made inside the core: nobody saw it yet
    std::exception_ptr out = surfaced(inside);
    EXPECT_TRUE(st->failureRaised());
    EXPECT_EQ(thrown<CollectiveMismatchError>([&] { std::rethrow_exception(out); }), "differs");
    // Anything else passes unchanged.
    auto other = std::make_exception_ptr(std::logic_error("x"));
    EXPECT_EQ(surfaced(other), other);
    EXPECT_EQ(surfaced(nullptr), nullptr);
  }
  {
    SCOPED_TRACE("a surface: what it makes, carrying the group's flag");
    setErrorSurface(
        [](const GuardError& e) { return std::make_exception_ptr(SurfacedForTest(e.kind(), e.seenFlag())); });
    auto st = makeGroup();
    st->fail(GuardErrorKind::Timeout, "waited");
    try {
      surfacing([&]() -> int { st->throwFailure(""); });
      ADD_FAILURE() << "surfacing() returned";
    } catch (const SurfacedForTest& e) {
      EXPECT_EQ(e.kind, GuardErrorKind::Timeout);
      EXPECT_FALSE(st->failureRaised());  // the surface's translator has not run
      e.seen->store(true);
      EXPECT_TRUE(st->failureRaised());
    }
    EXPECT_EQ(surfacing([] { return 7; }), 7);
    setErrorSurface(nullptr);
  }
}

TEST(GroupState, WaitUntilReturnsOnPredicateFailureOrTimeout) {
  // The waits below have a 20 s deadline and must end long before it: a lost
  // wake-up shows as a wait that ran into the deadline (which, for the failure
  // case, still returns true), never as a hang.
  constexpr milliseconds kLong(20000);
  auto elapsed = [](std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
  };
  {
    SCOPED_TRACE("predicate");
    auto st = makeGroup();
    EXPECT_TRUE(st->waitUntil([] { return true; }, milliseconds(1)));
    std::atomic<bool> done{false};
    const auto t0 = std::chrono::steady_clock::now();
    std::thread t([&] {
      done.store(true);
      st->notify();
    });
    EXPECT_TRUE(st->waitUntil([&] { return done.load(); }, kLong));
    t.join();
    EXPECT_LT(elapsed(t0), kLong / 2) << "notify() did not wake the waiter";
    EXPECT_FALSE(st->failed());
  }
  {
    SCOPED_TRACE("failure");
    auto st = makeGroup();
    const auto t0 = std::chrono::steady_clock::now();
    std::thread t([&] { st->fail(GuardErrorKind::Timeout, "gave up"); });
    const bool r = st->waitUntil([] { return false; }, kLong);
    t.join();
    EXPECT_TRUE(r);
    EXPECT_LT(elapsed(t0), kLong / 2) << "fail() did not wake the waiter";
    EXPECT_TRUE(st->failed());
    // An already failed group does not wait at all.
    const auto t1 = std::chrono::steady_clock::now();
    EXPECT_TRUE(st->waitUntil([] { return false; }, kLong));
    EXPECT_LT(elapsed(t1), kLong / 2);
  }
  {
    SCOPED_TRACE("timeout");
    auto st = makeGroup();
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(st->waitUntil([] { return false; }, milliseconds(30)));
    EXPECT_GE(elapsed(t0), milliseconds(30));
    EXPECT_FALSE(st->failed());
  }
}

}  // namespace test_callsite_groupstate
