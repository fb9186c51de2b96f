#pragma once

// Test helpers for the guard's store: an in-memory group store, and a store
// wrapper that injects faults (fail, block, slow down) into calls, the way
// torchft tests its process groups through a fault-injecting wrapper.

#include "guard/store/StoreChannel.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace torch_ext::testkit {

// Wraps a store; every call first goes through `gate()`, which applies the
// current fault.
class FaultyStore : public c10d::Store {
 public:
  enum class Mode { Pass, Fail, Block, Slow };

  explicit FaultyStore(c10::intrusive_ptr<c10d::Store> inner = c10::make_intrusive<c10d::HashStore>())
      : inner_(std::move(inner)) {}

  // Fail: every call throws DistNetworkError (the server's process is gone).
  // Block: every call waits until release() (a frozen server). Slow: every
  // call takes `delay` longer.
  void setMode(Mode m, std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
    std::lock_guard<std::mutex> lock(mu_);
    mode_ = m;
    delay_ = delay;
    cv_.notify_all();
  }
  // Ends every blocked call (they then fail, as against a server killed while frozen).
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  int blocked() const {
    return blocked_.load();
  }
  uint64_t calls() const {
    return calls_.load();
  }

  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(this);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    gate();
    inner_->set(key, value);
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    gate();
    return inner_->compareSet(key, expected, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    gate();
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override {
    gate();
    return inner_->add(key, value);
  }
  bool deleteKey(const std::string& key) override {
    gate();
    return inner_->deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    gate();
    return inner_->check(keys);
  }
  int64_t getNumKeys() override {
    gate();
    return inner_->getNumKeys();
  }
  void wait(const std::vector<std::string>& keys) override {
    gate();
    inner_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    gate();
    inner_->wait(keys, timeout);
  }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    gate();
    return inner_->multiGet(keys);
  }
  bool hasExtendedApi() const override {
    return true;
  }

 private:
  void gate() {
    calls_++;
    std::unique_lock<std::mutex> lock(mu_);
    switch (mode_) {
      case Mode::Pass:
        return;
      case Mode::Fail:
        C10_THROW_ERROR(DistNetworkError, "Connection reset by peer (injected)");
      case Mode::Block:
        blocked_++;
        cv_.wait(lock, [&] { return released_ || mode_ != Mode::Block; });
        blocked_--;
        if (released_) C10_THROW_ERROR(DistNetworkError, "Connection reset by peer (released)");
        return;
      case Mode::Slow: {
        auto d = delay_;
        lock.unlock();
        std::this_thread::sleep_for(d);
        return;
      }
    }
  }

  c10::intrusive_ptr<c10d::Store> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  Mode mode_ = Mode::Pass;
  std::chrono::milliseconds delay_{0};
  bool released_ = false;
  std::atomic<int> blocked_{0};
  std::atomic<uint64_t> calls_{0};
};

// A GroupStore over `store` (a fresh in-memory store by default) with a
// channel of its own (no clone, no sharing).
inline std::shared_ptr<GroupStore> groupStore(
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>(),
    std::chrono::milliseconds timeout = std::chrono::milliseconds(2000),
    StoreAddress address = StoreAddress{"HashStore", "", 0, "", -1}) {
  auto opened = StoreChannel::direct(store, std::move(address), timeout);
  return std::make_shared<GroupStore>(std::move(opened.channel), std::move(opened.view));
}

}  // namespace torch_ext::testkit
