// What timing a collective's wait costs on the thread that completes it
// (issue 28): WaitWindows::add, and the clock read that precedes it in
// Ledger::complete. Both run only in groups of 2 or more ranks with the
// straggler report on. Not a test; a throwaway loop of 20 M adds, 5 times:
//
//   g++ -O2 -std=c++20 -Icsrc benchmarks/wait_windows_add.cpp csrc/guard/collective/WaitWindows.cpp \
//       -o /tmp/wait_windows_add && /tmp/wait_windows_add
#include "guard/collective/WaitWindows.h"
#include <chrono>
#include <cstdio>
#include <time.h>
using namespace torch_ext;
static int64_t now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}
int main() {
  for (int rep = 0; rep < 5; ++rep) {
    WaitWindows w;
    const int N = 20000000;
    int64_t t0 = now(), sink = 0;
    for (int i = 1; i <= N; ++i) {
      w.add(i, i * 100, i * 100 + 37, 1 + (i % 3 == 0));
    }
    int64_t t1 = now();
    for (int i = 1; i <= N; ++i) {
      sink += now();
    }
    int64_t t2 = now();
    std::printf("add: %.1f ns   clock: %.1f ns  (%zu closed, %lld)\n", double(t1 - t0) / N, double(t2 - t1) / N,
                w.closed().size(), (long long)(sink & 1));
  }
}
