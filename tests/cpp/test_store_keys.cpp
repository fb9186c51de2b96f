// Store keys: leaving a group removes every kind of key the group wrote.
//
// StoreKeys.h lists the guard's keys and their lifetimes: st/, leave, alerts,
// alert/, once/, report/ and snap/ live until the last rank leaves the group
// (Watchdog::leaveGroup, reached from Watchdog::remove, which is what
// destroy_process_group calls); strict/ and p2p/ keys are deleted by their
// readers. Three ranks in one process, each with its own GroupState and store
// channel over one shared in-memory store, write every kind (an incident, a
// strict exchange, a p2p print) and then leave; the store must hold no guard
// key afterwards. The store records every key written, so the test also fails
// if a kind is never exercised, or if a kind appears that it does not know.
#include "guard/collective/StoreExchange.h"
#include "guard/modes/strict/StrictExchange.h"
#include "guard/store/StoreKeys.h"
#include "guard/watchdog/Watchdog.h"

#include "store_testing.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <algorithm>
#include <vector>

using namespace torch_ext;
using std::chrono::milliseconds;

namespace test_store_keys {

namespace {

// A HashStore that records every key written (set, add, compare-set, ...) and
// every key deleted, with the phase of the test it happened in.
class RecordingStore : public c10d::Store {
 public:
  c10::intrusive_ptr<c10d::Store> clone() override {
    return c10::intrusive_ptr<c10d::Store>::unsafe_reclaim_from_nonowning(this);
  }
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    inner_->set(key, value);
    wrote(key);
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto out = inner_->compareSet(key, expected, desired);
    if (inner_->check({key})) wrote(key);
    return out;
  }
  std::vector<uint8_t> get(const std::string& key) override {
    return inner_->get(key);
  }
  int64_t add(const std::string& key, int64_t value) override {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t out = inner_->add(key, value);
    wrote(key);
    return out;
  }
  bool deleteKey(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    deleted_[phase_].push_back(key);
    cv_.notify_all();
    return inner_->deleteKey(key);
  }
  bool check(const std::vector<std::string>& keys) override {
    return inner_->check(keys);
  }
  int64_t getNumKeys() override {
    return inner_->getNumKeys();
  }
  void wait(const std::vector<std::string>& keys) override {
    inner_->wait(keys);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    inner_->wait(keys, timeout);
  }
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override {
    return inner_->multiGet(keys);
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) override {
    std::lock_guard<std::mutex> lock(mu_);
    inner_->multiSet(keys, values);
    for (const auto& k : keys) wrote(k);
  }
  void append(const std::string& key, const std::vector<uint8_t>& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    inner_->append(key, value);
    wrote(key);
  }
  bool hasExtendedApi() const override {
    return true;
  }

  // The keys the store holds now (from the store itself, not from the record).
  std::vector<std::string> keysNow() {
    return inner_->listKeys();
  }
  std::vector<std::string> written() {
    std::lock_guard<std::mutex> lock(mu_);
    return {written_.begin(), written_.end()};
  }
  std::vector<std::string> deletedIn(const std::string& phase) {
    std::lock_guard<std::mutex> lock(mu_);
    return deleted_[phase];
  }
  void setPhase(const std::string& phase) {
    std::lock_guard<std::mutex> lock(mu_);
    phase_ = phase;
  }
  // Waits until pred(written keys) holds; false after `timeout`.
  bool waitWritten(const std::function<bool(const std::set<std::string>&)>& pred, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return pred(written_); });
  }

 private:
  void wrote(const std::string& key) {
    written_.insert(key);
    cv_.notify_all();
  }

  c10::intrusive_ptr<c10d::HashStore> inner_ = c10::make_intrusive<c10d::HashStore>();
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> written_;
  std::map<std::string, std::vector<std::string>> deleted_;
  std::string phase_ = "run";
};

std::string full(const std::string& key) {
  return std::string(keys::kPrefix) + key;
}

// A guard key's kind: "st/", "alert/", ... for keys with a part after a
// slash, the whole name ("leave", "alerts") otherwise.
std::string kindOf(const std::string& fullKey) {
  const std::string k = fullKey.substr(std::string(keys::kPrefix).size());
  const auto slash = k.find('/');
  return slash == std::string::npos ? k : k.substr(0, slash + 1);
}

// Every kind StoreKeys.h defines, spelled through its own functions.
std::set<std::string> allKinds() {
  return {kindOf(full(keys::status(0))),        kindOf(full(keys::kLeave)),
          kindOf(full(keys::kAlerts)),          kindOf(full(keys::alert(1))),
          kindOf(full(keys::once("hang:1"))),   kindOf(full(keys::report("hang:1"))),
          kindOf(full(keys::snapshot("x", 0))), kindOf(full(keys::strictPrint(1, 0))),
          kindOf(full(keys::strictDone(1))),    kindOf(full(keys::p2pPrint(0, 1, 0, 1)))};
}

