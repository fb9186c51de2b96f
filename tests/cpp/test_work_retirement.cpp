// WorkRetirement: a work (or future) the user's thread drops while the inner
// backend's worker still holds it is freed on the next issuing thread, never on
// the worker; one nobody else holds is freed at once.
#include "guard/WorkRetirement.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

using namespace torch_ext;

namespace {

// Records the thread that destroyed it.
struct Tracked : c10::intrusive_ptr_target {
  explicit Tracked(std::atomic<std::thread::id>* where) : where_(where) {}
  ~Tracked() override {
    where_->store(std::this_thread::get_id());
  }
  std::atomic<std::thread::id>* where_;
};

} // namespace

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
  r.sweep();
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
  r.sweep();
  EXPECT_EQ(b.load(), std::this_thread::get_id());
  EXPECT_EQ(a.load(), std::thread::id{});
  EXPECT_GE(r.kept(), 1u);
  heldElsewhere.reset();
  r.sweep();
  EXPECT_EQ(a.load(), std::this_thread::get_id());
}
