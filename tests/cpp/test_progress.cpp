// ProgressSampler and Progress (issue 68: busy is not hung): the rule on given
// samples, what a report says of it, and that this process's own main thread
// is seen running.
#include "guard/watchdog/ProgressSampler.h"

#include "guard/Clock.h"
#include "guard/report/Progress.h"

#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <string>
#include <thread>

using namespace torch_ext;

namespace test_progress {

namespace {

constexpr int64_t kSec = 1'000'000'000;

}  // namespace

TEST(Progress, AMainThreadThatRunsIsBusyAndOneThatIdlesIsNotProgressingSinceItStopped) {
  ProgressSampler p;
  EXPECT_FALSE(p.facts(0).known);  // one sample says nothing
  // 10 s at 90% of a CPU, one sample a second, no storage I/O.
  for (int i = 0; i <= 10; ++i) p.add({i * kSec, i * kSec * 9 / 10, 0});
  ProgressFacts f = p.facts(10 * kSec);
  ASSERT_TRUE(f.known);
  EXPECT_TRUE(f.busy);
  EXPECT_EQ(f.windowNs, 10 * kSec);
  EXPECT_EQ(f.cpuNs, 9 * kSec);
  EXPECT_EQ(f.ioBytes, 0);
  EXPECT_EQ(describeProgress(f), "busy, not hung: in the last 10.0 s its main thread ran 9.0 s of CPU");
  // Then idle (1% of a CPU: the watchdog's own threads are not the main thread's) for 12 s.
  for (int i = 11; i <= 22; ++i) p.add({i * kSec, 9 * kSec + (i - 10) * kSec / 100, 0});
  f = p.facts(22 * kSec);
  EXPECT_FALSE(f.busy);
  EXPECT_EQ(f.quietNs, 12 * kSec);
  EXPECT_EQ(describeProgress(f), "not progressing for 12.0 s: its main thread idle, no storage I/O");
}

TEST(Progress, StorageIoCountsAsProgressAndTheWindowKeepsThirtySeconds) {
  ProgressSampler p;
  // A main thread waiting for a writer: no CPU, 50 MB a second to storage.
  for (int i = 0; i <= 40; ++i) p.add({i * kSec, 0, i * int64_t{50'000'000}});
  const ProgressFacts f = p.facts(40 * kSec);
  EXPECT_TRUE(f.busy);
  EXPECT_GE(f.windowNs, ProgressFacts::kWindowNs);
  EXPECT_LE(f.windowNs, ProgressFacts::kWindowNs + kSec);
  EXPECT_EQ(f.ioBytes, f.windowNs / kSec * 50'000'000);
  EXPECT_NE(describeProgress(f).find("of CPU and moved 1.5 GB to and from storage"), std::string::npos)
      << describeProgress(f);
  // A sample read before the last one (another thread sampled meanwhile) is dropped.
  ProgressSampler order;
  order.add({2 * kSec, kSec, 0});
  order.add({kSec, 0, 0});
  EXPECT_FALSE(order.facts(2 * kSec).known);
  // Nothing ran in a short sampled span: not progressing, however short.
  ProgressSampler idle;
  idle.add({0, 0, 0});
  idle.add({kSec, 0, 0});
  EXPECT_FALSE(idle.facts(kSec).busy);
  EXPECT_EQ(describeProgress(idle.facts(kSec)), "not progressing for 1.0 s: its main thread idle, no storage I/O");
  // Unknown I/O is said so.
  ProgressSampler q;
  q.add({0, 0, -1});
  q.add({5 * kSec, 0, -1});
  EXPECT_EQ(describeProgress(q.facts(5 * kSec)),
            "not progressing for 5.0 s: its main thread idle (storage I/O not known)");
  EXPECT_EQ(describeProgress(ProgressFacts()), "");
}

TEST(Progress, ThisProcesssMainThreadIsSeenRunning) {
  // The test's own main thread spins for 1.2 s while it samples (Linux /proc).
  ProgressSampler p;
  const int64_t start = steadyNs();
  volatile uint64_t x = 0;
  int64_t now = start;
  for (; now - start < 1'200'000'000; now = steadyNs()) {
    for (int i = 0; i < 10000; ++i) x = x + i;
    p.sample(now);
  }
  const ProgressFacts f = p.facts(now);
  ASSERT_TRUE(f.known) << "no /proc/self/task/<pid>/stat here?";
  EXPECT_TRUE(f.busy);
  // Then asleep: once a sample interval holds nothing but the sleep, what a
  // snapshot reads says so.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  p.sample(steadyNs());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const ProgressFacts asleep = p.now(steadyNs());
  EXPECT_FALSE(asleep.busy);
  EXPECT_GE(asleep.quietNs, 300'000'000);
  // It ran a good share of the window, far above the 5% that counts as busy; not most of it: CI runs
  // this suite at idle priority beside the Python tests, where the spin got half a core (0.50 s of 1.00 s).
  EXPECT_GT(f.cpuNs, f.windowNs / 10);
}

TEST(Progress, TheMainThreadsCpuIsReadToTheNanosecondNotTheClockTick) {
  // A clock-tick reading (10 ms) moves by 0 or 10 ms over 1 ms of CPU; one tick in a 200 ms window is
  // the 5% that counts as busy, so a blocked main thread could read busy.
  ProgressSampler p;
  p.sample(steadyNs());
  timespec t0{}, t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  const auto cpu = [](const timespec& a) { return int64_t{a.tv_sec} * kSec + a.tv_nsec; };
  volatile uint64_t x = 0;
  do {
    for (int i = 0; i < 1000; ++i) x = x + i;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  } while (cpu(t) - cpu(t0) < 1'000'000);
  p.sample(steadyNs());
  const ProgressFacts f = p.facts(steadyNs());
  ASSERT_TRUE(f.known);
  EXPECT_GE(f.cpuNs, 900'000);  // the spin's 1 ms, give or take the reads around it
  EXPECT_LT(f.cpuNs, 5'000'000);
}

}  // namespace test_progress
