#pragma once

// PairExchange: an all_reduce between two ranks on gloo as an exchange of the
// two ranks' operands, with the check in it (issues 40 and 56; InBandCheck
// decides which all_reduces take it).
//
// Each rank puts [its check, its data's bytes] into int64 words and the inner
// backend SUMs them, whatever the user's op. Integer sums wrap, so the sum
// less a rank's own words is the other rank's words, bit for bit: its check,
// compared with this rank's, and its data, which this rank then reduces with
// its own as gloo's ring would (reduceInGlooOrder). The result is gloo's, bit
// for bit: a sum is the same in either order (IEEE addition is commutative,
// integers wrap alike), and a MAX/MIN keeps gloo's choice between a NaN and a
// number, or 0 and -0. The words are gloo's own all_reduce, so they cost what
// the user's collective costs, quiet or with the cores busy, and Flight
// Recorder records them under the user's group (as an int64 SUM).
//
// A 4-byte element (a float32 loss, an int32 count or flag) takes one word:
// the top kSingleCheckBits of the rolling hash in bits 32-61 and the element
// in bits 0-31; two such words sum below 2^63, so nothing wraps. Anything
// longer takes the whole rolling hash in word 0 and the data behind it, the
// count rounded up to a power of two so that ranks whose lengths differ a
// little (a mismatch) still send gloo equal lengths and tell it by the check.

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>

namespace torch_ext {

class PairExchange {
 public:
  // The longest data an exchange carries.
  static constexpr int64_t kMaxDataBytes = 64 * 1024;
  // The check bits of a one-word exchange: ranks that differ pass with
  // probability 2^-30, and every later check compares again (the rolling
  // hash carries the collective on). Longer exchanges compare all 64.
  static constexpr int kSingleCheckBits = 30;

  enum class Combine : uint8_t { Sum, Max, Min };
  // SUM, MAX or MIN (the three an exchange takes).
  static Combine combineOf(const c10d::ReduceOp& op);

  // The int64 words this rank contributes for `user` (one dense CPU
  // float32/float64/int32/int64 tensor of at most kMaxDataBytes).
  static at::Tensor words(const at::Tensor& user, uint64_t rolling);
  // After the inner SUM of words() over the two ranks into `summed`: whether
  // the other rank's check is this rank's; if so, `user` holds the reduction
  // (left as it was otherwise). `rank` is this rank's on the inner group.
  static bool finish(const at::Tensor& user, const at::Tensor& summed, uint64_t rolling, int rank, Combine combine);

  // Pure, for tests: a one-word exchange's word, the other rank's word from
  // the sum, and whether its check is this rank's.
  static uint64_t singleWord(uint64_t rolling, uint32_t bits);
  static uint64_t peerWord(int64_t summed, uint64_t mine);
  static bool singleAgree(uint64_t peer, uint64_t mine);
  // The words an exchange of `bytes` data bytes takes.
  static int64_t wordCount(int64_t bytes);
  // user := the reduction of rank 0's and rank 1's operands (user's element
  // type and length, read from their bytes), each element in gloo's operand
  // order, as gloo's ring computes it between two ranks.
  static void reduceInGlooOrder(const at::Tensor& user, const uint8_t* rankZero, const uint8_t* rankOne,
                                Combine combine);
};

}  // namespace torch_ext
