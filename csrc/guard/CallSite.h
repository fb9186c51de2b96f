#pragma once

// CallSite: where in the user's program a collective was issued.
//
// The core never touches Python: capturing the current Python frame is done by a
// provider function that the bindings install (see python/PyRuntime.cpp). The
// provider returns an interned id, so a ledger entry stores 4 bytes, and the
// strings are built once per distinct call site, not once per collective.

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace torch_ext {

struct Frame {
  std::string filename;
  int line = 0;
  std::string function;
  // Empty for the user's code; otherwise the library the frame belongs to:
  // an installed package ("lightning"), a package the user listed in
  // TORCH_EXT_LIBRARY_PACKAGES, "torch", "torch_ext" or "stdlib".
  std::string library;
  bool isUser() const {
    return library.empty();
  }
  // "train.py:120 in training_step" (basename of the file); a library frame
  // names its library: "lightning .../distributed.py:213 in _sync_ddp".
  std::string describe() const;
};

// Frames innermost first.
std::string describeFrames(const std::vector<Frame>& frames, size_t maxFrames = 3);

// A call site as captured (innermost first): the user's frame, then the
// framework frame it went through, if any:
// "train.py:15 in validation_step (via lightning .../distributed.py:213 in _sync_ddp)".
std::string describeCallSite(const std::vector<Frame>& frames);

// A main-thread stack (innermost first) for reports: the innermost frame (where
// the thread is now), then the user's frames, with each run of library frames
// between them folded ("... 6 lightning frames ..."). At most `maxUser` user
// frames; a user frame is never dropped in favour of a library frame.
std::string describeStack(const std::vector<Frame>& frames, size_t maxUser = 4);

class CallSites {
 public:
  using Provider = uint32_t (*)();

  static CallSites& instance();

  // Returns a stable id >= 1 for `frames` (innermost first); 0 is "unknown".
  uint32_t intern(const std::vector<Frame>& frames);
  // Frames of `id`; empty for 0 or an unknown id.
  std::vector<Frame> frames(uint32_t id) const;
  std::string describe(uint32_t id) const;  // describeCallSite(frames(id))

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
  std::atomic<Provider> provider_{nullptr};
};

} // namespace torch_ext
