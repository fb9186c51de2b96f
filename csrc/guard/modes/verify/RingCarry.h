#pragma once

// RingCarry: check="verify" for a small all_reduce among three or more ranks
// on gloo, and a reduce_scatter_tensor from two (gloo's is an all_reduce of the
// whole input), carried by the collective itself without changing a bit of its
// result, in the chunks gloo's ring already sends (issue 70).
//
// A floating sum rounds at each addition, so its last bits follow the order
// in which the ring adds the ranks' operands, and a MAX/MIN keeps the first
// of a NaN and a number, or of 0 and -0 (issue 56). gloo's ring
// (gloo/allreduce.cc) cuts a buffer of L elements into 2W segments of
// m = ceil(L / 2W) elements, two to a chunk; chunk c is reduced along the
// ring towards rank c, which adds its own operand last:
// x_c + (x_c+1 + (... + (x_c-2 + x_c-1))). So an element's order of
// additions is its chunk's, floor(position / 2m), and nothing else. A carry
// that keeps every user element in the chunk plain gloo puts it in keeps the
// result bit for bit, whatever it puts around the elements.
//
// What gloo's ring pays for is the chunks that hold data (on the 2-core
// machine, world 3, float32: 1 or 2 elements, one chunk, 0.4-0.5 ms; 3 or 4
// elements, two chunks, 1.4-1.6 ms; 6, three chunks, 2.2-2.4 ms; a round
// of the verifier, one helper all_gather, about 1.8 ms). So the words go:
//  - in the free places of the last chunk the user's elements reach
//    (appended: the segment length, and so every chunk, stays the same);
//  - where that chunk is full, each segment grows by one element over the
//    chunks holding data (the user's elements of chunk c move to the front of
//    the new chunk c: the same chunks, and the same number of them, a few
//    bytes longer), if gloo then cuts the longer buffer into segments that
//    leave the other chunks empty (used chunks x (m + 1) > W x m: at world
//    3, float32[4]; at world 4, float32[6] and [12]);
//  - else, with a chunk left empty, into the next one (one chunk more, which
//    costs less than a round), in its first segment where enough bits
//    fit there (a segment holding data costs a step: float32[2] at worlds 3
//    and 4, about 1.95x gloo);
//  - else (every chunk holds data) each segment grows by one element over
//    all of them.
//
// The words: under SUM, integers below 2^(exact - ceil(log2 W)) with the top
// bit set (exact: 24 bits for float32, 31 for int32, 53 otherwise), so that W of them add up exactly in any order, and
// each rank reads W times its own word exactly when the others' sum to it; under MAX and MIN, pairs (v, -v) of one
// finite value, both of which come back unchanged only when every rank carried the same v. Ranks that differ pass with
// probability 2^-bits() (21 bits for one float32 word at worlds 3 and 4), and every later check compares again: the
// rolling hash carries this collective on.

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>
#include <optional>
#include <vector>

namespace torch_ext {

// Calls fn(T*) with `t`'s data as its element type, for the four dtypes a
// carry takes (float32, float64, int32; anything else as int64: callers
// check the dtype first). Shared by RingCarry and InBandCheck.
template <typename Fn>
void forCarriedType(const at::Tensor& t, Fn&& fn) {
  switch (t.scalar_type()) {
    case at::kFloat:
      fn(t.data_ptr<float>());
      break;
    case at::kDouble:
      fn(t.data_ptr<double>());
      break;
    case at::kInt:
      fn(t.data_ptr<int32_t>());
      break;
    default:
      fn(t.data_ptr<int64_t>());
      break;
  }
}

class RingCarry {
 public:
  // The carry for an all_reduce of `n` elements of `dtype` (float32, float64,
  // int32, int64) under `op` (SUM, MAX, MIN; AVG of a floating type) among
  // `worldSize` (2 to 2^16) ranks, or none where the words would not tell
  // enough (kMinBits) or gloo's segments would pass its 1 MiB bound.
  static std::optional<RingCarry> plan(int64_t n, at::ScalarType dtype, const c10d::ReduceOp& op, int worldSize);

  // Elements per segment of gloo's ring for a buffer of `length` elements.
  static int64_t segment(int64_t length, int worldSize);

  int64_t length() const {
    return length_;
  }
  // Where the user's element `e` travels in the carried buffer.
  int64_t at(int64_t e) const {
    return e / userChunk_ * chunk_ + e % userChunk_;
  }
  const std::vector<int64_t>& wordAt() const {
    return wordAt_;
  }
  // How many bits of the rolling hash the words compare.
  int bits() const;

  // This rank's words for `rolling`, in wordAt() order (as doubles: exact for
  // both dtypes), and whether the reduced words say every rank carried them.
  std::vector<double> words(uint64_t rolling) const;
  bool agree(const std::vector<double>& reduced, uint64_t rolling) const;

  // Fills the carried buffer (`length()` elements): the user's elements at
  // at(e), the words at wordAt(), zeros elsewhere; and copies the reduced
  // elements from..from + out.numel() back to `out` (all of them to the
  // user's tensor; a reduce_scatter's own chunk to its output), returning the
  // reduced words.
  void pack(const at::Tensor& user, const at::Tensor& carried, uint64_t rolling) const;
  std::vector<double> unpack(const at::Tensor& carried, const at::Tensor& out, int64_t from = 0) const;

  static constexpr int kMinBits = 16;
  static constexpr int kWantBits = 62;

 private:
  RingCarry() = default;
  // Hash bits per word (SUM) or per pair (MAX, MIN).
  int bitsPerWord() const;
  // This plan (its chunks of 2m elements, no words yet) with up to `want`
  // words (a multiple of `step`) in the `room` places behind the user's last
  // element, or none where that length changes gloo's segment m.
  std::optional<RingCarry> appended(int64_t room, int64_t want, int64_t step, int64_t m) const;
  // This plan over the first `chunks` chunks, each segment one element
  // longer (m + 1), the words in the places the user's elements leave; none
  // where gloo would cut that length into segments other than m + 1 (other
  // chunks would hold data) or the words carry fewer than `need`.
  std::optional<RingCarry> grown(int64_t chunks, int64_t want, int64_t need, int64_t step, int64_t m) const;

  int64_t n_ = 0;
  int64_t length_ = 0;
  int64_t userChunk_ = 1;  // the user's elements per chunk of plain gloo's layout (2m)
  int64_t chunk_ = 1;      // elements per chunk of the carried layout
  std::vector<int64_t> wordAt_;
  bool pairs_ = false;  // MAX/MIN
  bool avg_ = false;    // AVG: the words come back divided by W, as themselves
  at::ScalarType type_ = at::kFloat;
  int worldSize_ = 0;
};

}  // namespace torch_ext
