// InBandCheck (issue 40): the check words a small all_reduce carries, and the
// reading of their reduced values. The reduction is done here by hand, as the
// inner backend would do it over W ranks.

#include "guard/modes/verify/InBandCheck.h"
#include "guard/modes/verify/PairExchange.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

using torch_ext::InBandCheck;
using torch_ext::PairExchange;

namespace test_in_band_check {

namespace {

std::vector<double> reduce(const std::vector<std::vector<double>>& ranks, c10d::ReduceOp op) {
  std::vector<double> out = ranks[0];
  for (size_t r = 1; r < ranks.size(); ++r) {
    for (size_t i = 0; i < out.size(); ++i) {
      if (op == c10d::ReduceOp::SUM) out[i] += ranks[r][i];
      if (op == c10d::ReduceOp::MAX) out[i] = std::max(out[i], ranks[r][i]);
      if (op == c10d::ReduceOp::MIN) out[i] = std::min(out[i], ranks[r][i]);
    }
  }
  return out;
}

}  // namespace

TEST(InBandCheck, AgreesExactlyWhenEveryRankHasTheSameHash) {
  for (auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::MAX, c10d::ReduceOp::MIN}) {
    for (int world : {2, 3, 8}) {
      const uint64_t h = 0x9e3779b97f4a7c15ull;
      std::vector<std::vector<double>> same(world, InBandCheck::encode(h, op));
      EXPECT_TRUE(InBandCheck::agree(reduce(same, op), op, world));
      // One rank one bit off, in the lowest and the highest bit alike.
      for (uint64_t flip : {uint64_t{1}, uint64_t{1} << 63}) {
        auto one = same;
        one[world - 1] = InBandCheck::encode(h ^ flip, op);
        EXPECT_FALSE(InBandCheck::agree(reduce(one, op), op, world)) << "op " << int(op) << " world " << world;
      }
      // Every rank different.
      std::vector<std::vector<double>> all;
      for (int r = 0; r < world; ++r) all.push_back(InBandCheck::encode(h + r, op));
      EXPECT_FALSE(InBandCheck::agree(reduce(all, op), op, world));
    }
  }
}

TEST(InBandCheck, CarriedOnlyWhereTheResultStaysExactAndTheWordsCheap) {
  const auto sum = c10d::ReduceOp::SUM;
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  EXPECT_EQ(InBandCheck::words({at::ones({1}, i64)}, sum, 2), 64);
  EXPECT_EQ(InBandCheck::words({at::ones({1}, at::kInt)}, sum, 2), 64);
  EXPECT_EQ(InBandCheck::words({at::ones({4}, i64)}, c10d::ReduceOp::MAX, 4), 128);
  // Floating types: the carried layout changes the inner backend's order of
  // additions (and which of a NaN and a number, 0 and -0, a MAX keeps).
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    EXPECT_EQ(InBandCheck::words({at::ones({4}, dtype)}, sum, 3), 0);
    EXPECT_EQ(InBandCheck::words({at::ones({4}, dtype)}, c10d::ReduceOp::MAX, 2), 0);
    EXPECT_FALSE(InBandCheck::compact({at::ones({1}, dtype)}, sum, 4));
  }
  EXPECT_EQ(InBandCheck::words({at::ones({1}, i64)}, c10d::ReduceOp::PRODUCT, 2), 0);
  EXPECT_EQ(InBandCheck::words({at::ones({1 << 20}, at::kInt)}, sum, 2), 0);           // 4 MB: the data dominates
  EXPECT_EQ(InBandCheck::words({at::ones({4, 4}, i64).t()}, sum, 2), 0);               // not contiguous
  EXPECT_EQ(InBandCheck::words({at::ones({1}, i64), at::ones({1}, i64)}, sum, 2), 0);  // two tensors
  EXPECT_EQ(InBandCheck::words({at::ones({1}, i64)}, sum, 1), 0);                      // nobody to disagree with
}

