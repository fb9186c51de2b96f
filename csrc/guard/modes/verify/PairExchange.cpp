#include "guard/modes/verify/PairExchange.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace torch_ext {

namespace {

// out[i] = a[i] (combine) b[i] for n elements of T, as gloo's reductions compute
// it (gloo/math.h: std::max(a, b), std::min(a, b), a + b).
template <typename T>
void combineInto(T* out, const T* a, const T* b, int64_t n, PairExchange::Combine combine) {
  switch (combine) {
    case PairExchange::Combine::Max:
      for (int64_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
      return;
    case PairExchange::Combine::Min:
      for (int64_t i = 0; i < n; ++i) out[i] = std::min(a[i], b[i]);
      return;
    case PairExchange::Combine::Sum:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;  // wraps as the inner backend's sum does
        for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<U>(a[i]) + static_cast<U>(b[i]));
      } else {
        for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
      }
      return;
  }
}

// How many leading elements of n (of `size` bytes) gloo's ring reduces on rank
// 0 between two ranks, rank 0's own operand first; rank 1 reduces the rest,
// its own first (gloo/allreduce.cc: 2W = 4 segments of ceil(bytes / 4) bytes,
// rounded up to the element; rank 0 receives and reduces segments 0 and 1).
// Under MAX/MIN the first operand is the one kept when neither is greater (a
// NaN, 0 against -0): reducing in gloo's order gives gloo's result bit for bit.
int64_t reducedOnRankZero(int64_t n, int64_t size) {
  const int64_t segmentBytes = ((n * size + 3) / 4 + size - 1) / size * size;
  return std::min(n, 2 * segmentBytes / size);
}

// combineInto at `user`'s element type, over the data behind the headers of
// rank 0's and rank 1's messages, each element in gloo's operand order.
template <typename T>
void combineInGlooOrder(const at::Tensor& user, const uint8_t* zero, const uint8_t* one,
                        PairExchange::Combine combine) {
  const int64_t n = user.numel();
  const int64_t h = reducedOnRankZero(n, sizeof(T));
  T* out = user.data_ptr<T>();
  const T* a = reinterpret_cast<const T*>(zero);
  const T* b = reinterpret_cast<const T*>(one);
  combineInto(out, a, b, h, combine);
  combineInto(out + h, b + h, a + h, n - h, combine);
}

}  // namespace

PairExchange::Combine PairExchange::combineOf(const c10d::ReduceOp& op) {
  return op == c10d::ReduceOp::MAX ? Combine::Max : op == c10d::ReduceOp::MIN ? Combine::Min : Combine::Sum;
}

uint64_t PairExchange::singleWord(uint64_t rolling, uint32_t bits) {
  return (rolling >> (64 - kSingleCheckBits)) << 32 | bits;
}

uint64_t PairExchange::peerWord(int64_t summed, uint64_t mine) {
  return static_cast<uint64_t>(summed) - mine;
}

bool PairExchange::singleAgree(uint64_t peer, uint64_t mine) {
  return peer >> 32 == mine >> 32;
}

int64_t PairExchange::wordCount(int64_t bytes) {
  if (bytes <= 4) return 1;
  const int64_t need = 1 + (bytes + 7) / 8;
  int64_t n = 2;
  while (n < need) n *= 2;
  return n;
}

namespace {

int64_t dataBytes(const at::Tensor& user) {
  return user.numel() * static_cast<int64_t>(user.element_size());
}

// This rank's words for `user` into `p` (wordCount(bytes) words, zeroed).
void fillWords(uint64_t* p, const at::Tensor& user, uint64_t rolling) {
  const int64_t nb = dataBytes(user);
  if (nb <= 4) {
    uint32_t bits = 0;
    std::memcpy(&bits, user.data_ptr(), nb);
    p[0] = PairExchange::singleWord(rolling, bits);
  } else {
    p[0] = rolling;
    std::memcpy(p + 1, user.data_ptr(), nb);
  }
}

}  // namespace

at::Tensor PairExchange::words(const at::Tensor& user, uint64_t rolling) {
  at::Tensor w = at::zeros({wordCount(dataBytes(user))}, user.options().dtype(at::kLong));
  fillWords(reinterpret_cast<uint64_t*>(w.data_ptr<int64_t>()), user, rolling);
  return w;
}

bool PairExchange::finish(const at::Tensor& user, const at::Tensor& summed, uint64_t rolling, int rank,
                          Combine combine) {
  const int64_t n = wordCount(dataBytes(user));
  if (summed.numel() != n) return false;
  // This rank's words again (user is unchanged until reduced below), without
  // a tensor: this runs once per collective.
  std::vector<uint64_t> mine(n, 0);
  fillWords(mine.data(), user, rolling);
  const uint64_t* own = mine.data();
  const int64_t* sum = summed.data_ptr<int64_t>();
  std::vector<uint64_t> peer(n);  // the other rank's words: the sum less this rank's (they wrap alike)
  for (int64_t i = 0; i < n; ++i) peer[i] = peerWord(sum[i], own[i]);
  const bool single = dataBytes(user) <= 4;
  if (single ? !singleAgree(peer[0], own[0]) : peer[0] != rolling) return false;
  // The data behind the check: bits 0-31 of a single word, else words 1 on.
  const auto* ownData = reinterpret_cast<const uint8_t*>(single ? own : own + 1);
  const auto* peerData = reinterpret_cast<const uint8_t*>(single ? peer.data() : peer.data() + 1);
  reduceInGlooOrder(user, rank == 0 ? ownData : peerData, rank == 0 ? peerData : ownData, combine);
  return true;
}

void PairExchange::reduceInGlooOrder(const at::Tensor& user, const uint8_t* rankZero, const uint8_t* rankOne,
                                     Combine combine) {
  switch (user.scalar_type()) {
    case at::kFloat:
      return combineInGlooOrder<float>(user, rankZero, rankOne, combine);
    case at::kDouble:
      return combineInGlooOrder<double>(user, rankZero, rankOne, combine);
    case at::kInt:
      return combineInGlooOrder<int32_t>(user, rankZero, rankOne, combine);
    default:
      return combineInGlooOrder<int64_t>(user, rankZero, rankOne, combine);
  }
}

}  // namespace torch_ext
