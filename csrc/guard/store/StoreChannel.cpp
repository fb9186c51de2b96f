#include "guard/store/StoreChannel.h"

#include "guard/Clock.h"
#include "guard/store/StoreKeys.h"
#include "guard/report/Messages.h"
#include "guard/Runtime.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <pthread.h>
#include <thread>

namespace torch_ext {

namespace {

// The clone's own timeout bounds the key wait inside get() and multiGet()
// (a key deleted between check() and get(): only key cleanup deletes keys).
constexpr std::chrono::milliseconds kCloneTimeout{1000};
// How often a waiter looks at the channel's health.
constexpr std::chrono::milliseconds kWaitSlice{20};

std::string firstLine(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

using messages::seconds;

// torch's network errors in a few words ("connection closed", "broken pipe").
std::string networkWords(const std::string& msg) {
  struct Known {
    const char* needle;
    const char* words;
  };
  static const Known known[] = {{"got 0 bytes", "connection closed"},
                                {"Connection closed", "connection closed"},
                                {"Broken pipe", "broken pipe"},
                                {"Connection reset", "connection reset"},
                                {"Connection refused", "connection refused"},
                                {"timed out", "timed out"}};
  for (const auto& k : known) {
    if (msg.find(k.needle) != std::string::npos) return k.words;
  }
  return msg.size() > 120 ? msg.substr(0, 117) + "..." : msg;
}

int64_t toNs(std::chrono::milliseconds d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

// The store call in flight on the I/O thread, for health().
struct CallClock {
  std::mutex mu;
  int64_t sinceNs = 0;  // 0: no call in flight
  int64_t boundNs = 0;
  const char* what = "";              // the call in flight, or the last one
  std::atomic<int64_t> timeoutNs{0};  // store_timeout
};

// Times every call of the channel's connection: health() declares the channel
// NotAnswering when one overstays its bound.
class TimedStore : public c10d::Store {
 public:
  TimedStore(c10::intrusive_ptr<c10d::Store> inner, std::shared_ptr<CallClock> clock)
      : inner_(std::move(inner)), clock_(std::move(clock)) {}

  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(this);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Timer t(*clock_, "set");
    inner_->set(key, value);
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    Timer t(*clock_, "compare_set");
    return inner_->compareSet(key, expected, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override {
    Timer t(*clock_, "get", toNs(kCloneTimeout));
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override {
    Timer t(*clock_, "add");
    return inner_->add(key, value);
  }
  bool deleteKey(const std::string& key) override {
    Timer t(*clock_, "delete_key");
    return inner_->deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    Timer t(*clock_, "check");
    return inner_->check(keys);
  }
  int64_t getNumKeys() override {
    Timer t(*clock_, "num_keys");
    return inner_->getNumKeys();
  }
  void wait(const std::vector<std::string>& keys) override {
    Timer t(*clock_, "wait", toNs(inner_->getTimeout()));
    inner_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    Timer t(*clock_, "wait", toNs(timeout));
    inner_->wait(keys, timeout);
  }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    Timer t(*clock_, "multi_get", toNs(kCloneTimeout));
    return inner_->multiGet(keys);
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) override {
    Timer t(*clock_, "multi_set");
    inner_->multiSet(keys, values);
  }
  void append(const std::string& key, const std::vector<uint8_t>& value) override {
    Timer t(*clock_, "append");
    inner_->append(key, value);
  }
  bool hasExtendedApi() const override {
    return inner_->hasExtendedApi();
  }
  const std::chrono::milliseconds& getTimeout() const noexcept override {
    return inner_->getTimeout();
  }
  void setTimeout(const std::chrono::milliseconds& timeout) override {
    inner_->setTimeout(timeout);
  }

 private:
  struct Timer {
    Timer(CallClock& c, const char* what, int64_t extraNs = 0) : c_(c) {
      std::lock_guard<std::mutex> lock(c_.mu);
      c_.sinceNs = steadyNs();
      c_.boundNs = c_.timeoutNs.load() + extraNs;
      c_.what = what;
    }
    ~Timer() {
      std::lock_guard<std::mutex> lock(c_.mu);
      c_.sinceNs = 0;
    }
    CallClock& c_;
  };

  c10::intrusive_ptr<c10d::Store> inner_;
  std::shared_ptr<CallClock> clock_;
};

// PrefixStore keeps its prefix protected; a pointer to member formed through a
// derived class reads it from any PrefixStore.
struct PrefixPeek : c10d::PrefixStore {
  static const std::string& prefixOf(const c10d::PrefixStore& s) {
    return s.*(&PrefixPeek::prefix_);
  }
};

struct Registry {
  struct Entry {
    c10d::Store* base;
    c10::intrusive_ptr<c10d::Store> keep;  // the address cannot be reused while the entry lives
    std::weak_ptr<StoreChannel> channel;
    c10::intrusive_ptr<c10d::Store> connection;
  };
  std::mutex mu;
  std::vector<Entry> entries;
};

Registry& registry() {
  static auto* r = new Registry();  // leaked: channels may outlive static destruction
  return *r;
}

}  // namespace

std::string StoreAddress::describe() const {
  if (!host.empty()) return "the store at " + host + ":" + std::to_string(port);
  return "the " + (kind.empty() ? std::string("store") : kind);
}

// --- the I/O thread ----------------------------------------------------------

struct StoreChannel::Impl {
  c10::intrusive_ptr<c10d::Store> connection;  // a TimedStore
  std::shared_ptr<CallClock> clock = std::make_shared<CallClock>();
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> jobs;
  bool jobRunning = false;
  std::atomic<StoreHealth> health{StoreHealth::Healthy};
  std::string reason;
  bool closing = false;
  bool quiescing = false;  // end the thread once the queue is empty
  std::thread thread;
  std::atomic<std::thread::id> threadId{};

  // mu held. Final: the first declaration wins.
  void declare(StoreHealth h, const std::string& why) {
    if (health.load() != StoreHealth::Healthy) return;
    reason = why;
    health.store(h);
    jobs.clear();  // they would only be refused
    cv.notify_all();
  }

  // mu held.
  bool overdue(int64_t now, std::string* why) {
    std::lock_guard<std::mutex> lock(clock->mu);
    if (clock->sinceNs == 0 || now - clock->sinceNs <= clock->boundNs) return false;
    if (why) {
      *why = std::string("no reply to ") + clock->what + " for " + seconds(now - clock->sinceNs) +
             " (a frozen or overloaded host?)";
    }
    return true;
  }

  // Runs store calls, turning a connection error into Lost. Any thread.
  CallStatus execute(const std::function<void()>& fn, std::string* error) {
    try {
      fn();
      return CallStatus::Ok;
    } catch (const c10::DistNetworkError& e) {
      *error = firstLine(e.what_without_backtrace());
      const char* what;
      {
        std::lock_guard<std::mutex> lock(clock->mu);
        what = clock->what;
      }
      std::lock_guard<std::mutex> lock(mu);
      declare(StoreHealth::Lost, networkWords(*error) + " during " + what);
      return CallStatus::Unavailable;
    } catch (const c10::Error& e) {
      *error = firstLine(e.what_without_backtrace());
    } catch (const std::exception& e) {
      *error = firstLine(e.what());
    }
    return CallStatus::Failed;
  }

  static void loop(const std::shared_ptr<Impl>& self) {
    pthread_setname_np(pthread_self(), "torch_ext_store");
    self->threadId.store(std::this_thread::get_id());
    std::unique_lock<std::mutex> lock(self->mu);
    while (true) {
      self->cv.wait(lock, [&] { return self->closing || self->quiescing || !self->jobs.empty(); });
      if (self->closing || (self->quiescing && self->jobs.empty())) return;
      auto job = std::move(self->jobs.front());
      self->jobs.pop_front();
      self->jobRunning = true;
      lock.unlock();
      try {
        job();
      } catch (const std::exception& e) {
        logMessage(LogLevel::Debug, std::string("guard: store job failed: ") + e.what());
      }
      lock.lock();
      self->jobRunning = false;
      self->cv.notify_all();
    }
  }
};

StoreChannel::StoreChannel(c10::intrusive_ptr<c10d::Store> connection, StoreAddress address,
                           std::chrono::milliseconds timeout)
    : impl_(std::make_shared<Impl>()), address_(std::move(address)) {
  impl_->clock->timeoutNs = toNs(timeout);
  impl_->connection = c10::make_intrusive<TimedStore>(std::move(connection), impl_->clock);
}

void StoreChannel::quiesce() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  if (!impl_->thread.joinable() || onIoThread()) return;
  impl_->quiescing = true;
  impl_->cv.notify_all();
  // The queue drains (jobs that are not stuck finish), then the thread ends.
  while ((impl_->jobRunning || !impl_->jobs.empty()) && !impl_->overdue(steadyNs(), nullptr) &&
         impl_->health.load() == StoreHealth::Healthy) {
    impl_->cv.wait_for(lock, kWaitSlice);
  }
  const bool stuck = impl_->jobRunning;
  std::thread t = std::move(impl_->thread);
  if (stuck) {
    impl_->quiescing = false;  // it ends where it is or never; a later call starts a new thread
    lock.unlock();
    t.detach();
    return;
  }
  impl_->jobs.clear();
  lock.unlock();
  t.join();
  lock.lock();
  impl_->quiescing = false;
}

StoreChannel::~StoreChannel() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->closing = true;
  impl_->jobs.clear();
  impl_->cv.notify_all();
  const bool self = std::this_thread::get_id() == impl_->threadId.load();
  // A job that is not stuck in an overdue call is let finish, so the thread
  // can be joined (no thread is left behind by destroy_process_group()).
  while (!self && impl_->jobRunning && !impl_->overdue(steadyNs(), nullptr)) {
    impl_->cv.wait_for(lock, kWaitSlice);
  }
  const bool stuck = impl_->jobRunning;
  std::thread t = std::move(impl_->thread);
  lock.unlock();
  {
    // Let go of the stores this channel was opened for.
    Registry& reg = registry();
    std::lock_guard<std::mutex> regLock(reg.mu);
    for (auto it = reg.entries.begin(); it != reg.entries.end();) {
      it = it->channel.expired() ? reg.entries.erase(it) : it + 1;
    }
  }
  if (t.joinable()) {
    if (stuck || self) {
      t.detach();  // blocked in a call to a frozen store (or this is it): it owns `impl_`
    } else {
      t.join();
    }
  }
}

bool StoreChannel::onIoThread() const {
  return std::this_thread::get_id() == impl_->threadId.load();
}

bool StoreChannel::post(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->closing || impl_->health.load() != StoreHealth::Healthy) return false;
  if (!impl_->thread.joinable()) impl_->thread = std::thread(&Impl::loop, impl_);
  impl_->jobs.push_back(std::move(job));
  impl_->cv.notify_all();
  return true;
}

CallStatus StoreChannel::run(const char* what, std::function<void()> fn, std::chrono::milliseconds maxWait,
                             std::string* error) {
  auto im = impl_;
  if (onIoThread()) {
    // From a job: the call runs here, timed like any other.
    if (im->closing || im->health.load() != StoreHealth::Healthy) {
      std::lock_guard<std::mutex> lock(im->mu);
      *error = im->reason.empty() ? "the store channel is closed" : im->reason;
      return CallStatus::Unavailable;
    }
    return im->execute(fn, error);
  }
  struct Done {
    bool done = false;
    CallStatus status = CallStatus::Unavailable;
    std::string error;
  };
  auto done = std::make_shared<Done>();
  {
    std::lock_guard<std::mutex> lock(im->mu);
    if (im->closing || im->health.load() != StoreHealth::Healthy) {
      *error = im->reason.empty() ? "the store channel is closed" : im->reason;
      return CallStatus::Unavailable;
    }
    if (!im->thread.joinable()) im->thread = std::thread(&Impl::loop, im);
    // Captured by value: a waiter that gives up may leave the call behind.
    im->jobs.push_back([im, done, fn = std::move(fn)] {
      std::string err;
      const CallStatus st = im->execute(fn, &err);
      std::lock_guard<std::mutex> lock(im->mu);
      done->done = true;
      done->status = st;
      done->error = std::move(err);
      im->cv.notify_all();
    });
    im->cv.notify_all();
  }
  const bool bounded = maxWait != std::chrono::milliseconds::max();
  const auto deadline =
      bounded ? std::chrono::steady_clock::now() + maxWait : std::chrono::steady_clock::time_point::max();
  std::unique_lock<std::mutex> lock(im->mu);
  while (!done->done) {
    im->cv.wait_for(lock, kWaitSlice);
    if (done->done) break;
    std::string why;
    if (im->health.load() == StoreHealth::Healthy && im->overdue(steadyNs(), &why)) {
      im->declare(StoreHealth::NotAnswering, why);
    }
    if (im->closing || im->health.load() != StoreHealth::Healthy) {
      *error = im->reason.empty() ? "the store channel is closed" : im->reason;
      return CallStatus::Unavailable;
    }
    if (bounded && std::chrono::steady_clock::now() > deadline) {
      *error = std::string("no reply to ") + what + " within " + std::to_string(maxWait.count()) + " ms";
      return CallStatus::Unavailable;
    }
  }
  *error = done->error;
  return done->status;
}

StoreHealth StoreChannel::health() {
  if (impl_->health.load() != StoreHealth::Healthy) return impl_->health.load();
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::string why;
  if (impl_->overdue(steadyNs(), &why)) impl_->declare(StoreHealth::NotAnswering, why);
  return impl_->health.load();
}

std::string StoreChannel::lossReason() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->reason;
}