TEST(InBandCheck, FsdpsCollectivesCarryUpToTheCopyBound) {
  const int64_t big = InBandCheck::kMaxCopyBytes / 4;  // float32 elements at the bound
  // all_gather_into_tensor: any dtype (bytes), output W times the input, up to the bound.
  EXPECT_TRUE(InBandCheck::carriesAllGather(at::zeros({6}), at::ones({3}), 2));
  EXPECT_TRUE(InBandCheck::carriesAllGather(at::zeros({6}, at::kBFloat16), at::ones({3}, at::kBFloat16), 2));
  EXPECT_TRUE(InBandCheck::carriesAllGather(at::zeros({big}), at::ones({big / 2}), 2));
  EXPECT_FALSE(InBandCheck::carriesAllGather(at::zeros({big + 2}), at::ones({big / 2 + 1}), 2));
  EXPECT_FALSE(InBandCheck::carriesAllGather(at::zeros({8}), at::ones({3}), 2));               // not W x input
  EXPECT_FALSE(InBandCheck::carriesAllGather(at::zeros({6}, at::kDouble), at::ones({3}), 2));  // dtypes differ
  EXPECT_FALSE(InBandCheck::carriesAllGather(at::zeros({3}), at::ones({3}), 1));
  // reduce_scatter_tensor: the all_reduce's dtypes and ops (integers: a
  // floating chunk's sum would change order with the carried layout).
  const auto sum = c10d::ReduceOp::SUM, avg = c10d::ReduceOp::AVG;
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  const int64_t bigLong = InBandCheck::kMaxCopyBytes / 8;
  EXPECT_TRUE(InBandCheck::carriesReduceScatter(at::zeros({2}, i64), at::ones({4}, i64), sum, 2));
  EXPECT_TRUE(InBandCheck::carriesReduceScatter(at::zeros({2}, at::kInt), at::ones({4}, at::kInt), sum, 2));
  EXPECT_TRUE(InBandCheck::carriesReduceScatter(at::zeros({2}, i64), at::ones({4}, i64), c10d::ReduceOp::MAX, 2));
  EXPECT_FALSE(InBandCheck::carriesReduceScatter(at::zeros({2}, i64), at::ones({4}, i64), avg, 2));
  EXPECT_FALSE(InBandCheck::carriesReduceScatter(at::zeros({2}), at::ones({4}), sum, 2));
  EXPECT_FALSE(InBandCheck::carriesReduceScatter(at::zeros({2}), at::ones({4}), avg, 2));
  EXPECT_FALSE(InBandCheck::carriesReduceScatter(at::zeros({2}, at::kBFloat16), at::ones({4}, at::kBFloat16), sum, 2));
  EXPECT_FALSE(InBandCheck::carriesReduceScatter(at::zeros({2}, i64), at::ones({4}, i64), c10d::ReduceOp::PRODUCT, 2));
  EXPECT_FALSE(
      InBandCheck::carriesReduceScatter(at::zeros({bigLong / 2 + 1}, i64), at::ones({bigLong + 2}, i64), sum, 2));
  EXPECT_FALSE(InBandCheck::carriesReduceScatter(at::zeros({3}, i64), at::ones({4}, i64), sum, 2));  // not W x output
}

