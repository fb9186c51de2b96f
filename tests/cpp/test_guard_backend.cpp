// GuardBackend, GuardWork and the Watchdog together, in one process: a guard
// over a hand-driven inner backend (its works complete when the test says so)
// and a fault-injecting store. World size 1, so the watchdog's whole path runs
// (status, deadlines, incidents, store health) without other processes.
#include "guard/backend/GuardBackend.h"

#include "guard/Errors.h"
#include "guard/collective/StreamOrdered.h"
#include "guard/watchdog/Watchdog.h"
#include "testkit.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <thread>

using namespace torch_ext;
using std::chrono::milliseconds;

namespace test_guard_backend {

namespace {

// An inner work completed by the test.
class ManualWork : public testkit::FutureWork {
 public:
  ManualWork() : FutureWork(c10d::OpType::ALLREDUCE) {}
  void finish() {
    future_->markCompleted(c10::IValue(std::vector<at::Tensor>{}));
  }
};

// An inner backend whose collectives complete only when the test finishes them.
class ManualBackend : public c10d::Backend {
 public:
  ManualBackend() : c10d::Backend(0, 1) {}
  const std::string getBackendName() const override {
    return "manual";
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>&, const c10d::AllreduceOptions&) override {
    auto w = c10::make_intrusive<ManualWork>();
    std::lock_guard<std::mutex> lock(mu);
    works.push_back(w);
    return w;
  }
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    auto w = c10::make_intrusive<ManualWork>();
    w->finish();
    return w;
  }
  void finishAll() {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& w : works) w->finish();
  }
  std::mutex mu;
  std::vector<c10::intrusive_ptr<ManualWork>> works;
};

struct Guarded {
  explicit Guarded(Config cfg = fast()) {
    faulty = c10::make_intrusive<testkit::FaultyStore>();
    inner = c10::make_intrusive<ManualBackend>();
    StoreAddress address{"TCPStore", "10.1.2.3", 29500, "rank 0's process (plain env:// rendezvous)", 0};
    backend = c10::make_intrusive<GuardBackend>(
        faulty, address, 0, 1, milliseconds(60000), "0", std::vector<int64_t>{0}, std::move(cfg),
        std::map<std::string, InnerBackend>{{"cpu", {"manual", inner}}}, nullptr);
  }
  ~Guarded() {
    faulty->release();
  }
  static Config fast() {
    Config cfg;
    cfg.check = CheckMode::Off;  // no helper backend at world 1
    cfg.intervalS = 0.05;
    cfg.storeTimeoutS = 0.5;
    return cfg;
  }
  c10::intrusive_ptr<c10d::Work> allReduce() {
    std::vector<at::Tensor> ts{at::ones({4})};
    return backend->allreduce(ts, c10d::AllreduceOptions());
  }
  c10::intrusive_ptr<testkit::FaultyStore> faulty;
  c10::intrusive_ptr<ManualBackend> inner;
  c10::intrusive_ptr<GuardBackend> backend;
};

template <typename E>
std::string waitThrows(const c10::intrusive_ptr<c10d::Work>& w, double* took) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    w->wait();
  } catch (const E& e) {
    *took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong error type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "wait() did not throw";
  return "";
}

}  // namespace

// Which inner backends complete on a stream (the device path): NCCL under each
// of its names (torch 2.15 calls its default NCCL "nccl2"), never gloo.
TEST(StreamOrdered, NcclUnderEveryNameIsStreamOrderedGlooIsNot) {
  for (const char* name : {"nccl", "nccl2", "nccl-lazy", "xccl"}) EXPECT_TRUE(isStreamOrderedName(name)) << name;
  for (const char* name : {"gloo", "mpi", "ucc", "fake", "nccl_sim", "NCCL"})
    EXPECT_FALSE(isStreamOrderedName(name)) << name;
}