std::chrono::milliseconds StoreChannel::timeout() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::nanoseconds(impl_->clock->timeoutNs.load()));
}

void StoreChannel::lowerTimeout(std::chrono::milliseconds timeout) {
  const int64_t ns = toNs(timeout);
  int64_t cur = impl_->clock->timeoutNs.load();
  while (ns < cur && !impl_->clock->timeoutNs.compare_exchange_weak(cur, ns)) {
  }
}

std::string StoreChannel::describeLoss() const {
  const StoreHealth h = impl_->health.load();
  if (h == StoreHealth::Healthy) return "";
  std::string who = address_.hostedBy.empty() ? "" : " (hosted by " + address_.hostedBy + ")";
  return address_.describe() + who + (h == StoreHealth::Lost ? " is gone: " : " does not answer: ") + lossReason();
}

void StoreChannel::close() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->closing = true;
  impl_->jobs.clear();
  impl_->cv.notify_all();
}

void StoreChannel::declareLost(const std::string& reason) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->declare(StoreHealth::Lost, reason);
}

StoreAddress StoreChannel::addressOf(const c10::intrusive_ptr<c10d::Store>& store) {
  c10::intrusive_ptr<c10d::Store> base = store;
  while (auto* p = dynamic_cast<c10d::PrefixStore*>(base.get())) base = p->getUnderlyingStore();
  StoreAddress a;
  if (auto* tcp = dynamic_cast<c10d::TCPStore*>(base.get())) {
    a.kind = "TCPStore";
    a.host = tcp->getHost();
    a.port = tcp->getPort();
  } else if (dynamic_cast<c10d::FileStore*>(base.get()) != nullptr) {
    a.kind = "FileStore";
  } else if (dynamic_cast<c10d::HashStore*>(base.get()) != nullptr) {
    a.kind = "HashStore";
  } else {
    a.kind = "store";
  }
  return a;
}