TEST(InBandCheck, TheCompactWordSumsExactlyAndTellsOneRankApart) {
  for (int world : {2, 3, 4, 8, 1000, 1 << 20}) {
    const int bits = InBandCheck::compactBits(world);
    const uint64_t low = uint64_t{1} << (bits - 1), high = uint64_t{1} << bits;
    EXPECT_LE(static_cast<double>(high) * world, 9007199254740992.0) << world;  // 2^53: W words sum exactly
    for (uint64_t h : std::vector<uint64_t>{0, ~uint64_t{0}, 0x9e3779b97f4a7c15ull}) {
      const uint64_t w = InBandCheck::compactWord(h, world);
      EXPECT_GE(w, low);
      EXPECT_LT(w, high);
      // W ranks' words add up exactly in a double: W times one's own exactly
      // when the others' sum to it. Here one rank differs in the lowest bit compared.
      const uint64_t other = InBandCheck::compactWord(h ^ (uint64_t{1} << (64 - (bits - 1))), world);
      EXPECT_NE(other, w);
      int64_t same = 0, one = 0;
      for (int r = 0; r < world; ++r) {
        same += static_cast<int64_t>(w);
        one += static_cast<int64_t>(r == world - 1 ? other : w);
      }
      EXPECT_TRUE(InBandCheck::compactAgree(same, w, world)) << world;
      EXPECT_FALSE(InBandCheck::compactAgree(one, w, world)) << world;
      EXPECT_FALSE(InBandCheck::compactAgree(one, other, world)) << world;
    }
  }
  // Carried so: one dense int32/int64 element under SUM, at any world up to 2^20.
  const auto sum = c10d::ReduceOp::SUM;
  const auto i64 = at::TensorOptions().dtype(at::kLong);
  EXPECT_TRUE(InBandCheck::compact({at::ones({1}, i64)}, sum, 4));
  EXPECT_TRUE(InBandCheck::compact({at::ones({1}, at::kInt)}, sum, 2));
  EXPECT_FALSE(InBandCheck::compact({at::ones({1})}, sum, 4));  // float32: widened, it would round once
  EXPECT_FALSE(InBandCheck::compact({at::ones({1}, i64)}, c10d::ReduceOp::MAX, 4));
  EXPECT_FALSE(InBandCheck::compact({at::ones({2}, i64)}, sum, 4));
  EXPECT_FALSE(InBandCheck::compact({at::ones({1}, i64)}, sum, 1));
  EXPECT_FALSE(InBandCheck::compact({at::ones({1}, i64)}, sum, (1 << 20) + 1));
}

TEST(PairExchange, ASummedWordGivesEachRankTheOthersElementAndCheck) {
  const std::vector<uint64_t> hashes{0, ~uint64_t{0}, 0x9e3779b97f4a7c15ull};
  const std::vector<uint32_t> elements{0, 1, 0x7fc00001u, 0x80000000u, ~uint32_t{0}};
  for (uint64_t h : hashes) {
    for (uint32_t a : elements) {
      for (uint32_t b : elements) {
        const uint64_t mine = PairExchange::singleWord(h, a), theirs = PairExchange::singleWord(h, b);
        EXPECT_LT(mine, uint64_t{1} << 62);  // two words sum without overflow in int64
        const int64_t sum = static_cast<int64_t>(mine) + static_cast<int64_t>(theirs);
        const uint64_t peer = PairExchange::peerWord(sum, mine);
        EXPECT_EQ(static_cast<uint32_t>(peer), b);
        EXPECT_TRUE(PairExchange::singleAgree(peer, mine));
        // A peer whose hash differs in the lowest bit compared, or the highest.
        for (int bit : {64 - PairExchange::kSingleCheckBits, 63}) {
          const uint64_t other = PairExchange::singleWord(h ^ (uint64_t{1} << bit), b);
          const int64_t differs = static_cast<int64_t>(mine) + static_cast<int64_t>(other);
          EXPECT_FALSE(PairExchange::singleAgree(PairExchange::peerWord(differs, mine), mine)) << bit;
        }
      }
    }
  }
  // One word for 4 bytes or less; else the hash and the data, a power of two.
  EXPECT_EQ(PairExchange::wordCount(4), 1);
  EXPECT_EQ(PairExchange::wordCount(8), 2);
  EXPECT_EQ(PairExchange::wordCount(16), 4);  // float32[4] and float32[6] send gloo equal lengths
  EXPECT_EQ(PairExchange::wordCount(24), 4);
  EXPECT_EQ(PairExchange::wordCount(PairExchange::kMaxDataBytes), 16384);
}

namespace {

// Two ranks' exchange of `a` and `b` (same dtype and length) with hashes ha
// and hb, the inner SUM done here as gloo does (int64 words wrap): what each
// rank's tensor holds after, and whether it agreed.
std::pair<bool, bool> exchange(at::Tensor& a, at::Tensor& b, uint64_t ha, uint64_t hb, PairExchange::Combine c) {
  at::Tensor wa = PairExchange::words(a, ha), wb = PairExchange::words(b, hb);
  at::Tensor sum = at::empty_like(wa);
  for (int64_t i = 0; i < wa.numel(); ++i) {
    sum.data_ptr<int64_t>()[i] = static_cast<int64_t>(static_cast<uint64_t>(wa.data_ptr<int64_t>()[i]) +
                                                      static_cast<uint64_t>(wb.data_ptr<int64_t>()[i]));
  }
  const bool okA = PairExchange::finish(a, sum, ha, 0, c);
  const bool okB = PairExchange::finish(b, sum, hb, 1, c);
  return {okA, okB};
}

}  // namespace

