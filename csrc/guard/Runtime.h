#pragma once

// Runtime: what the core needs from the host language, behind plain function
// hooks so the core stays Python-free. The bindings install Python
// implementations (python/PyRuntime.cpp); C++ tests run with the defaults.

#include "guard/report/Frame.h"

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace torch_ext {

enum class LogLevel : int { Debug = 10, Info = 20, Warning = 30, Error = 40 };

class Runtime {
 public:
  // Samples the main thread's stack within about `budget`; must not block longer.
  using StackHook = std::function<MainThreadStack(std::chrono::milliseconds budget)>;
  // Hands a message to the host's logging; must not block (called from the watchdog).
  using LogHook = std::function<void(LogLevel, const std::string&)>;

  static Runtime& instance();

  using IdleHook = std::function<void()>;

  void install(StackHook stack, LogHook log, IdleHook idle);
  void uninstall();  // back to the defaults (e.g. when the interpreter exits)

  MainThreadStack mainThreadStack(std::chrono::milliseconds budget) const;
  // Logs through the hook, or to stderr at warning and above when none is installed.
  void log(LogLevel level, const std::string& msg) const;
  // The watchdog stopped (no guarded group left): helpers may stop their threads.
  void idle() const;
  // Makes and logs the live report of the whole job (TORCH_EXT_LIVE_SIGNAL
  // arrived); must not block (called from the watchdog thread).
  using LiveHook = std::function<void(int signal)>;
  // The other Python threads' stacks within about `budget` (none when the GIL
  // cannot be had); must not block longer.
  using ThreadsHook = std::function<std::vector<ThreadStack>(std::chrono::milliseconds budget)>;
  void setThreadStacks(ThreadsHook hook);
  std::vector<ThreadStack> threadStacks(std::chrono::milliseconds budget) const;
  void setLiveReport(LiveHook hook);
  void liveReport(int signal) const;
  // Waits up to `bound` until the messages handed to log() are written (a
  // process about to end by a signal); true when they are (or none is pending).
  using FlushHook = std::function<bool(std::chrono::milliseconds bound)>;
  void setFlushLogs(FlushHook hook);
  bool flushLogs(std::chrono::milliseconds bound) const;
  // What this process runs ("torch 2.13.0, torch_ext 0.1.0, Python 3.11.7"), set
  // by the host at import; every snapshot and dump carries it.
  void setSoftware(std::string text);
  std::string software() const;

 private:
  mutable std::mutex mu_;
  StackHook stack_;
  LogHook log_;
  IdleHook idle_;
  LiveHook live_;
  ThreadsHook threads_;
  FlushHook flush_;
  std::string software_;
};

inline void logMessage(LogLevel level, const std::string& msg) {
  Runtime::instance().log(level, msg);
}

}  // namespace torch_ext