StoreChannel::Opened StoreChannel::direct(const c10::intrusive_ptr<c10d::Store>& store, StoreAddress address,
                                          std::chrono::milliseconds timeout) {
  Opened out;
  out.channel = std::make_shared<StoreChannel>(store, std::move(address), timeout);
  out.view = out.channel->impl_->connection;
  out.root = out.view;
  return out;
}

StoreChannel::Opened StoreChannel::open(const c10::intrusive_ptr<c10d::Store>& groupStore, StoreAddress address,
                                        std::chrono::milliseconds timeout) {
  // Prefixes from the outermost in; the base is the first non-prefix store.
  std::vector<std::string> prefixes;
  c10::intrusive_ptr<c10d::Store> base = groupStore;
  while (auto* p = dynamic_cast<c10d::PrefixStore*>(base.get())) {
    prefixes.push_back(PrefixPeek::prefixOf(*p));
    base = p->getUnderlyingStore();
  }
  Opened out;
  c10::intrusive_ptr<c10d::Store> connection;
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    for (auto it = reg.entries.begin(); it != reg.entries.end();) {
      if (it->channel.expired()) {
        it = reg.entries.erase(it);
        continue;
      }
      if (it->base == base.get()) {
        out.channel = it->channel.lock();
        connection = it->connection;
      }
      ++it;
    }
    if (out.channel) {
      out.channel->lowerTimeout(timeout);
    } else {
      c10::intrusive_ptr<c10d::Store> client = base;
      try {
        auto clone = base->clone();
        if (clone && clone.get() != base.get()) {
          clone->setTimeout(kCloneTimeout);
          client = clone;
        }
      } catch (const std::exception&) {
        // A store without clone(): share the user's connection (still timed).
      }
      out.channel = std::make_shared<StoreChannel>(client, std::move(address), timeout);
      connection = out.channel->impl_->connection;
      reg.entries.push_back(Registry::Entry{base.get(), base, out.channel, connection});
    }
  }
  out.view = connection;
  out.root = connection;
  for (auto it = prefixes.rbegin(); it != prefixes.rend(); ++it) {
    out.view = c10::make_intrusive<c10d::PrefixStore>(*it, out.view);
    out.rootPrefix += *it + "/";  // PrefixStore joins "<prefix>/<key>"; the innermost comes first
  }
  return out;
}

