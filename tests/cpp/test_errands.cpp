// Errands: the guard's short background tasks run on threads it owns and
// joins (no detached one-off threads). Every wait here is bounded.
#include "guard/Errands.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

using namespace torch_ext;
using std::chrono::milliseconds;

namespace test_errands {

namespace {

// A gate an errand waits at until the test opens it (bounded: 30 s).
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(30), [this] { return open; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
};

}  // namespace

TEST(Errands, RunsEachTaskAndJoinsItWhenItEnds) {
  Errands& errands = Errands::instance();
  ASSERT_TRUE(errands.finish(milliseconds(5000)).empty());
  std::atomic<int> ran{0};
  for (int i = 0; i < 8; ++i) errands.run("count " + std::to_string(i), [&ran] { ++ran; });
  EXPECT_TRUE(errands.finish(milliseconds(5000)).empty());
  EXPECT_EQ(ran.load(), 8);
  EXPECT_EQ(errands.running(), 0u);
}

TEST(Errands, AStuckErrandIsNamedAndLeftAtFinishThenJoinedOnceItEnds) {
  Errands& errands = Errands::instance();
  auto gate = std::make_shared<Gate>();
  errands.run("waits for the test", [gate] { gate->wait(); });
  EXPECT_EQ(errands.running(), 1u);
  // finish() waits its bound, then names what still runs.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(errands.finish(milliseconds(100)), std::vector<std::string>{"waits for the test"});
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(100));
  gate->release();
  EXPECT_TRUE(errands.finish(milliseconds(5000)).empty());
  EXPECT_EQ(errands.running(), 0u);
}

TEST(Errands, AnErrandMayStartAnotherAndAThrowingOneDoesNotStopTheOthers) {
  Errands& errands = Errands::instance();
  std::atomic<int> ran{0};
  errands.run("throws", [] { throw std::runtime_error("on purpose"); });
  // Starting an errand from an errand, and from the destruction of an
  // errand's captures (a work's destructor may start one).
  struct StartsOnDrop {
    std::atomic<int>* ran = nullptr;
    ~StartsOnDrop() {
      if (ran != nullptr) Errands::instance().run("started on drop", [r = ran] { ++*r; });
    }
  };
  auto drop = std::make_shared<StartsOnDrop>();
  drop->ran = &ran;
  errands.run("starts another",
              [&ran, drop = std::move(drop)] { Errands::instance().run("started inside", [&ran] { ++ran; }); });
  // Each finish joins what ended; an errand started meanwhile is waited for by the next.
  for (int i = 0; i < 3 && errands.running() > 0; ++i) errands.finish(milliseconds(5000));
  EXPECT_TRUE(errands.finish(milliseconds(5000)).empty());
  EXPECT_EQ(ran.load(), 2);
}

}  // namespace test_errands
