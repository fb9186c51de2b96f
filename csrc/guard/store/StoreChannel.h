#pragma once

// StoreChannel: the guard's own connection to the store, with bounded calls
// and health tracking.
//
// Nothing outside the process is reliable, the store included: outside
// torchrun the TCPStore lives in rank 0's process, so the most common fault
// (rank 0 raises, is OOM-killed or freezes) takes the guard's cross-rank
// channel with it. torch's TCPStore client has no timeout on most replies
// (set/add/check/compareSet wait in recv() for as long as the server's process
// is frozen; get/wait cancel their wait with one more unbounded recv), and the
// group's own timeout is 30 minutes. So:
//
//  - every store call of the guard runs on the channel's I/O thread
//    (`torch_ext_store`): the watchdog's whole exchange runs there as jobs, and
//    other threads' calls (strict checks, leaving a group) wait for their
//    result only while the channel is healthy;
//  - each store call is timed: one still unanswered after its bound
//    (store_timeout, plus the wait for a wait()) declares the channel
//    NotAnswering, and is abandoned where it blocks;
//  - a connection error (the server's process exited: reset, broken pipe,
//    refused, EOF) declares it Lost;
//  - both are final: every later call is refused at once. The guard does not
//    reconnect (gloo's connections to the same process do not come back
//    either, and a restarted store would hold none of the keys).
//
// health() reads only timestamps, so the watchdog thread checks it every tick
// without ever waiting on the store: a frozen store is named within its bound
// and deadlines fire on time whatever the store does.
//
// The channel talks through a clone of the store (a client connection of its
// own), so the guard never queues behind the user's store calls nor blocks
// them. Groups on the same store share one channel (one extra connection and
// one thread per process, not per group); GroupStore is a group's view of it.
// The channel never joins a thread that may be blocked in a call.

#include "guard/report/EnumNames.h"
#include "guard/report/StoreHealth.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch_ext {

inline const char* storeHealthName(StoreHealth h) {
  return enumName(h);
}

// Where the store lives and who serves it, for messages.
struct StoreAddress {
  std::string kind;       // "TCPStore", "FileStore", "HashStore", ...
  std::string host;       // TCPStore only
  int port = 0;           // TCPStore only
  std::string hostedBy;   // e.g. "rank 0's process (plain env:// rendezvous: ...)"; "" when unknown
  int64_t hostRank = -1;  // global rank whose process serves it; -1: none (torchrun's agent) or unknown
  // "the store at 127.0.0.1:29500" / "the FileStore".
  std::string describe() const;
};

enum class CallStatus : uint8_t {
  Ok,
  Failed,       // the call raised, the store is fine (e.g. a wait that timed out)
  Unavailable,  // the channel is not healthy or closed: the call did not run, or was abandoned
};

template <typename T>
struct StoreResult {
  CallStatus status = CallStatus::Unavailable;
  T value{};
  std::string error;
  bool ok() const {
    return status == CallStatus::Ok;
  }
};

class StoreChannel {
 public:
  // `connection` is the client the channel owns (normally a clone); `timeout`
  // bounds each call (store_timeout).
  StoreChannel(c10::intrusive_ptr<c10d::Store> connection, StoreAddress address, std::chrono::milliseconds timeout);
  ~StoreChannel();  // stops the I/O thread; never joins one blocked in a call
  StoreChannel(const StoreChannel&) = delete;
  StoreChannel& operator=(const StoreChannel&) = delete;

  // The channel for `groupStore`'s underlying store, shared by every group on
  // it (its bound is the smallest `timeout` asked for), and `groupStore`'s view
  // onto the channel's own connection (the same key prefixes). Clones the store
  // on first use (at group creation, while it is known to answer); a store that
  // cannot be cloned is used as is.
  struct Opened {
    std::shared_ptr<StoreChannel> channel;
    c10::intrusive_ptr<c10d::Store> view;
    // The channel's connection to the base store (no prefix), and what the
    // view's prefixes add in front of a key there ("default_pg/0//cpu/"):
    // the base-store key of view key k is rootPrefix + k.
    c10::intrusive_ptr<c10d::Store> root;
    std::string rootPrefix;
  };
  static Opened open(const c10::intrusive_ptr<c10d::Store>& groupStore, StoreAddress address,
                     std::chrono::milliseconds timeout);
  // A channel over `store` itself (no clone, no sharing), e.g. for tests.
  static Opened direct(const c10::intrusive_ptr<c10d::Store>& store, StoreAddress address,
                       std::chrono::milliseconds timeout);
  // What `open` would name for `store` (kind, host, port), hostedBy left empty.
  static StoreAddress addressOf(const c10::intrusive_ptr<c10d::Store>& store);