TEST(GuardBackend, ACollectiveCompletesThroughTheGuardAndIsLedgered) {
  Guarded g;
  auto w = g.allReduce();
  EXPECT_FALSE(w->isCompleted());
  auto p = g.backend->state()->ledger().progress();
  EXPECT_TRUE(p.hasPending);
  EXPECT_EQ(p.lastSeq, 1u);
  g.inner->finishAll();
  EXPECT_TRUE(w->wait());
  EXPECT_TRUE(w->isCompleted());
  EXPECT_FALSE(g.backend->state()->ledger().progress().hasPending);
  EXPECT_EQ(g.backend->getBackendName(), "guard");
  // The watchdog publishes this rank's status through the guard's own channel.
  const auto t0 = std::chrono::steady_clock::now();
  while (!g.faulty->check({"guard/st/0"}) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  auto raw = g.faulty->get("guard/st/0");
  auto status = StatusRecord::decode(std::string(raw.begin(), raw.end()));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->phase, RankPhase::Running);
}

TEST(GuardBackend, ALostStoreFailsThePendingWaitWithStoreLostError) {
  Guarded g;
  auto w = g.allReduce();
  g.faulty->setMode(testkit::FaultyStore::Mode::Fail);  // the store's process died
  double took = 0;
  const std::string msg = waitThrows<StoreLostError>(w, &took);
  EXPECT_LT(took, 3.0);
  EXPECT_EQ(msg.substr(0, msg.find(';')),
            "the store at 10.1.2.3:29500 (hosted by rank 0's process (plain env:// rendezvous)) is gone: connection "
            "reset during set")
      << msg;
  EXPECT_NE(msg.find("\n  pending here: collective #1 all_reduce(float32[4], SUM)"), std::string::npos) << msg;
  // Following operations fail at once with the same error; nothing touches the store again.
  const uint64_t calls = g.faulty->calls();
  try {
    g.allReduce();
    ADD_FAILURE() << "a collective on a group whose store is lost must raise";
  } catch (const StoreLostError& e) {
    EXPECT_NE(std::string(e.what()).find("failed earlier and stays failed"), std::string::npos);
  }
  EXPECT_EQ(g.faulty->calls(), calls);
}

TEST(GuardBackend, AFrozenStoreFailsThePendingWaitWithinTheStoreTimeout) {
  Guarded g;
  auto w = g.allReduce();
  g.faulty->setMode(testkit::FaultyStore::Mode::Block);  // the store's host froze
  double took = 0;
  const std::string msg = waitThrows<StoreLostError>(w, &took);
  EXPECT_LT(took, 3.0);  // store_timeout 0.5 s plus a tick or two
  EXPECT_NE(msg.find("the store at 10.1.2.3:29500 (hosted by rank 0's process (plain env:// rendezvous)) does not "
                     "answer: no reply to"),
            std::string::npos)
      << msg;
}

TEST(GuardBackend, AbortAfterTurnsAHangIntoATimeoutError) {
  Config cfg = Guarded::fast();
  cfg.abortAfterS = 0.3;
  Guarded g(cfg);
  auto w = g.allReduce();
  double took = 0;
  const std::string msg = waitThrows<CollectiveTimeoutError>(w, &took);
  EXPECT_LT(took, 5.0);
  EXPECT_NE(msg.find("timeout after abort_after=0.3 s"), std::string::npos) << msg;
}

TEST(GuardBackend, AbortAfterFiresWithAFrozenStoreToo) {
  // The deadline is checked before any store I/O; the frozen store is found
  // and named first, but nothing waits on it.
  Config cfg = Guarded::fast();
  cfg.abortAfterS = 0.2;
  cfg.storeTimeoutS = 30;  // a store that would be given a long time
  Guarded g(cfg);
  auto w = g.allReduce();
  g.faulty->setMode(testkit::FaultyStore::Mode::Block);
  double took = 0;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    w->wait();
    ADD_FAILURE() << "wait() did not throw";
  } catch (const GuardError& e) {
    took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(e.kind(), GuardErrorKind::Timeout) << e.what_without_backtrace();
    EXPECT_NE(std::string(e.what_without_backtrace()).find("no cross-rank report"), std::string::npos)
        << e.what_without_backtrace();
  }
  EXPECT_LT(took, 10.0);  // abort_after + the local fallback (5 s), not the 30 s store timeout
}

TEST(GuardBackend, ExitPathsNeverWaitOnAFrozenStore) {
  auto t0 = std::chrono::steady_clock::now();
  {
    Guarded g;
    g.allReduce();
    g.faulty->setMode(testkit::FaultyStore::Mode::Block);
    std::this_thread::sleep_for(milliseconds(100));  // let the watchdog get stuck in a call
    g.backend->shutdown();                           // destroy_process_group()
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
}

}  // namespace test_guard_backend
