// KeyedPick (issue 70): a one-element MAX or MIN of float32 or int32 among
// three or more ranks, carried as keys inside two int64 words that the ring
// reduces by an integer MAX. The ranks are simulated here: each one's words,
// their element-wise MAX (what gloo's integer MAX gives in any order), and
// the result read from it against gloo's own fold of the operands, written
// here as gloo/math.h and gloo/allreduce.cc compute it (std::max / std::min,
// own operand first, from the last rank down), independently of
// KeyedPick::fold.

#include "guard/modes/verify/KeyedPick.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <vector>

using torch_ext::KeyedPick;

namespace test_keyed_pick {

namespace {

float toFloat(uint32_t b) {
  float f = 0;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

uint32_t toBits(const float& f) {
  uint32_t b = 0;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// gloo's ring for one element (chunk 0): x_0 (op) (x_1 (op) (... (x_W-2 (op) x_W-1))).
uint32_t glooFold(const std::vector<uint32_t>& x, bool floating, bool min) {
  if (floating) {
    std::vector<float> v(x.size());
    for (size_t i = 0; i < x.size(); ++i) std::memcpy(&v[i], &x[i], 4);  // bits as they are, NaN payloads too
    const float* acc = &v.back();
    for (size_t r = v.size() - 1; r-- > 0;) acc = min ? &std::min(v[r], *acc) : &std::max(v[r], *acc);
    return toBits(*acc);
  }
  std::vector<int32_t> v(x.size());
  for (size_t i = 0; i < x.size(); ++i) v[i] = static_cast<int32_t>(x[i]);
  const int32_t* acc = &v.back();
  for (size_t r = v.size() - 1; r-- > 0;) acc = min ? &std::min(v[r], *acc) : &std::max(v[r], *acc);
  return static_cast<uint32_t>(*acc);
}

KeyedPick::Words reduce(const KeyedPick& k, const std::vector<uint32_t>& x, const std::vector<uint64_t>& rolling) {
  KeyedPick::Words m{std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::min()};
  for (size_t r = 0; r < x.size(); ++r) {
    const KeyedPick::Words w = k.words(x[r], static_cast<int>(r), rolling[r]);
    EXPECT_GE(w[0], 0);
    EXPECT_GE(w[1], 0);
    m[0] = std::max(m[0], w[0]);
    m[1] = std::max(m[1], w[1]);
  }
  return m;
}

// Operands where gloo's choice shows: both zeros, NaNs of both signs with
// payloads (a signalling one), infinities, the smallest and largest numbers.
const uint32_t kFloatSpecials[] = {0x00000000, 0x80000000, 0x7FC00001, 0xFFC00002, 0x7F800003, 0x7F800000, 0xFF800000,
                                   0x3F800000, 0xBF800000, 0x00000001, 0x80000001, 0x7F7FFFFF, 0xFF7FFFFF, 0x40200000};
const uint32_t kIntSpecials[] = {0x00000000, 0xFFFFFFFF, 0x80000000, 0x7FFFFFFF, 0x00000001, 0x80000001, 0x12345678};

c10d::ReduceOp opOf(bool min) {
  return min ? c10d::ReduceOp::MIN : c10d::ReduceOp::MAX;
}

// Whether the words may not tell the result: a NaN at a rank r* > 0 and
// the op's choice among the numbers (the lowest rank of a tie) at r* or behind.
bool undecidable(const std::vector<uint32_t>& x, bool min) {
  size_t first = x.size();
  for (size_t r = 0; r < x.size(); ++r) {
    if (std::isnan(toFloat(x[r]))) {
      first = r;
      break;
    }
  }
  if (first == 0 || first == x.size()) return false;
  std::vector<uint32_t> numbers;
  size_t best = x.size();
  for (size_t r = 0; r < x.size(); ++r) {
    if (std::isnan(toFloat(x[r]))) continue;
    if (best == x.size() || (min ? toFloat(x[r]) < toFloat(x[best]) : toFloat(x[best]) < toFloat(x[r]))) best = r;
  }
  return best > first;
}

}  // namespace

TEST(KeyedPick, PlansOneElementMaxAndMinOfFloat32AndInt32FromThreeRanks) {
  EXPECT_FALSE(KeyedPick::plan(at::kFloat, c10d::ReduceOp::MAX, 2).has_value());   // the pair exchange's
  EXPECT_FALSE(KeyedPick::plan(at::kDouble, c10d::ReduceOp::MAX, 3).has_value());  // no room beside 64 bits
  EXPECT_FALSE(KeyedPick::plan(at::kLong, c10d::ReduceOp::MIN, 3).has_value());
  EXPECT_FALSE(KeyedPick::plan(at::kFloat, c10d::ReduceOp::SUM, 3).has_value());
  EXPECT_EQ(KeyedPick::plan(at::kFloat, c10d::ReduceOp::MAX, 3)->bits(), 28);
  EXPECT_EQ(KeyedPick::plan(at::kFloat, c10d::ReduceOp::MIN, 4)->bits(), 27);
  EXPECT_EQ(KeyedPick::plan(at::kFloat, c10d::ReduceOp::MAX, 16383)->bits(), 16);
  EXPECT_FALSE(KeyedPick::plan(at::kFloat, c10d::ReduceOp::MAX, 16384).has_value());  // under kMinBits
  EXPECT_EQ(KeyedPick::plan(at::kInt, c10d::ReduceOp::MAX, 1 << 20)->bits(), 31);
}

TEST(KeyedPick, TheWordsGiveGloosResultOrSayTheyCannot) {
  std::mt19937 gen(7);
  int decided = 0;
  int exchanged = 0;
  for (int world : {3, 4, 5, 8, 9, 16, 33}) {
    for (bool floating : {true, false}) {
      for (bool min : {false, true}) {
        const auto k = KeyedPick::plan(floating ? at::kFloat : at::kInt, opOf(min), world);
        ASSERT_TRUE(k.has_value());
        const std::vector<uint64_t> rolling(world, 0x9E3779B97F4A7C15ull);
        for (int trial = 0; trial < 3000; ++trial) {
          std::vector<uint32_t> x(world);
          for (auto& v : x) {
            if (gen() % 3 == 0) {
              v = static_cast<uint32_t>(gen());  // anything, NaNs and denormals included
            } else if (floating) {
              v = kFloatSpecials[gen() % std::size(kFloatSpecials)];
            } else {
              v = kIntSpecials[gen() % std::size(kIntSpecials)];
            }
          }
          const KeyedPick::Words w = reduce(*k, x, rolling);
          ASSERT_TRUE(k->agree(w, rolling[0]));
          const uint32_t want = glooFold(x, floating, min);
          ASSERT_EQ(k->fold(x), want) << "world " << world;
          const std::optional<uint32_t> got = k->result(w);
          if (got) {
            ++decided;
            ASSERT_EQ(*got, want) << "world " << world << " floating " << floating << " min " << min;
          } else {
            ++exchanged;
            ASSERT_TRUE(floating && undecidable(x, min)) << "world " << world;
          }
        }
      }
    }
  }
  // Both cases came up (the draw is NaN-heavy: most operands are specials), the exchange's only where it must.
  EXPECT_GT(exchanged, 1000);
  EXPECT_GT(decided, 10000);
}

TEST(KeyedPick, EveryZeroAndNaNArrangementAtWorldThree) {
  // Every assignment of the specials to three ranks: 0 against -0 (the lowest
  // rank's kept), a NaN at rank 0 (kept) or behind it (dropped with what follows).
  for (bool min : {false, true}) {
    const auto k = KeyedPick::plan(at::kFloat, opOf(min), 3);
    for (uint32_t a : kFloatSpecials) {
      for (uint32_t b : kFloatSpecials) {
        for (uint32_t c : kFloatSpecials) {
          const std::vector<uint32_t> x{a, b, c};
          const KeyedPick::Words w = reduce(*k, x, {5, 5, 5});
          const uint32_t want = glooFold(x, true, min);
          const std::optional<uint32_t> got = k->result(w);
          EXPECT_EQ(got.value_or(k->fold(x)), want) << std::hex << a << " " << b << " " << c;
          EXPECT_EQ(got.has_value(), !undecidable(x, min)) << std::hex << a << " " << b << " " << c;
        }
      }
    }
  }
}

TEST(KeyedPick, ARankWithAnotherHashMakesEveryRankDisagree) {
  std::mt19937_64 gen(11);
  for (int world : {3, 4, 7}) {
    for (bool floating : {true, false}) {
      const auto k = KeyedPick::plan(floating ? at::kFloat : at::kInt, c10d::ReduceOp::MAX, world);
      for (int trial = 0; trial < 500; ++trial) {
        std::vector<uint64_t> rolling(world, gen());
        const int odd = static_cast<int>(gen() % world);
        rolling[odd] ^= uint64_t{1} << (63 - gen() % k->bits());  // a bit the words compare
        std::vector<uint32_t> x(world);
        for (auto& v : x) v = static_cast<uint32_t>(gen());
        const KeyedPick::Words w = reduce(*k, x, rolling);
        for (int r = 0; r < world; ++r) EXPECT_FALSE(k->agree(w, rolling[r])) << "world " << world << " rank " << r;
      }
    }
  }
}

}  // namespace test_keyed_pick
