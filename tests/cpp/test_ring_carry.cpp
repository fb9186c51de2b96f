// RingCarry (issue 70): where a small all_reduce among three or more ranks on
// gloo carries its check words so that every user element keeps the chunk of
// gloo's ring, and so the order of additions, that plain gloo gives it. gloo's
// layout is computed here as gloo/allreduce.cc computes it, independently of
// RingCarry::segment.

#include "guard/modes/verify/RingCarry.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

using torch_ext::RingCarry;

namespace test_ring_carry {

namespace {

int64_t roundUp(int64_t x, int64_t to) {
  return (x + to - 1) / to * to;
}

// The chunk (the rank the ring reduces it towards) of the element at `pos`
// in a buffer of `length` elements of `size` bytes: gloo's ring allreduce.
int64_t glooChunk(int64_t pos, int64_t length, int64_t size, int world) {
  const int64_t bytes = length * size, maxSegment = 1024 * 1024;
  const int64_t segments = roundUp(std::max((bytes + maxSegment - 1) / maxSegment, int64_t{2} * world), world);
  const int64_t segmentBytes = roundUp((bytes + segments - 1) / segments, size);
  return pos * size / segmentBytes / (segments / world);
}

int64_t chunksHoldingData(int64_t length, int64_t size, int world) {
  return glooChunk(length - 1, length, size, world) + 1;
}

const at::ScalarType kTypes[] = {at::kFloat, at::kDouble, at::kInt, at::kLong};
const c10d::ReduceOp::RedOpType kOps[] = {c10d::ReduceOp::SUM, c10d::ReduceOp::MAX, c10d::ReduceOp::MIN};

int64_t sizeOf(at::ScalarType t) {
  return (t == at::kFloat || t == at::kInt) ? 4 : 8;
}

}  // namespace

TEST(RingCarry, EveryUserElementKeepsTheChunkPlainGlooGivesIt) {
  int planned = 0;
  for (int world : {2, 3, 4, 5, 8, 9}) {
    for (int64_t n = 1; n <= 20 * world; ++n) {
      for (auto type : kTypes) {
        for (auto op : kOps) {
          const std::optional<RingCarry> c = RingCarry::plan(n, type, op, world);
          ASSERT_TRUE(c.has_value()) << "world " << world << " n " << n;
          ++planned;
          const int64_t size = sizeOf(type);
          std::set<int64_t> taken;
          for (int64_t e = 0; e < n; ++e) {
            ASSERT_LT(c->at(e), c->length());
            ASSERT_EQ(glooChunk(c->at(e), c->length(), size, world), glooChunk(e, n, size, world))
                << "world " << world << " n " << n << " element " << e;
            taken.insert(c->at(e));
          }
          for (int64_t w : c->wordAt()) {
            ASSERT_LT(w, c->length());
            ASSERT_TRUE(taken.insert(w).second) << "a word on an element: world " << world << " n " << n;
          }
          ASSERT_GE(c->bits(), RingCarry::kMinBits);
          // At most one chunk more holds data than plain gloo's (what the ring pays for).
          ASSERT_LE(chunksHoldingData(c->length(), size, world), chunksHoldingData(n, size, world) + 1);
        }
      }
    }
  }
  EXPECT_GT(planned, 1000);
}

TEST(RingCarry, TheCheapestLayoutsForALossAFlagAndFullChunks) {
  // float32[1] SUM at world 3: one word beside it, in the same chunk (21 bits).
  auto one = RingCarry::plan(1, at::kFloat, c10d::ReduceOp::SUM, 3);
  ASSERT_TRUE(one.has_value());
  EXPECT_EQ(one->length(), 2);
  EXPECT_EQ(one->bits(), 21);
  // float64[1]: one word of 50 bits.
  EXPECT_EQ(RingCarry::plan(1, at::kDouble, c10d::ReduceOp::SUM, 4)->bits(), 50);
  // float32[2] fills its chunk: one word in the next chunk's first segment (21 bits), not two
  // words over both its segments (a segment holding data costs the ring a step).
  auto two = RingCarry::plan(2, at::kFloat, c10d::ReduceOp::SUM, 3);
  EXPECT_EQ(two->length(), 3);
  EXPECT_EQ(two->bits(), 21);
  // MAX needs a pair: the next chunk.
  EXPECT_EQ(RingCarry::plan(1, at::kFloat, c10d::ReduceOp::MAX, 3)->length(), 3);
  // float32[16] at world 3: segments of 3, two places free in the last chunk.
  auto sixteen = RingCarry::plan(16, at::kFloat, c10d::ReduceOp::SUM, 3);
  EXPECT_EQ(sixteen->length(), 18);
  EXPECT_EQ(sixteen->bits(), 42);
  // float32[16] at world 4: every chunk full, so each segment grows by one.
  auto full = RingCarry::plan(16, at::kFloat, c10d::ReduceOp::SUM, 4);
  EXPECT_EQ(full->length(), 24);
  EXPECT_EQ(full->at(4), 6);
  EXPECT_GE(full->bits(), 62);
  // A full last chunk where used chunks x (m + 1) > W x m (with one-element segments, more than half
  // of them in use): each segment grows by one over those chunks only, and no chunk more holds data
  // (float32[4] at world 3: 1.34x gloo with a chunk more).
  for (auto [n, world, length] : {std::tuple<int64_t, int, int64_t>{4, 3, 8}, {6, 4, 12}, {12, 4, 18}, {10, 8, 20}}) {
    auto g = RingCarry::plan(n, at::kFloat, c10d::ReduceOp::SUM, world);
    ASSERT_TRUE(g.has_value());
    EXPECT_EQ(g->length(), length) << n << " at world " << world;
    EXPECT_EQ(chunksHoldingData(g->length(), 4, world), chunksHoldingData(n, 4, world)) << n << " at world " << world;
  }
  // Elsewhere the grown segments would spread into other chunks (float32[8] at world 3: two of three
  // chunks in use, but segments of two elements); one chunk more instead.
  for (auto [n, world] : {std::pair<int64_t, int>{2, 3}, {2, 4}, {4, 4}, {8, 3}}) {
    auto g = RingCarry::plan(n, at::kFloat, c10d::ReduceOp::SUM, world);
    ASSERT_TRUE(g.has_value());
    EXPECT_EQ(chunksHoldingData(g->length(), 4, world), chunksHoldingData(n, 4, world) + 1)
        << n << " at world " << world;
  }
  // AVG of a floating type; not of an integer one, nor other dtypes and ops.
  EXPECT_TRUE(RingCarry::plan(4, at::kFloat, c10d::ReduceOp::AVG, 3).has_value());
  EXPECT_FALSE(RingCarry::plan(4, at::kLong, c10d::ReduceOp::AVG, 3).has_value());
  EXPECT_FALSE(RingCarry::plan(4, at::kHalf, c10d::ReduceOp::SUM, 3).has_value());
  EXPECT_FALSE(RingCarry::plan(4, at::kFloat, c10d::ReduceOp::PRODUCT, 3).has_value());
  // Past gloo's 1 MiB segments (more than 2W of them): not modelled.
  EXPECT_TRUE(RingCarry::plan(4 * 1024 * 1024 / 4, at::kFloat, c10d::ReduceOp::SUM, 3).has_value());
  EXPECT_FALSE(RingCarry::plan(1024 * 1024, at::kDouble, c10d::ReduceOp::SUM, 3).has_value());
}

// The ring's reduction of one element over `world` ranks' values, in the type's
// own arithmetic, towards rank `c` (x_c + (x_c+1 + (...))).
template <typename T>
T ringReduce(const std::vector<T>& x, int c, c10d::ReduceOp::RedOpType op) {
  const int w = static_cast<int>(x.size());
  T acc = x[(c + w - 1) % w];
  for (int k = w - 2; k >= 0; --k) {
    const T own = x[(c + k) % w];
    if (op == c10d::ReduceOp::SUM) acc = own + acc;
    if (op == c10d::ReduceOp::MAX) acc = std::max(own, acc);
    if (op == c10d::ReduceOp::MIN) acc = std::min(own, acc);
  }
  return acc;
}

template <typename T>
bool verdict(const RingCarry& c, const std::vector<uint64_t>& hashes, int reader, c10d::ReduceOp::RedOpType op,
             bool avg = false) {
  const int world = static_cast<int>(hashes.size());
  std::vector<std::vector<double>> words;
  for (uint64_t h : hashes) words.push_back(c.words(h));
  std::vector<double> reduced(words[0].size());
  for (size_t i = 0; i < reduced.size(); ++i) {
    std::vector<T> x;
    for (int r = 0; r < world; ++r) x.push_back(static_cast<T>(words[r][i]));
    T r = ringReduce<T>(x, static_cast<int>(i) % world, op);
    if (avg) r /= static_cast<T>(world);  // gloo's AVG: the sum, divided in the type
    reduced[i] = static_cast<double>(r);
  }
  return c.agree(reduced, hashes[reader]);
}

TEST(RingCarry, WordsAgreeExactlyWhenEveryRankCarriedTheSameHash) {
  std::mt19937_64 rng(7);
  for (int world : {3, 4, 8}) {
    for (auto op : kOps) {
      auto f = *RingCarry::plan(1 + world, at::kFloat, op, world);
      auto d = *RingCarry::plan(3, at::kDouble, op, world);
      auto i32 = *RingCarry::plan(world - 1, at::kInt, op, world);
      auto i64 = *RingCarry::plan(5, at::kLong, op, world);
      int falsePasses = 0;
      for (int trial = 0; trial < 200; ++trial) {
        std::vector<uint64_t> same(world, rng());
        EXPECT_TRUE(verdict<float>(f, same, trial % world, op));
        EXPECT_TRUE(verdict<double>(d, same, trial % world, op));
        EXPECT_TRUE(verdict<int32_t>(i32, same, trial % world, op));
        EXPECT_TRUE(verdict<int64_t>(i64, same, trial % world, op));
        std::vector<uint64_t> differ = same;
        differ[trial % world] = rng();
        for (int reader = 0; reader < world; ++reader) {
          falsePasses += verdict<float>(f, differ, reader, op) + verdict<double>(d, differ, reader, op) +
                         verdict<int32_t>(i32, differ, reader, op) + verdict<int64_t>(i64, differ, reader, op);
        }
      }
      EXPECT_EQ(falsePasses, 0) << "world " << world;
    }
    // AVG: the summed words come back divided by W, exactly the word when every rank carried it.
    auto avg = *RingCarry::plan(2, at::kFloat, c10d::ReduceOp::AVG, world);
    int falsePasses = 0, uncarried = 0;
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<uint64_t> same(world, rng());
      EXPECT_TRUE(verdict<float>(avg, same, 0, c10d::ReduceOp::SUM, /*avg=*/true));
      uncarried += (trial % 64) < 64 - avg.bits() ? world : 0;
      std::vector<uint64_t> differ = same;
      differ[trial % world] ^= uint64_t{1} << (trial % 64);  // one bit apart: the smallest difference
      for (int reader = 0; reader < world; ++reader) {
        falsePasses += verdict<float>(avg, differ, reader, c10d::ReduceOp::SUM, /*avg=*/true);
      }
    }
    // The words carry the rolling hash's top bits() bits: a flip below them passes this collective
    // (the next one's hash differs everywhere); every flip they carry is told apart, by every rank.
    EXPECT_EQ(falsePasses, uncarried) << "world " << world;
  }
}

