// The stream gate's word and its host half (device/GateWord.h, device/StreamGate.h).
// The CUDA half runs in tests/python/test_stream_gate.py on a GPU (scripts/gpu.sh).

#include "guard/device/GateWord.h"
#include "guard/device/StreamGate.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

using torch_ext::device::GateVerdict;
using torch_ext::device::GateWord;
using torch_ext::device::StreamGate;

namespace test_stream_gate {

TEST(GateWord, ReleasePassesUpToTheVerifiedSeq) {
  const uint64_t w = GateWord::released(7);
  EXPECT_EQ(GateWord::decide(w, 6), GateVerdict::Pass);
  EXPECT_EQ(GateWord::decide(w, 7), GateVerdict::Pass);
  EXPECT_EQ(GateWord::decide(w, 8), GateVerdict::Wait);
  EXPECT_EQ(GateWord::decide(0, 1), GateVerdict::Wait);
}

TEST(GateWord, PoisonPassesTheEarlierAndPoisonsFromTheFirstBad) {
  const uint64_t w = GateWord::poisoned(5);
  EXPECT_TRUE(GateWord::isPoison(w));
  EXPECT_EQ(GateWord::decide(w, 4), GateVerdict::Pass);
  EXPECT_EQ(GateWord::decide(w, 5), GateVerdict::Poison);
  EXPECT_EQ(GateWord::decide(w, 1000), GateVerdict::Poison);
}

TEST(GateWord, PublishOnlyMovesForwardAndAPoisonIsFinal) {
  std::atomic<uint64_t> w{0};
  EXPECT_TRUE(GateWord::publish(w, GateWord::released(3)));
  EXPECT_FALSE(GateWord::publish(w, GateWord::released(2)));  // late, smaller release
  EXPECT_EQ(w.load(), 3u);
  EXPECT_TRUE(GateWord::publish(w, GateWord::poisoned(4)));
  EXPECT_FALSE(GateWord::publish(w, GateWord::released(10)));  // a round that ended after the failure
  EXPECT_FALSE(GateWord::publish(w, GateWord::poisoned(9)));   // the first poison stays
  EXPECT_EQ(w.load(), GateWord::poisoned(4));
}

TEST(GateWord, ConcurrentPublishersKeepTheLargestRelease) {
  std::atomic<uint64_t> w{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&w, t] {
      for (uint64_t s = 1; s <= 10000; ++s) GateWord::publish(w, GateWord::released(s * 4 + t));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(w.load(), 10000u * 4 + 3);
}

TEST(GateWord, PoisonFillPatterns) {
  using torch_ext::device::poisonFill;
  EXPECT_EQ(poisonFill(at::kFloat).width, 4u);
  EXPECT_EQ(poisonFill(at::kFloat).bits, 0x7fc00000u);
  EXPECT_EQ(poisonFill(at::kDouble).bits, 0x7ff8000000000000ull);
  EXPECT_EQ(poisonFill(at::kHalf).bits, 0x7e00u);
  EXPECT_EQ(poisonFill(at::kBFloat16).bits, 0x7fc0u);
  EXPECT_EQ(poisonFill(at::kLong).bits, 0x8000000000000000ull);
  EXPECT_EQ(poisonFill(at::kComplexFloat).width, 4u);  // each part a NaN
  EXPECT_EQ(poisonFill(at::kByte).bits & 0xff, 0xffu);
}

TEST(StreamGate, HostHoldsAreFilledOnlyFromTheFirstBad) {
  StreamGate gate;
  auto a = at::ones({4});
  auto b = at::ones({4});
  auto c = at::ones({3}, at::kInt);
  EXPECT_TRUE(gate.hold(1, {a}));
  EXPECT_TRUE(gate.hold(2, {b}));
  EXPECT_TRUE(gate.hold(3, {c}));
  gate.release(1);
  gate.poison(2);
  EXPECT_EQ(a.sum().item<float>(), 4.0f);
  EXPECT_TRUE(std::isnan(b[0].item<float>()));
  EXPECT_EQ(c[2].item<int>(), std::numeric_limits<int>::min());
  const auto s = gate.stats();
  EXPECT_EQ(s.hostHolds, 3u);
  EXPECT_EQ(s.poisoned, 2u);
  // Held after the verdict: passes, or is filled at once.
  auto d = at::ones({2});
  EXPECT_FALSE(gate.hold(1, {d}));
  EXPECT_TRUE(gate.hold(5, {d}));
  EXPECT_TRUE(std::isnan(d[1].item<float>()));
}

TEST(StreamGate, AFillWaitsForTheCollectivesOwnWrite) {
  auto gate = std::make_shared<StreamGate>();
  auto t = at::ones({4});
  auto landed = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
  EXPECT_TRUE(gate->hold(1, {t}, landed));
  gate->poison(1);
  EXPECT_EQ(t.sum().item<float>(), 4.0f);  // not yet: the collective has not written
  EXPECT_FALSE(gate->awaitHostPoison(std::chrono::milliseconds(1)));
  t.fill_(6.0f);  // the collective writes, then completes
  landed->markCompleted(c10::IValue(std::vector<at::Tensor>{t}));
  EXPECT_TRUE(gate->awaitHostPoison(std::chrono::milliseconds(1000)));
  EXPECT_TRUE(std::isnan(t[3].item<float>()));
}

TEST(StreamGate, NonDenseResultsAreHeldButNotFilled) {
  StreamGate gate;
  auto base = at::ones({4, 4});
  auto strided = base.slice(1, 0, 4, 2);  // every other column: not dense
  EXPECT_TRUE(gate.hold(1, {strided}));
  gate.poison(1);
  EXPECT_EQ(base.sum().item<float>(), 16.0f);
  EXPECT_FALSE(torch_ext::device::fillPoison(strided));
}

}  // namespace test_stream_gate
