// WorkRetirement: a work (or future) the user's thread drops while the inner
// backend's worker still holds it is freed on the next issuing thread, never on
// the worker; one nobody else holds is freed at once.
#include "guard/collective/WorkRetirement.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

using namespace torch_ext;

namespace test_work_retirement {

namespace {

// Records the thread that destroyed it.
struct Tracked : c10::intrusive_ptr_target {
  explicit Tracked(std::atomic<std::thread::id>* where) : where_(where) {}
  ~Tracked() override {
    where_->store(std::this_thread::get_id());
  }
  std::atomic<std::thread::id>* where_;
};

}  // namespace

TEST(WorkRetirement, FreesAtOnceWhatNobodyElseHolds) {
  auto& r = WorkRetirement::instance();
  std::atomic<std::thread::id> where{};
  r.retire(c10::make_intrusive<Tracked>(&where));
  EXPECT_EQ(where.load(), std::this_thread::get_id());
}

TEST(WorkRetirement, WhatAWorkerStillHoldsIsFreedByTheNextSweepNotByTheWorker) {
  auto& r = WorkRetirement::instance();
  std::atomic<std::thread::id> where{};
  auto work = c10::make_intrusive<Tracked>(&where);
  auto workersRef = work;  // the inner backend's worker, still finishing the op
  r.retire(std::move(work));
  EXPECT_GE(r.kept(), 1u);
  std::thread worker([ref = std::move(workersRef)]() mutable { ref.reset(); });
  const auto workerId = worker.get_id();
  worker.join();
  EXPECT_EQ(where.load(), std::thread::id{}) << "the worker's release must not free it";
  r.sweepAll();
  EXPECT_EQ(where.load(), std::this_thread::get_id());
  EXPECT_NE(where.load(), workerId);
}

TEST(WorkRetirement, ASweepKeepsWhatIsStillHeld) {
  auto& r = WorkRetirement::instance();
  std::atomic<std::thread::id> a{}, b{};
  auto held = c10::make_intrusive<Tracked>(&a);
  auto heldElsewhere = held;
  auto released = c10::make_intrusive<Tracked>(&b);
  auto releasedElsewhere = released;
  r.retire(std::move(held));
  r.retire(std::move(released));
  releasedElsewhere.reset();
  r.sweepAll();
  EXPECT_EQ(b.load(), std::this_thread::get_id());
  EXPECT_EQ(a.load(), std::thread::id{});
  EXPECT_GE(r.kept(), 1u);
  heldElsewhere.reset();
  r.sweepAll();
  EXPECT_EQ(a.load(), std::this_thread::get_id());
}

TEST(WorkRetirement, WhatTheWorkerLetGoOfIsFreedByTheNextCollective) {
  // gloo's worker lets go of each work just after completing it; the user's
  // thread has dropped its own by then. The next collective's sweep frees them,
  // far below the count that starts a full scan.
  WorkRetirement r;  // its own: other tests' works, held elsewhere, would stand first in line
  constexpr int kWorks = 3;
  std::vector<std::atomic<std::thread::id>> where(kWorks);
  std::vector<c10::intrusive_ptr<Tracked>> workers;
  for (int i = 0; i < kWorks; ++i) {
    auto w = c10::make_intrusive<Tracked>(&where[i]);
    workers.push_back(w);
    r.retire(std::move(w));
  }
  std::atomic<std::thread::id> last{};
  auto heldByLedger = c10::make_intrusive<Tracked>(&last);  // the newest, still held elsewhere
  r.retire(heldByLedger);
  std::thread worker([held = std::move(workers)]() mutable { held.clear(); });
  worker.join();
  const size_t scans = r.scans();
  r.sweep();  // what the next collective does
  for (auto& w : where) EXPECT_EQ(w.load(), std::this_thread::get_id()) << "freed by the next issue, on its thread";
  EXPECT_EQ(last.load(), std::thread::id{}) << "one still held elsewhere stays kept";
  EXPECT_EQ(r.kept(), 1u);
  EXPECT_EQ(r.scans(), scans) << "no full scan for it";
  heldByLedger.reset();
  r.sweep();
  EXPECT_EQ(last.load(), std::this_thread::get_id());
  EXPECT_EQ(r.kept(), 0u);
}

TEST(WorkRetirement, WorksHeldElsewhereForLongAreNotScannedAtEveryCollective) {
  // NCCL and send/recv works stay held by the ledger until the watchdog's next
  // poll: thousands of them at NCCL's rate. sweep() runs once per collective, so
  // it must not scan them all each time.
  auto& r = WorkRetirement::instance();
  r.sweepAll();
  const size_t keptBefore = r.kept();  // other tests' works, still held by their backends
  const size_t before = r.scans();
  constexpr int kWorks = 4096;
  std::vector<std::atomic<std::thread::id>> where(kWorks);
  std::vector<c10::intrusive_ptr<Tracked>> heldElsewhere;
  for (int i = 0; i < kWorks; ++i) {
    auto w = c10::make_intrusive<Tracked>(&where[i]);
    heldElsewhere.push_back(w);
    r.retire(std::move(w));
    r.sweep();  // what the next collective does
  }
  const size_t scans = r.scans() - before;
  EXPECT_LE(scans, 2u * 13u) << "a scan per doubling (log2 4096 = 12), not one per collective";
  EXPECT_GE(r.kept(), static_cast<size_t>(kWorks));
  // Once the ledger lets go, they are still freed by this thread, never by the other.
  std::thread ledger([held = std::move(heldElsewhere)]() mutable { held.clear(); });
  ledger.join();
  r.sweepAll();
  EXPECT_LE(r.kept(), keptBefore);
  for (auto& w : where) EXPECT_EQ(w.load(), std::this_thread::get_id());
}

}  // namespace test_work_retirement
