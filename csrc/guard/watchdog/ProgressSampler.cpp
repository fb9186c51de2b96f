#include "guard/watchdog/ProgressSampler.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace torch_ext {

namespace {

// The main thread's CPU time, in ns; -1 where /proc does not say. schedstat's first field is the
// scheduler's own count, to the nanosecond; stat's utime + stime come in clock ticks (10 ms), and
// one tick crossed in a 200 ms window is the 5% that counts as busy: a main thread blocked in a
// store wait read as busy in a CI run's live report. stat where schedstat is missing.
int64_t mainThreadCpuNs() {
  const std::string task = "/proc/self/task/" + std::to_string(getpid());
  {
    std::ifstream in(task + "/schedstat");
    long long runNs = -1;
    if (in >> runNs && runNs >= 0) return runNs;
  }
  std::ifstream in(task + "/stat");
  std::string line;
  if (!in || !std::getline(in, line)) return -1;
  const auto close = line.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  long long utime = -1, stime = -1;
  // After the command: state (3rd field of the line) ... utime is the 14th, stime the 15th.
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) utime = std::atoll(field.c_str());
    if (i == 15) stime = std::atoll(field.c_str());
  }
  const long ticks = sysconf(_SC_CLK_TCK);
  if (utime < 0 || stime < 0 || ticks <= 0) return -1;
  return (utime + stime) * (1'000'000'000LL / ticks);
}

// Storage bytes the main thread read and wrote so far; -1 where /proc does not say. Its
// own, not the process's: other threads' I/O (the guard's dump writes, code pages a
// thread faults in from a shared library) is not what the main thread does.
int64_t storageBytes() {
  std::ifstream in("/proc/self/task/" + std::to_string(getpid()) + "/io");
  std::string name;
  long long value = 0, total = 0;
  int found = 0;
  while (in >> name >> value) {
    if (name == "read_bytes:" || name == "write_bytes:") {
      total += value;
      ++found;
    }
  }
  return found == 2 ? total : -1;
}

}  // namespace

ProgressSampler& ProgressSampler::instance() {
  static ProgressSampler* sampler = new ProgressSampler();  // never destroyed: the watchdog may sample at exit
  return *sampler;
}

void ProgressSampler::sample(int64_t nowNs) {
  take(nowNs, kEveryNs);
}

ProgressFacts ProgressSampler::now(int64_t nowNs) {
  take(nowNs, kFreshNs);
  return facts(nowNs);
}

void ProgressSampler::take(int64_t nowNs, int64_t minAgeNs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Until there are two samples (a window), any newer one is taken.
    const int64_t minAge = samples_.size() < 2 ? 1 : minAgeNs;
    if (!readable_ || (!samples_.empty() && nowNs - samples_.back().atNs < minAge)) return;
  }
  const int64_t cpu = mainThreadCpuNs();
  if (cpu < 0) {
    std::lock_guard<std::mutex> lock(mu_);
    readable_ = false;
    return;
  }
  add(Sample{nowNs, cpu, storageBytes()});
}

void ProgressSampler::add(const Sample& s) {
  std::lock_guard<std::mutex> lock(mu_);
  // Two threads may sample at once (the watchdog's tick, a snapshot): the later-read one wins.
  if (!samples_.empty() && s.atNs <= samples_.back().atNs) return;
  if (!samples_.empty()) {
    const Sample& prev = samples_.back();
    const int64_t span = s.atNs - prev.atNs;
    const bool ran =
        span > 0 && static_cast<double>(s.cpuNs - prev.cpuNs) >= ProgressFacts::kCpuShare * static_cast<double>(span);
    const bool moved = s.ioBytes >= 0 && prev.ioBytes >= 0 && s.ioBytes - prev.ioBytes >= ProgressFacts::kIoBytes;
    if (ran || moved) lastProgressNs_ = s.atNs;
    latestProgressed_ = ran || moved;
  }
  samples_.push_back(s);
  while (samples_.size() > 2 && s.atNs - samples_[1].atNs >= ProgressFacts::kWindowNs) samples_.pop_front();
}

ProgressFacts ProgressSampler::facts(int64_t nowNs) const {
  std::lock_guard<std::mutex> lock(mu_);
  ProgressFacts f;
  if (samples_.size() < 2) return f;
  const Sample& first = samples_.front();
  const Sample& last = samples_.back();
  f.known = true;
  f.windowNs = last.atNs - first.atNs;
  f.cpuNs = last.cpuNs - first.cpuNs;
  f.ioBytes = first.ioBytes >= 0 && last.ioBytes >= 0 ? last.ioBytes - first.ioBytes : -1;
  f.quietNs = nowNs - (lastProgressNs_ != 0 ? lastProgressNs_ : first.atNs);
  f.busy = latestProgressed_;
  return f;
}

}  // namespace torch_ext