// --- GroupStore ----------------------------------------------------------------

namespace {

std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::string str(const std::vector<uint8_t>& v) {
  return std::string(v.begin(), v.end());
}

}  // namespace

GroupStore::GroupStore(std::shared_ptr<StoreChannel> channel, c10::intrusive_ptr<c10d::Store> view)
    : channel_(std::move(channel)), view_(std::move(view)) {}

GroupStore::GroupStore(std::shared_ptr<StoreChannel> channel, c10::intrusive_ptr<c10d::Store> view,
                       c10::intrusive_ptr<c10d::Store> root, std::string rootPrefix)
    : channel_(std::move(channel)),
      view_(std::move(view)),
      root_(std::move(root)),
      rootPrefix_(std::move(rootPrefix)) {}

std::string GroupStore::fullPrefix() const {
  return root_ ? rootPrefix_ + keys::kPrefix : std::string();
}

std::string GroupStore::full(const std::string& key) {
  return keys::kPrefix + key;
}

// Every lambda below captures by value: a call abandoned by its caller may
// still run on the I/O thread after the caller returned.

bool GroupStore::set(const std::string& key, const std::string& value, std::chrono::milliseconds maxWait) {
  ops_.fetch_add(1, std::memory_order_relaxed);
  return channel_
      ->call<bool>(
          "set",
          [view = view_, k = full(key), v = bytes(value)] {
            view->set(k, v);
            return true;
          },
          maxWait)
      .ok();
}

