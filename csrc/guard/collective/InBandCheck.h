#pragma once

// InBandCheck: check="verify" for a small all_reduce, carried by the
// all_reduce itself (issue 40). A waited small collective (a loss or metric
// all_reduce per step, a flag) would otherwise need a round of its own on the
// helper backend before its result is released: a second collective, which
// cost 5.4x gloo on a loop of synchronous 4 B all_reduces.
//
// Instead the guard reduces [check words, data] in one inner all_reduce. The
// words encode this rank's rolling hash at the collective (every collective
// up to it, Ledger): under SUM, one word per hash bit (0 or 1), whose sum is
// 0 or W exactly when all W ranks have that bit alike; under MAX and MIN, a
// pair per bit (the bit and its complement), whose reduced values sum to 1
// exactly when all ranks agree. Every rank reads the same reduced words, so
// every rank reaches the same verdict: agree verifies everything up to the
// collective (Verifier::inBandVerdict), then the data is copied back and the
// work completes. Anything else (no agreement, an error, no verdict within the
// fallback) is left to the verifier's rounds, which find and report the
// difference as for any collective: the in-band words only ever speed a
// release, they never decide a difference.
//
// Carried only where the words cost little next to the collective and stay
// exact: one dense CPU tensor of float32/float64/int32/int64, at most
// kMaxBytes, SUM/MAX/MIN, worlds below 2^24 (float32 sums of ones are exact),
// and at worlds above 2 at least one element per rank (words()).
// The words go in front, so they line up across ranks whatever the length,
// and the total is rounded up (carriedLength).

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <functional>
#include <vector>

namespace torch_ext {

class InBandCheck {
 public:
  static constexpr int64_t kMaxBytes = 64 * 1024;
  // Elements in front of the data, whatever the op (SUM's 64 words, padded).
  static constexpr int64_t kWordSlots = 128;
  // The carried all_reduce's length for `n` data elements: kWordSlots + n,
  // rounded up to a power of two (at least 256), so that ranks whose lengths
  // differ a little (a mismatch) still send gloo the same number of bytes:
  // gloo aborts the process on a message longer than it expects.
  static int64_t carriedLength(int64_t n);

  // The check words an all_reduce of `tensors` with `op` over `worldSize`
  // ranks carries (64 or 128), or 0 when it carries none. The same on every
  // rank that issues the same collective.
  static int64_t words(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op, int worldSize);

  // Issues the all_reduce of [words of `rolling`, tensors[0]] on `inner`. The
  // work it returns completes (its future too) once `verdict(agree)` was called
  // and the data is back in tensors[0]; an inner failure is its failure.
  static c10::intrusive_ptr<c10d::Work> allreduce(c10d::Backend& inner, std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts, uint64_t rolling, int worldSize,
                                                  std::function<void(bool)> verdict);

  // Pure, for tests: the words of `rolling` under `op`, and whether reduced
  // words (as doubles) say that `worldSize` ranks agree.
  static std::vector<double> encode(uint64_t rolling, const c10d::ReduceOp& op);
  static bool agree(const std::vector<double>& reduced, const c10d::ReduceOp& op, int worldSize);
};

}  // namespace torch_ext