TEST(RingCarry, AReduceScattersChunkComesBackFromItsPlaceInTheCarriedLayout) {
  const int world = 3;
  const int64_t n = 5;  // per rank: 15 elements, segments of 3, every chunk full: widened
  auto c = *RingCarry::plan(world * n, at::kFloat, c10d::ReduceOp::SUM, world);
  at::Tensor input = at::arange(1, world * n + 1, at::kFloat);
  at::Tensor carried = at::empty({c.length()}, at::kFloat);
  c.pack(input, carried, 42);
  for (int rank = 0; rank < world; ++rank) {
    at::Tensor out = at::zeros({n}, at::kFloat);
    c.unpack(carried, out, rank * n);
    EXPECT_TRUE(at::equal(out, input.slice(0, rank * n, (rank + 1) * n))) << rank;
  }
}

TEST(RingCarry, PackThenUnpackGivesTheElementsBackAndTheWordsApart) {
  // appended, the next chunk, widened segments over the used chunks (6) and over all (16, 24 at world 4)
  for (int64_t n : {1, 5, 6, 16, 24}) {
    auto c = *RingCarry::plan(n, at::kFloat, c10d::ReduceOp::SUM, 4);
    at::Tensor user = at::arange(1, n + 1, at::kFloat);
    at::Tensor carried = at::empty({c.length()}, at::kFloat);
    c.pack(user, carried, 0x1234567890abcdefull);
    at::Tensor back = at::zeros({n}, at::kFloat);
    const std::vector<double> words = c.unpack(carried, back);
    EXPECT_TRUE(at::equal(back, user)) << n;
    EXPECT_EQ(words, c.words(0x1234567890abcdefull)) << n;
    // Everything else is 0.
    EXPECT_EQ(
        carried.sum().item<double>(), user.sum().item<double>() +
                                          [&] {
                                            double s = 0;
                                            for (double w : words) s += w;
                                            return s;
                                          }())
        << n;
  }
}

}  // namespace test_ring_carry