TEST(PairExchange, EachRankReducesTheTwoOperandsInGloosOrder) {
  const uint64_t h = 0x0123456789abcdefull;
  // Sums of every length class; integers that wrap.
  for (int64_t n : {1, 2, 3, 7, 100}) {
    at::Tensor a = at::arange(n, at::kFloat) * 0.1, b = at::arange(n, at::kFloat) * 0.3;
    const at::Tensor want = a + b;
    auto [okA, okB] = exchange(a, b, h, h, PairExchange::Combine::Sum);
    EXPECT_TRUE(okA && okB) << n;
    EXPECT_TRUE(at::equal(a, want) && at::equal(b, want)) << n;
  }
  at::Tensor i = at::full({3}, std::numeric_limits<int64_t>::max(), at::kLong), j = at::ones({3}, at::kLong);
  exchange(i, j, h, h, PairExchange::Combine::Sum);
  EXPECT_EQ(i[0].item<int64_t>(), std::numeric_limits<int64_t>::min());
  // MAX of a NaN and a number: gloo's std::max(rank 0's, rank 1's) keeps rank 0's operand.
  at::Tensor x = at::full({1}, std::nan(""), at::kFloat), y = at::ones({1}, at::kFloat);
  exchange(x, y, h, h, PairExchange::Combine::Max);
  EXPECT_TRUE(std::isnan(x[0].item<float>()) && std::isnan(y[0].item<float>()));
  // Hashes that differ: no agreement, and the data is left as it was.
  at::Tensor p = at::ones({5}), q = at::ones({5});
  auto [okP, okQ] = exchange(p, q, h, h ^ 1, PairExchange::Combine::Sum);
  EXPECT_FALSE(okP || okQ);
  EXPECT_TRUE(at::equal(p, at::ones({5})) && at::equal(q, at::ones({5})));
}

namespace {

// An inner backend that only has a name (InBandCheck::exchanges asks for gloo).
class Named : public c10d::Backend {
 public:
  explicit Named(std::string name) : c10d::Backend(0, 2), name_(std::move(name)) {}
  const std::string getBackendName() const override {
    return name_;
  }

 private:
  std::string name_;
};

}  // namespace

TEST(InBandCheck, AnExchangeTakesTheFourDtypesUpToItsBoundBetweenTwoRanksOnGloo) {
  Named gloo("gloo"), other("nccl");
  for (auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::MAX, c10d::ReduceOp::MIN}) {
    for (auto dtype : {at::kFloat, at::kDouble, at::kInt, at::kLong}) {
      EXPECT_TRUE(InBandCheck::exchanges({at::ones({1}, dtype)}, op, 2, gloo));
      EXPECT_TRUE(InBandCheck::exchanges({at::ones({16}, dtype)}, op, 2, gloo));
    }
  }
  EXPECT_TRUE(InBandCheck::exchanges({at::ones({PairExchange::kMaxDataBytes / 4})}, c10d::ReduceOp::SUM, 2, gloo));
  EXPECT_FALSE(InBandCheck::exchanges({at::ones({PairExchange::kMaxDataBytes / 4 + 1})}, c10d::ReduceOp::SUM, 2, gloo));
  EXPECT_FALSE(InBandCheck::exchanges({at::ones({1}, at::kBFloat16)}, c10d::ReduceOp::SUM, 2, gloo));
  EXPECT_FALSE(InBandCheck::exchanges({at::ones({1})}, c10d::ReduceOp::SUM, 3, gloo));  // the sum is no exchange
  EXPECT_FALSE(InBandCheck::exchanges({at::ones({1})}, c10d::ReduceOp::PRODUCT, 2, gloo));
  EXPECT_FALSE(InBandCheck::exchanges({at::ones({1})}, c10d::ReduceOp::SUM, 2, other));  // gloo's operand order
}

}  // namespace test_in_band_check