  // Runs `fn` (store calls through a view of this channel) on the I/O thread,
  // or right here when called from it, and returns its result. Unavailable
  // without running `fn` when the channel is not healthy or closed; Unavailable
  // as soon as it stops being healthy (or `maxWait` passes) while waiting.
  template <typename T>
  StoreResult<T> call(const char* what, std::function<T()> fn,
                      std::chrono::milliseconds maxWait = std::chrono::milliseconds::max()) {
    StoreResult<T> out;
    auto value = std::make_shared<T>();
    out.status = run(what, [fn = std::move(fn), value] { *value = fn(); }, maxWait, &out.error);
    if (out.status == CallStatus::Ok) out.value = std::move(*value);
    return out;
  }
  // Queues `job` for the I/O thread and returns at once; false when refused.
  // A job's own store calls are bounded; its exceptions are logged at debug.
  bool post(std::function<void()> job);
  bool onIoThread() const;

  // Declares NotAnswering when the store call in flight overstayed its bound,
  // so a stuck call is noticed with nobody waiting on it. Never blocks on the store.
  StoreHealth health();
  std::string lossReason() const;  // "" while healthy
  const StoreAddress& address() const {
    return address_;
  }
  std::chrono::milliseconds timeout() const;
  // "the store at 127.0.0.1:29500 (hosted by rank 0's process) is gone: connection
  // failed during add: ..." / "... does not answer: no reply to add for 3.0 s"; "" while healthy.
  std::string describeLoss() const;

  // Ends the I/O thread once its queue is empty (no group on this store is
  // watched any more: destroy_process_group() leaves no thread behind). A later
  // call starts it again. Never joins a thread stuck in a call.
  void quiesce();

  // Refuses every further call and releases every waiter (process exit);
  // returns at once. A call in flight is left to finish on its own.
  void close();

  // For tests: declares the channel lost now, as a connection error would.
  void declareLost(const std::string& reason);

  struct Impl;

 private:
  CallStatus run(const char* what, std::function<void()> fn, std::chrono::milliseconds maxWait, std::string* error);
  void lowerTimeout(std::chrono::milliseconds timeout);

  std::shared_ptr<Impl> impl_;
  StoreAddress address_;
};

// One group's view of the channel: keys live under the group's store prefix
// and "guard/". Every call is bounded and never throws; results say whether
// the store answered.
class GroupStore {
 public:
  GroupStore(std::shared_ptr<StoreChannel> channel, c10::intrusive_ptr<c10d::Store> view);
  // With the base store and the view's prefix (StoreChannel::Opened), for
  // setRoot and fullPrefix.
  GroupStore(std::shared_ptr<StoreChannel> channel, c10::intrusive_ptr<c10d::Store> view,
             c10::intrusive_ptr<c10d::Store> root, std::string rootPrefix);

  bool set(const std::string& key, const std::string& value,
           std::chrono::milliseconds maxWait = std::chrono::milliseconds::max());
  // The value if the key exists; nullopt if it does not or the store failed.
  std::optional<std::string> get(const std::string& key);
  StoreResult<bool> check(const std::vector<std::string>& keys);
  StoreResult<int64_t> add(const std::string& key, int64_t delta);
  // The value after the compare-set (== desired when this call won).
  StoreResult<std::string> compareSet(const std::string& key, const std::string& expected, const std::string& desired);
  // Values of keys that all exist (the caller knows they do).
  StoreResult<std::vector<std::string>> multiGet(const std::vector<std::string>& keys);
  // Waits up to `wait` for every key to exist: value true when they do, false
  // when the wait ran out; Unavailable when the store failed.
  StoreResult<bool> waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds wait);
  void deleteKeys(const std::vector<std::string>& keys);
  // Sets `key` in the base store, outside every prefix (keys::kLiveDirectory);
  // false when the store failed or this view was made without its base.
  bool setRoot(const std::string& key, const std::string& value);
  // What every key of this group (guard/ included) carries in front in the
  // base store: a client of the base store reads key k of this group as
  // fullPrefix() + k. Empty when made without its base.
  std::string fullPrefix() const;

  StoreHealth health() {
    return channel_->health();
  }
  StoreChannel& channel() {
    return *channel_;
  }
  uint64_t ops() const {
    return ops_.load(std::memory_order_relaxed);
  }

 private:
  static std::string full(const std::string& key);
  std::shared_ptr<StoreChannel> channel_;
  c10::intrusive_ptr<c10d::Store> view_;
  c10::intrusive_ptr<c10d::Store> root_;
  std::string rootPrefix_;
  std::atomic<uint64_t> ops_{0};
};

}  // namespace torch_ext