std::optional<std::string> GroupStore::get(const std::string& key) {
  ops_.fetch_add(2, std::memory_order_relaxed);
  auto r =
      channel_->call<std::optional<std::string>>("get", [view = view_, k = full(key)]() -> std::optional<std::string> {
        if (!view->check({k})) return std::nullopt;
        return str(view->get(k));
      });
  if (!r.ok()) return std::nullopt;
  return r.value;
}

StoreResult<bool> GroupStore::check(const std::vector<std::string>& keys) {
  ops_.fetch_add(1, std::memory_order_relaxed);
  std::vector<std::string> ks;
  for (const auto& k : keys) ks.push_back(full(k));
  return channel_->call<bool>("check", [view = view_, ks] { return view->check(ks); });
}

StoreResult<int64_t> GroupStore::add(const std::string& key, int64_t delta) {
  ops_.fetch_add(1, std::memory_order_relaxed);
  return channel_->call<int64_t>("add", [view = view_, k = full(key), delta] { return view->add(k, delta); });
}

StoreResult<std::string> GroupStore::compareSet(const std::string& key, const std::string& expected,
                                                const std::string& desired) {
  ops_.fetch_add(1, std::memory_order_relaxed);
  return channel_->call<std::string>("compare_set", [view = view_, k = full(key), e = bytes(expected),
                                                     d = bytes(desired)] { return str(view->compareSet(k, e, d)); });
}

StoreResult<std::vector<std::string>> GroupStore::multiGet(const std::vector<std::string>& keys) {
  ops_.fetch_add(1, std::memory_order_relaxed);
  std::vector<std::string> ks;
  for (const auto& k : keys) ks.push_back(full(k));
  return channel_->call<std::vector<std::string>>("multi_get", [view = view_, ks] {
    std::vector<std::string> out;
    for (const auto& v : view->multiGet(ks)) out.push_back(str(v));
    return out;
  });
}

StoreResult<bool> GroupStore::waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds wait) {
  ops_.fetch_add(1, std::memory_order_relaxed);
  std::vector<std::string> ks;
  for (const auto& k : keys) ks.push_back(full(k));
  // check() first: the common case (keys there) costs one round trip, and a
  // wait() that runs out costs torch's client a cancel round trip.
  return channel_->call<bool>("wait", [view = view_, ks, wait] {
    if (view->check(ks)) return true;
    try {
      view->wait(ks, wait);
      return true;
    } catch (const c10::DistNetworkError&) {
      throw;
    } catch (const c10::Error&) {
      return false;  // the wait ran out: the store answered, the keys are not there
    }
  });
}

void GroupStore::deleteKeys(const std::vector<std::string>& keys) {
  if (keys.empty()) return;
  ops_.fetch_add(keys.size(), std::memory_order_relaxed);
  std::vector<std::string> ks;
  for (const auto& k : keys) ks.push_back(full(k));
  channel_->call<bool>("delete_key", [view = view_, ks] {
    for (const auto& k : ks) view->deleteKey(k);
    return true;
  });
}

bool GroupStore::setRoot(const std::string& key, const std::string& value) {
  if (!root_) return false;
  ops_.fetch_add(1, std::memory_order_relaxed);
  return channel_
      ->call<bool>("set",
                   [root = root_, k = key, v = bytes(value)] {
                     root->set(k, v);
                     return true;
                   })
      .ok();
}

}  // namespace torch_ext
