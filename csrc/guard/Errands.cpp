#include "guard/Errands.h"

#include "guard/Runtime.h"

#include <exception>

namespace torch_ext {

Errands& Errands::instance() {
  // Never destroyed: an errand still running at exit must not meet a
  // destroyed owner (nor a joinable std::thread's destructor, which aborts).
  static auto* errands = new Errands();
  return *errands;
}

void Errands::run(std::string name, std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  joinEnded();
  errands_.push_back(Errand{std::move(name), std::thread(), false});
  Errand* self = &errands_.back();  // list nodes stay put until joinEnded erases them
  self->thread = std::thread([this, self, task = std::move(task)]() mutable {
    try {
      task();
    } catch (const std::exception& e) {
      logMessage(LogLevel::Warning, "guard: the errand '" + self->name + "' failed: " + e.what());
    }
    // Its captures go first: dropping them may start another errand.
    task = nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    self->ended = true;
    cv_.notify_all();
  });
}

void Errands::joinEnded() {
  for (auto it = errands_.begin(); it != errands_.end();) {
    if (it->ended) {
      it->thread.join();
      it = errands_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<std::string> Errands::finish(std::chrono::milliseconds bound) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, bound, [this] {
    for (const auto& e : errands_) {
      if (!e.ended) return false;
    }
    return true;
  });
  joinEnded();
  std::vector<std::string> left;
  for (const auto& e : errands_) left.push_back(e.name);
  return left;
}

size_t Errands::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& e : errands_) n += e.ended ? 0 : 1;
  return n;
}

}  // namespace torch_ext
