#include "guard/modes/verify/KeyedPick.h"

namespace torch_ext {

namespace {

constexpr uint32_t kSign = 0x80000000u;
constexpr uint32_t kExponent = 0x7F800000u;
constexpr uint32_t kMantissa = 0x007FFFFFu;

bool isNaN(uint32_t bits) {
  return (bits & kExponent) == kExponent && (bits & kMantissa) != 0;
}

uint64_t lowMask(int n) {
  return n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
}

// Bits for the values 0..w.
int bitsFor(int w) {
  int b = 0;
  while ((int64_t{1} << b) <= w) ++b;
  return b;
}

float asFloat(uint32_t bits) {
  float f = 0;
  static_assert(sizeof f == sizeof bits);
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
}

}  // namespace

std::optional<KeyedPick> KeyedPick::plan(at::ScalarType dtype, const c10d::ReduceOp& op, int worldSize) {
  if (worldSize < 3 || (dtype != at::kFloat && dtype != at::kInt)) return std::nullopt;
  if (op != c10d::ReduceOp::MAX && op != c10d::ReduceOp::MIN) return std::nullopt;
  KeyedPick k;
  k.floating_ = dtype == at::kFloat;
  k.min_ = op == c10d::ReduceOp::MIN;
  k.worldSize_ = worldSize;
  if (k.floating_) {
    k.rankBits_ = bitsFor(worldSize);
    k.keyBits_ = 32 + k.rankBits_ + 1;
    k.nanBits_ = k.rankBits_ + 24;
  } else {
    k.keyBits_ = 32;
    k.nanBits_ = 0;
  }
  k.checkBits_ = 63 - k.keyBits_;  // both words stay non-negative
  if (k.checkBits_ < kMinBits) return std::nullopt;
  return k;
}

uint64_t KeyedPick::check(uint64_t rolling) const {
  return rolling >> (64 - checkBits_);
}

uint64_t KeyedPick::key(uint32_t bits, int rank) const {
  if (!floating_) {
    const uint32_t order = bits ^ kSign;  // int32's order as unsigned
    return min_ ? ~order : order;
  }
  const bool zero = (bits & ~kSign) == 0;
  const uint32_t b = zero ? 0 : bits;  // 0 and -0 compare equal: one order, the rank decides
  uint32_t order = (b & kSign) ? ~b : (b | kSign);
  if (min_) order = ~order;  // never 0: -inf's and +inf's orders are 0x007FFFFF and 0xFF800000
  const uint64_t tie = static_cast<uint64_t>(worldSize_ - 1 - rank);
  return (uint64_t{order} << (rankBits_ + 1)) | (tie << 1) | (zero ? bits >> 31 : 0);
}

uint32_t KeyedPick::unkey(uint64_t key) const {
  if (!floating_) {
    const auto order = static_cast<uint32_t>(key);
    return (min_ ? ~order : order) ^ kSign;
  }
  auto order = static_cast<uint32_t>(key >> (rankBits_ + 1));
  if (min_) order = ~order;
  const uint32_t b = (order & kSign) ? (order & ~kSign) : ~order;
  return b == 0 ? static_cast<uint32_t>(key & 1) << 31 : b;
}

KeyedPick::Words KeyedPick::words(uint32_t bits, int rank, uint64_t rolling) const {
  const uint64_t c = check(rolling);
  uint64_t k = 0;
  uint64_t nan = 0;
  if (floating_ && isNaN(bits)) {
    nan = (static_cast<uint64_t>(worldSize_ - rank) << 24) | ((bits >> 31) << 23) | (bits & kMantissa);
  } else {
    k = key(bits, rank);
  }
  const uint64_t w0 = (c << keyBits_) | k;
  const uint64_t w1 = ((~c & lowMask(checkBits_)) << nanBits_) | nan;
  return {static_cast<int64_t>(w0), static_cast<int64_t>(w1)};
}

bool KeyedPick::agree(const Words& reduced, uint64_t rolling) const {
  const uint64_t largest = static_cast<uint64_t>(reduced[0]) >> keyBits_;
  const uint64_t smallest = ~(static_cast<uint64_t>(reduced[1]) >> nanBits_) & lowMask(checkBits_);
  return largest == smallest && largest == check(rolling);
}

std::optional<uint32_t> KeyedPick::result(const Words& reduced) const {
  const uint64_t k = static_cast<uint64_t>(reduced[0]) & lowMask(keyBits_);
  if (!floating_) return unkey(k);
  const uint64_t nan = static_cast<uint64_t>(reduced[1]) & lowMask(nanBits_);
  if (nan == 0) return unkey(k);
  const int firstNaN = worldSize_ - static_cast<int>(nan >> 24);
  if (firstNaN == 0) {  // rank 0's own operand, kept whatever came to it
    return static_cast<uint32_t>(((nan >> 23) & 1) << 31) | kExponent | static_cast<uint32_t>(nan & kMantissa);
  }
  // The pick over the ranks below r*: word 0's when its rank is among them.
  const int winner = worldSize_ - 1 - static_cast<int>((k >> 1) & lowMask(rankBits_));
  if (k != 0 && winner < firstNaN) return unkey(k);
  return std::nullopt;
}

uint32_t KeyedPick::fold(const std::vector<uint32_t>& elements) const {
  // gloo/math.h: std::max(a, b) keeps a unless a < b; std::min(a, b) keeps a
  // unless b < a. Own operand first, from the last rank down (RingCarry.h).
  // The bits are picked, never copied through a float register.
  auto before = [this](uint32_t a, uint32_t b) {  // whether b replaces a
    if (floating_) return min_ ? asFloat(b) < asFloat(a) : asFloat(a) < asFloat(b);
    const auto x = static_cast<int32_t>(a);
    const auto y = static_cast<int32_t>(b);
    return min_ ? y < x : x < y;
  };
  uint32_t g = elements.back();
  for (size_t r = elements.size() - 1; r-- > 0;) {
    if (!before(elements[r], g)) g = elements[r];
  }
  return g;
}

}  // namespace torch_ext