std::vector<std::string> guardKeys(const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  for (const auto& k : keys) {
    if (k.rfind(keys::kPrefix, 0) == 0) out.push_back(k);
  }
  return out;
}

std::vector<std::string> ofKind(const std::vector<std::string>& keys, const std::string& kind) {
  std::vector<std::string> out;
  for (const auto& k : keys) {
    if (k.rfind(keys::kPrefix, 0) == 0 && kindOf(k) == kind) out.push_back(k);
  }
  return out;
}

std::string listed(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) out += " " + k;
  return out.empty() ? " (none)" : out;
}

Fingerprint allReduce(int64_t n) {
  return FingerprintBuilder(Op::AllReduce)
      .meta(at::kFloat, {n}, c10::DeviceType::CPU)
      .reduceOp(c10d::ReduceOp(c10d::ReduceOp::SUM))
      .finish();
}

constexpr int kSize = 3;

}  // namespace

TEST(StoreKeys, LeavingTheGroupRemovesEveryKindOfKeyItWrote) {
  auto store = c10::make_intrusive<RecordingStore>();
  std::vector<std::shared_ptr<GroupState>> ranks;
  for (int r = 0; r < kSize; ++r) {
    Config cfg;
    cfg.intervalS = 0.05;  // exchanges every 50 ms: the incident goes round quickly
    ranks.push_back(std::make_shared<GroupState>(GroupIdentity{"0", r, kSize, {}}, cfg,
                                                 testkit::groupStore(store, milliseconds(5000)), milliseconds(60000)));
    // The same collective pending everywhere: ring checks agree, and the
    // incident below has something to report.
    uint64_t seq = 0;
    ranks[r]->ledger().record(allReduce(8), 0, &seq);
  }
  for (auto& st : ranks) Watchdog::instance().add(st);
  // From here every exit path must remove the groups, or later tests see them.
  struct Remover {
    std::vector<std::shared_ptr<GroupState>>* ranks;
    std::set<int> left;
    void leave(int r) {
      if (left.insert(r).second) Watchdog::instance().remove((*ranks)[r]);
    }
    ~Remover() {
      for (int r = 0; r < kSize; ++r) leave(r);
    }
  } remover{&ranks, {}};

  const auto bound = milliseconds(20000);  // generous: a bug fails, it does not hang
  // 1. Every rank publishes its status (st/).
  ASSERT_TRUE(store->waitWritten(
      [](const auto& w) {
        for (int r = 0; r < kSize; ++r) {
          if (!w.count(full(keys::status(r)))) return false;
        }
        return true;
      },
      bound))
      << "statuses written:" << listed(ofKind(store->written(), "st/"));

  // 2. An incident (once/, alerts, alert/, snap/ from every rank, report/).
  const Incident inc{IncidentKind::Hang, IncidentSubject::collective(1), 0, ""};
  Watchdog::instance().requestIncident(ranks[0], inc);
  ASSERT_TRUE(store->waitWritten(
      [&](const auto& w) {
        for (int r = 0; r < kSize; ++r) {
          if (!w.count(full(keys::snapshot(inc.id(), r)))) return false;
        }
        return w.count(full(keys::report(inc.id()))) > 0;
      },
      bound))
      << "incident keys written:" << listed(store->written());

  // 3. A strict exchange (strict/<seq>/<rank>, strict/<seq>/done): every rank
  // at once, as after a check collective that saw different hashes. Its
  // readers delete the keys: none is left, before anyone leaves.
  {
    std::vector<std::vector<RankOp>> seen(kSize);
    std::vector<std::thread> threads;
    for (int r = 0; r < kSize; ++r) {
      threads.emplace_back([&, r] {
        OpWords mine;
        mine.text = allReduce(8 + r).describe();
        mine.where = "train.py:" + std::to_string(r);
        seen[r] = exchangeStrictFingerprints(*ranks[r], mine, 7);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < kSize; ++r) {
      ASSERT_EQ(seen[r].size(), static_cast<size_t>(kSize));
      EXPECT_EQ(seen[r][2].text, "all_reduce(float32[10], SUM)");  // every rank read every print
    }
  }
  // 4. A p2p print (p2p/<src>/<dst>/<tag>/<ordinal>): the receiver deletes it.
  const std::string printKey = keys::p2pPrint(0, 1, 5, 1);
  OpWords print;
  print.text = "send(float32[4], dst=1, tag=5)";
  print.where = "train.py:9";
  print.hash = 42;
  ASSERT_TRUE(publishP2PPrint(*ranks[0], printKey, print));
  const OpWords got = awaitP2PPrint(*ranks[1], printKey, "recv");
  EXPECT_EQ(got.hash, 42u);
  EXPECT_EQ(got.where, "train.py:9");
  EXPECT_EQ(got.text, "send(float32[4], dst=1, tag=5)");

  const std::vector<std::string> beforeLeave = guardKeys(store->keysNow());
  EXPECT_TRUE(ofKind(beforeLeave, "strict/").empty()) << "strict keys left by their readers:" << listed(beforeLeave);
  EXPECT_TRUE(ofKind(beforeLeave, "p2p/").empty()) << "p2p keys left by their reader:" << listed(beforeLeave);
  for (const std::string kind : {"st/", "alerts", "alert/", "once/", "report/", "snap/"}) {
    EXPECT_FALSE(ofKind(beforeLeave, kind).empty()) << kind << " keys are gone before anyone left";
  }

  // 5. Ranks 0 and 1 leave (at once): the keys stay for rank 2, which may
  // still be reading the verdict.
  store->setPhase("leave");
  {
    std::thread a([&] { remover.leave(0); });
    std::thread b([&] { remover.leave(1); });
    a.join();
    b.join();
  }
  const std::vector<std::string> twoLeft = guardKeys(store->keysNow());
  EXPECT_FALSE(ofKind(twoLeft, "report/").empty()) << "a rank that left took the verdict away:" << listed(twoLeft);
  EXPECT_EQ(ofKind(twoLeft, "st/").size(), static_cast<size_t>(kSize)) << listed(twoLeft);
  EXPECT_EQ(ofKind(twoLeft, "leave").size(), 1u) << listed(twoLeft);

  // 6. The last rank leaves: no guard key is left.
  remover.leave(2);
  const std::vector<std::string> after = guardKeys(store->keysNow());
  EXPECT_TRUE(after.empty()) << "keys left after every rank left:" << listed(after);
  EXPECT_EQ(store->getNumKeys(), 0);

  // Every kind of key was written at least once, and no kind this test does not know.
  std::set<std::string> kindsWritten;
  for (const auto& k : store->written()) {
    if (k.rfind(keys::kPrefix, 0) == 0) kindsWritten.insert(kindOf(k));
  }
  EXPECT_EQ(kindsWritten, allKinds());
  // strict/ and p2p/ keys are their readers' to delete: leaving does not touch them.
  const std::vector<std::string> deletedAtLeave = store->deletedIn("leave");
  EXPECT_TRUE(ofKind(deletedAtLeave, "strict/").empty()) << listed(deletedAtLeave);
  EXPECT_TRUE(ofKind(deletedAtLeave, "p2p/").empty()) << listed(deletedAtLeave);
  EXPECT_FALSE(ofKind(store->deletedIn("run"), "strict/").empty());
  EXPECT_FALSE(ofKind(store->deletedIn("run"), "p2p/").empty());
}

// The alert record and the live request's ranks: one encoder and decoder each,
// which the live asker (torch_ext/diagnose/live.py) uses through _C.
TEST(StoreKeys, AlertRecordsRoundTripAndMalformedOnesAreRefused) {
  const keys::AlertRecord live{"live:host-1-2", -1, "0-3,7"};
  EXPECT_EQ(live.encode(), "live:host-1-2\n-1\n0-3,7");
  const auto back = keys::AlertRecord::decode(live.encode());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->id, "live:host-1-2");
  EXPECT_EQ(back->poster, -1);
  EXPECT_EQ(back->body, "0-3,7");
  // An error text may span lines: the body is everything after the second newline.
  const auto err = keys::AlertRecord::decode("failure:4\n2\nConnection closed\nby peer");
  ASSERT_TRUE(err);
  EXPECT_EQ(err->poster, 2);
  EXPECT_EQ(err->body, "Connection closed\nby peer");
  EXPECT_FALSE(keys::AlertRecord::decode("hang:3\n1"));
  EXPECT_FALSE(keys::AlertRecord::decode("hang:3\nx\n"));
  EXPECT_FALSE(keys::AlertRecord::decode("hang:3\n\n"));
}

TEST(StoreKeys, RankSpecsAreReadAsTheyAreWritten) {
  EXPECT_EQ(keys::rankSpec({}), "");
  EXPECT_EQ(keys::rankSpec({7, 0, 1, 2, 3, 3}), "0-3,7");
  EXPECT_EQ(keys::rankSpec({5}), "5");
  const std::vector<int64_t> asked{0, 1, 2, 9, 11, 12};
  const std::string spec = keys::rankSpec(asked);
  for (int64_t r = 0; r < 16; ++r) {
    const bool in = std::find(asked.begin(), asked.end(), r) != asked.end();
    EXPECT_EQ(keys::specAsks(spec, r), in) << spec << " rank " << r;
  }
}

}  // namespace test_store_keys
