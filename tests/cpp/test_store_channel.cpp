// StoreChannel / GroupStore: bounded store calls and health tracking, against a
// fault-injecting store (fail, block, slow). Timing bounds are generous (this
// machine is shared and slow); what matters is that nothing waits for long.
#include "guard/store/StoreChannel.h"

#include "guard/collective/Ledger.h"
#include "store_testing.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

using namespace torch_ext;
using std::chrono::milliseconds;

namespace test_store_channel {

namespace {

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Fixture {
  c10::intrusive_ptr<testkit::FaultyStore> faulty = c10::make_intrusive<testkit::FaultyStore>();
  std::shared_ptr<GroupStore> store =
      testkit::groupStore(faulty, milliseconds(300),
                          StoreAddress{"TCPStore", "10.0.0.1", 29500, "rank 0's process (plain env:// rendezvous)", 0});
};

}  // namespace

TEST(StoreChannel, HealthyCallsAnswerAndCount) {
  Fixture f;
  EXPECT_TRUE(f.store->set("a", "1"));
  EXPECT_EQ(f.store->get("a").value(), "1");
  EXPECT_FALSE(f.store->get("missing").has_value());
  auto n = f.store->add("n", 2);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n.value, 2);
  auto cs = f.store->compareSet("once", "", "me");
  ASSERT_TRUE(cs.ok());
  EXPECT_EQ(cs.value, "me");
  EXPECT_EQ(f.store->compareSet("once", "", "you").value, "me");  // first wins
  auto mg = f.store->multiGet({"a", "n"});
  ASSERT_TRUE(mg.ok());
  EXPECT_EQ(mg.value[0], "1");
  auto there = f.store->waitFor({"a"}, milliseconds(50));
  ASSERT_TRUE(there.ok());
  EXPECT_TRUE(there.value);
  auto notThere = f.store->waitFor({"never"}, milliseconds(50));
  ASSERT_TRUE(notThere.ok());  // the store answered: the wait ran out
  EXPECT_FALSE(notThere.value);
  f.store->deleteKeys({"a"});
  EXPECT_FALSE(f.store->get("a").has_value());
  EXPECT_EQ(f.store->health(), StoreHealth::Healthy);
  EXPECT_EQ(f.store->channel().describeLoss(), "");
  EXPECT_GT(f.store->ops(), 8u);
  // Keys live under "guard/".
  EXPECT_TRUE(f.faulty->check({"guard/n"}));
}

TEST(StoreChannel, ConnectionErrorDeclaresLostAtOnceAndFurtherCallsFailFast) {
  Fixture f;
  ASSERT_TRUE(f.store->set("a", "1"));
  f.faulty->setMode(testkit::FaultyStore::Mode::Fail);
  EXPECT_FALSE(f.store->set("a", "2"));
  EXPECT_EQ(f.store->health(), StoreHealth::Lost);
  EXPECT_EQ(f.store->channel().describeLoss(),
            "the store at 10.0.0.1:29500 (hosted by rank 0's process (plain env:// rendezvous)) is gone: connection "
            "reset during set");
  // Final: the store is not asked again, even once it would answer.
  f.faulty->setMode(testkit::FaultyStore::Mode::Pass);
  const uint64_t before = f.faulty->calls();
  EXPECT_EQ(f.store->add("n", 1).status, CallStatus::Unavailable);
  EXPECT_FALSE(f.store->get("a").has_value());
  EXPECT_EQ(f.faulty->calls(), before);
  EXPECT_EQ(f.store->health(), StoreHealth::Lost);
}

TEST(StoreChannel, ABlockedCallIsAbandonedAtItsBoundAndDeclaresNotAnswering) {
  Fixture f;
  f.faulty->setMode(testkit::FaultyStore::Mode::Block);
  auto t0 = std::chrono::steady_clock::now();
  auto r = f.store->add("n", 1);
  const double took = secondsSince(t0);
  EXPECT_EQ(r.status, CallStatus::Unavailable);
  EXPECT_GE(took, 0.29);
  EXPECT_LT(took, 2.0);  // the bound (0.3 s), not the blocked call
  EXPECT_EQ(f.store->health(), StoreHealth::NotAnswering);
  EXPECT_NE(f.store->channel().describeLoss().find("the store at 10.0.0.1:29500 (hosted by rank 0's process "
                                                   "(plain env:// rendezvous)) does not answer: no reply to add for"),
            std::string::npos)
      << f.store->channel().describeLoss();
  // Further calls fail at once, without queueing behind the stuck one.
  t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(f.store->set("x", "1"));
  EXPECT_LT(secondsSince(t0), 0.1);
  EXPECT_EQ(f.faulty->blocked(), 1);
  f.faulty->release();
}

TEST(StoreChannel, AStuckCallIsNoticedByHealthEvenWithoutAWaiter) {
  Fixture f;
  f.faulty->setMode(testkit::FaultyStore::Mode::Block);
  // A caller in another thread that is not the one asking health() (e.g. the
  // user's thread in a strict wait) is stuck; health() notices on its own.
  std::thread caller([&] { f.store->add("n", 1); });
  const auto t0 = std::chrono::steady_clock::now();
  while (f.store->health() == StoreHealth::Healthy && secondsSince(t0) < 5) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(f.store->health(), StoreHealth::NotAnswering);
  EXPECT_LT(secondsSince(t0), 2.0);
  caller.join();
  f.faulty->release();
}

