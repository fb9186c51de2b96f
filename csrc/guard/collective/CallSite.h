#pragma once

// CallSite: where in the user's program a collective was issued.
//
// The core never touches Python: capturing the current Python frame is done by a
// provider function that the bindings install (see python/PyRuntime.cpp). The
// provider returns an interned id, so a ledger entry stores 4 bytes, and the
// strings are built once per distinct call site, not once per collective.

#include "guard/report/Frame.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace torch_ext {

class CallSites {
 public:
  using Provider = uint32_t (*)();

  static CallSites& instance();

  // Returns a stable id >= 1 for `frames` (innermost first); 0 is "unknown".
  uint32_t intern(const std::vector<Frame>& frames);
  // Frames of `id`; empty for 0 or an unknown id.
  std::vector<Frame> frames(uint32_t id) const;
  std::string describe(uint32_t id) const;      // describeCallSite(frames(id))
  std::string describePath(uint32_t id) const;  // describeCallPath(frames(id))
  // The same on every rank for the same frames (a hash of them), unlike the
  // id: how ranks name a call site to each other (straggler windows). 0 for 0.
  uint64_t stableKey(uint32_t id) const;
  // The call path's key: the user's frames of the site and its callers (file
  // basename, line, function), the same on every rank that issued from the
  // same lines, wherever each rank's copy of the program lives. 0 for 0.
  uint64_t pathKey(uint32_t id) const;
  // The id this process gave the frames of `stableKey` (0: never seen here).
  uint32_t byStableKey(uint64_t key) const;

  void setProvider(Provider provider) {
    provider_.store(provider, std::memory_order_release);
  }
  // Captures the calling thread's call site; 0 when no provider or no Python frame.
  uint32_t capture() const {
    Provider p = provider_.load(std::memory_order_acquire);
    return p ? p() : 0;
  }

 private:
  static constexpr size_t kMaxSites = 1 << 16;
  mutable std::mutex mu_;
  std::vector<std::vector<Frame>> sites_{std::vector<Frame>{}};  // index 0: unknown
  std::unordered_map<std::string, uint32_t> byKey_;
  std::vector<uint64_t> stableKeys_{0};  // by id
  std::vector<uint64_t> pathKeys_{0};    // by id
  std::unordered_map<uint64_t, uint32_t> byStableKey_;
  std::atomic<Provider> provider_{nullptr};
};

}  // namespace torch_ext
