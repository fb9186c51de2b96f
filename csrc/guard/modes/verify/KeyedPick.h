#pragma once

// KeyedPick: check="verify" for a one-element MAX or MIN of float32 or int32
// among three or more ranks on gloo (an early-stop flag, a largest loss or
// gradient norm), carried in two int64 words that gloo's ring reduces on the
// path two elements take (issue 70).
//
// RingCarry would carry it as [x, v, -v]: a pair of check values beside the
// element, which needs a second chunk of the ring (about 2.1x plain gloo at
// worlds 3 and 4). Here the element travels inside the words instead, as a
// key whose integer order is the op's order, behind the check bits:
//   word 0 = [v | key(x)]     word 1 = [~v | NaN(x)]
// The inner backend takes the MAX of both words (whatever the user's op: an
// integer MAX picks in any order). Word 0's top bits come back as the
// largest v, word 1's as the complement of the smallest: all ranks carried
// the same v exactly when the two are equal, and then word 0's key is the
// key of every rank's element. An int32's key is its order (int32 ties are
// equal bits), and the result is read from it.
//
// A float32 needs more, because gloo keeps the first of two operands that
// compare equal or unordered: its ring folds one element's operands (plain
// gloo's chunk 0) as pick(x_0, pick(x_1, ... pick(x_W-2, x_W-1))) with
// pick = std::max or std::min, own operand first (RingCarry.h). So among equal
// values (0 and -0) the lowest rank's operand is kept, and a NaN decides by
// where it stands: kept when it is x_0's, else it and every operand behind
// it are dropped (the fold continues from x_r*-1 over the lower ranks).
//  - key(x) for a number: its order (0 and -0 equal), then W - 1 - rank (the
//    lowest rank wins a tie), then the sign of a zero; a NaN: 0 (below all).
//  - NaN(x) for a NaN: W - rank (the lowest NaN rank, r*, wins), then its
//    sign and payload; a number: 0.
// No NaN: word 0's key is the result, bit for bit. x_0 a NaN: word 1 holds it.
// A NaN at r* > 0: the result is the pick over ranks below r*, which is word
// 0's key when its rank is below r*; else no pair of per-rank keys can tell
// it (the pick over a prefix whose end only the others know), and every rank,
// reading the same words, asks for every rank's element and folds them as
// gloo does (fold(); Verifier::exchange sends them on the helper group: a
// NaN flag whose largest number sits behind it, rare, and exact).
//
// Check bits: int32 31; float32 30 - ceil(log2(W + 1)) (28 at world 3, 27 at
// world 4, 16 at 16,383 ranks; not carried at more). Ranks that differ
// pass with probability 2^-bits, and every later check compares again (the
// rolling hash carries the collective on).

#include <c10/core/ScalarType.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

namespace torch_ext {

class KeyedPick {
 public:
  // The carry for a one-element all_reduce of `dtype` under `op` among
  // `worldSize` ranks, or none (another dtype or op, fewer than three ranks,
  // or too few check bits left).
  static std::optional<KeyedPick> plan(at::ScalarType dtype, const c10d::ReduceOp& op, int worldSize);

  using Words = std::array<int64_t, 2>;
  // This rank's words: its element's 32 bits `bits`, its group rank `rank`,
  // the check from `rolling`.
  Words words(uint32_t bits, int rank, uint64_t rolling) const;
  // Whether the MAX of every rank's words says they all carried `rolling`.
  bool agree(const Words& reduced, uint64_t rolling) const;
  // gloo's result (its 32 bits) read from the reduced words, or none where
  // the words cannot tell it (a NaN ahead of the largest number): then fold().
  std::optional<uint32_t> result(const Words& reduced) const;
  // gloo's result from every rank's element, in group rank order.
  uint32_t fold(const std::vector<uint32_t>& elements) const;

  // How many bits of the rolling hash the words compare.
  int bits() const {
    return checkBits_;
  }

  static constexpr int kMinBits = 16;

 private:
  KeyedPick() = default;
  uint64_t check(uint64_t rolling) const;
  // A number's key (float32: order, W - 1 - rank, zero's sign).
  uint64_t key(uint32_t bits, int rank) const;
  uint32_t unkey(uint64_t key) const;

  bool floating_ = false;
  bool min_ = false;
  int worldSize_ = 0;
  int rankBits_ = 0;   // float32: ceil(log2(W + 1))
  int keyBits_ = 32;   // word 0's low bits: the key
  int nanBits_ = 32;   // word 1's low bits: float32's NaN field, int32's key again
  int checkBits_ = 0;  // word 0's top bits below the sign
};

}  // namespace torch_ext