TEST(StoreChannel, SlowButAnsweringStaysHealthy) {
  Fixture f;
  f.faulty->setMode(testkit::FaultyStore::Mode::Slow, milliseconds(100));  // a third of the bound
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(f.store->set("a", std::to_string(i)));
  EXPECT_EQ(f.store->health(), StoreHealth::Healthy);
  // A wait is bounded by the store's bound plus the wait itself.
  auto r = f.store->waitFor({"missing"}, milliseconds(400));
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(f.store->health(), StoreHealth::Healthy);
}

TEST(StoreChannel, DestroyingAChannelWithAStuckCallDoesNotBlock) {
  auto faulty = c10::make_intrusive<testkit::FaultyStore>();
  faulty->setMode(testkit::FaultyStore::Mode::Block);
  auto t0 = std::chrono::steady_clock::now();
  {
    auto store = testkit::groupStore(faulty, milliseconds(200));
    EXPECT_FALSE(store->set("a", "1"));
    EXPECT_EQ(store->health(), StoreHealth::NotAnswering);
  }  // the I/O thread is blocked in the call: detached, not joined
  EXPECT_LT(secondsSince(t0), 2.0);
  faulty->release();  // the detached thread ends with the call
  {
    // An idle channel's thread is joined.
    auto store = testkit::groupStore(c10::make_intrusive<c10d::HashStore>(), milliseconds(200));
    EXPECT_TRUE(store->set("a", "1"));
  }
}

TEST(StoreChannel, CloseReleasesWaitersAtOnceAndRefusesCalls) {
  auto faulty = c10::make_intrusive<testkit::FaultyStore>();
  auto store = testkit::groupStore(faulty, milliseconds(5000));
  faulty->setMode(testkit::FaultyStore::Mode::Block);
  const auto t0 = std::chrono::steady_clock::now();
  std::thread closer([&] {
    std::this_thread::sleep_for(milliseconds(100));
    store->channel().close();
  });
  // The waiter returns at the close, not at its 5 s bound (process exit never
  // waits on the store); the blocked call itself is left where it is.
  EXPECT_FALSE(store->set("a", "1"));
  closer.join();
  EXPECT_LT(secondsSince(t0), 2.0);
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_EQ(store->add("n", 1).status, CallStatus::Unavailable);
  EXPECT_LT(secondsSince(t1), 0.1);
  faulty->release();
}

TEST(StoreChannel, OpenSharesOneChannelPerStoreAndKeepsPrefixes) {
  auto base = c10::make_intrusive<c10d::HashStore>();
  auto g1 = c10::make_intrusive<c10d::PrefixStore>("default_pg", base);
  auto g2 = c10::make_intrusive<c10d::PrefixStore>("tp", c10::make_intrusive<c10d::PrefixStore>("outer", base));
  auto a = StoreChannel::open(g1, StoreAddress{}, milliseconds(3000));
  auto b = StoreChannel::open(g2, StoreAddress{}, milliseconds(1000));
  EXPECT_EQ(a.channel.get(), b.channel.get());
  EXPECT_EQ(a.channel->timeout(), milliseconds(1000));  // the smallest bound asked for
  GroupStore s1(a.channel, a.view);
  GroupStore s2(b.channel, b.view);
  ASSERT_TRUE(s1.set("st/0", "x"));
  ASSERT_TRUE(s2.set("st/0", "y"));
  // The same keys the group's own PrefixStore sees.
  EXPECT_TRUE(base->check({"default_pg/guard/st/0"}));
  EXPECT_TRUE(base->check({"outer/tp/guard/st/0"}));
  auto v = g2->get("guard/st/0");
  EXPECT_EQ(std::string(v.begin(), v.end()), "y");
  EXPECT_EQ(StoreChannel::addressOf(g2).kind, "HashStore");
  // What a client of the base store (torch-ext-diagnose live) spells for a group's key,
  // and setRoot writes outside every prefix.
  GroupStore r2(b.channel, b.view, b.root, b.rootPrefix);
  EXPECT_EQ(r2.fullPrefix(), "outer/tp/guard/");
  EXPECT_TRUE(base->check({r2.fullPrefix() + "st/0"}));
  ASSERT_TRUE(r2.setRoot("torch_ext/live", "{}"));
  EXPECT_TRUE(base->check({"torch_ext/live"}));
  EXPECT_EQ(s1.fullPrefix(), "");  // made without its base
  EXPECT_FALSE(s1.setRoot("torch_ext/live", "{}"));
  // Another store gets another channel.
  auto c = StoreChannel::open(c10::make_intrusive<c10d::HashStore>(), StoreAddress{}, milliseconds(1000));
  EXPECT_NE(c.channel.get(), a.channel.get());
}

TEST(StoreChannel, QuiesceEndsTheThreadAndALaterCallStartsItAgain) {
  auto store = testkit::groupStore(c10::make_intrusive<c10d::HashStore>(), milliseconds(1000));
  EXPECT_TRUE(store->set("a", "1"));
  store->channel().quiesce();
  EXPECT_EQ(store->get("a").value(), "1");  // a new thread
  store->channel().quiesce();
  store->channel().quiesce();  // idempotent
  EXPECT_EQ(store->health(), StoreHealth::Healthy);
}

}  // namespace test_store_channel
