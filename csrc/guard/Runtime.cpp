#include "guard/Runtime.h"

#include <cstdio>

namespace torch_ext {

Runtime& Runtime::instance() {
  // Leaked: the watchdog may log while static destructors run.
  static auto* runtime = new Runtime();
  return *runtime;
}

void Runtime::install(StackHook stack, LogHook log, IdleHook idle) {
  std::lock_guard<std::mutex> lock(mu_);
  stack_ = std::move(stack);
  log_ = std::move(log);
  idle_ = std::move(idle);
}

void Runtime::uninstall() {
  std::lock_guard<std::mutex> lock(mu_);
  stack_ = nullptr;
  log_ = nullptr;
  idle_ = nullptr;
}

void Runtime::setLiveReport(LiveHook hook) {
  std::lock_guard<std::mutex> lock(mu_);
  live_ = std::move(hook);
}

void Runtime::liveReport(int signal) const {
  LiveHook hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hook = live_;
  }
  if (hook) {
    hook(signal);
  } else {
    std::fprintf(stderr, "[torch_ext] signal %d asked for a live report, but no Python runtime is attached\n", signal);
  }
}

void Runtime::setFlushLogs(FlushHook hook) {
  std::lock_guard<std::mutex> lock(mu_);
  flush_ = std::move(hook);
}

bool Runtime::flushLogs(std::chrono::milliseconds bound) const {
  FlushHook hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hook = flush_;
  }
  return hook ? hook(bound) : true;  // without a host, log() writes at once
}

void Runtime::setThreadStacks(ThreadsHook hook) {
  std::lock_guard<std::mutex> lock(mu_);
  threads_ = std::move(hook);
}

std::vector<ThreadStack> Runtime::threadStacks(std::chrono::milliseconds budget) const {
  ThreadsHook hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hook = threads_;
  }
  return hook ? hook(budget) : std::vector<ThreadStack>{};
}

void Runtime::idle() const {
  IdleHook hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hook = idle_;
  }
  if (hook) hook();
}

MainThreadStack Runtime::mainThreadStack(std::chrono::milliseconds budget) const {
  StackHook hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hook = stack_;
  }
  if (!hook) {
    MainThreadStack s;
    s.note = "no Python runtime attached";
    return s;
  }
  return hook(budget);
}

void Runtime::log(LogLevel level, const std::string& msg) const {
  LogHook hook;
  {
    std::lock_guard<std::mutex> lock(mu_);
    hook = log_;
  }
  if (hook) {
    hook(level, msg);
  } else if (level >= LogLevel::Warning) {
    std::fprintf(stderr, "[torch_ext] %s\n", msg.c_str());
  }
}

void Runtime::setSoftware(std::string text) {
  std::lock_guard<std::mutex> lock(mu_);
  software_ = std::move(text);
}

std::string Runtime::software() const {
  std::lock_guard<std::mutex> lock(mu_);
  return software_;
}

}  // namespace torch_ext
