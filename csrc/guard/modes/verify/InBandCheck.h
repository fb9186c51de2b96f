#pragma once

// InBandCheck: check="verify" for a small all_reduce, all_gather_into_tensor
// or reduce_scatter_tensor, carried by the collective itself (issue 40). A waited small collective (a loss or metric
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
// Carried only where the result stays the inner backend's bit for bit, and
// the words cost little next to the collective: the words and the padding
// change the buffer's length and layout, and with them the order in which the
// inner backend combines each element's operands (gloo's ring segments follow
// the byte count), so only integer reductions are carried so (orderFree in
// the .cpp: their sums wrap and MAX/MIN pick, in any order); a floating one
// only where its layout provably keeps gloo's order (between two ranks the
// pair exchange, among more RingCarry: issue 70), else it waits for the
// verifier's rounds (issue 56; tests/python/test_exactness.py). Then:
// one dense CPU tensor of int32/int64, at most kMaxBytes, SUM/MAX/MIN, worlds
// below 2^24, and at worlds above 2 at least one element per rank (words());
// or, one element under SUM, a single word beside it (compact). Between two
// ranks on gloo a SUM, MAX or MIN of any of the four dtypes, floating ones
// too, is a pair exchange (exchanges()): each rank reads the other's operands
// from a summed all_reduce of int64 words and reduces them in gloo's own
// operand order. The words go in front, so they line up across
// ranks whatever the length, and the total is rounded up (carriedLength).
//
// The two collectives FSDP2 waits on at once (its parameters' all_gather, its
// gradients' reduce_scatter) carry their check the same way, up to
// kMaxCopyBytes (their data is copied into the carried buffer and back):
//  - all_gather_into_tensor gathers this rank's rolling hash (8 bytes) beside
//    its input from every rank: every rank reads all W hashes, and they agree
//    when they are equal (bytes are moved, never combined: any dtype). On gloo
//    through its coalesced all_gather, straight into the user's output
//    (gatherBeside); elsewhere [hash, input] as bytes, copied out;
//  - reduce_scatter_tensor reduces [words, chunk] for each rank's chunk: each
//    rank reads the reduced words in front of its own chunk, as an all_reduce
//    does (integer types only, as the all_reduce: FSDP2's floating gradients
//    wait for a round).

#include "guard/collective/InBandRequest.h"
#include "guard/modes/verify/KeyedPick.h"
#include "guard/modes/verify/RingCarry.h"

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace torch_ext {

// Every rank's 32-bit element of collective #seq, in group rank order, from
// this rank's `mine`: where a KeyedPick's words cannot tell gloo's result
// (KeyedPick.h). Every rank calls it for the same collective, or none does.
// One per group (the caller's), shared by the collectives that may need it.
using InBandExchange = std::function<std::vector<uint32_t>(uint32_t mine, uint64_t seq)>;

// What a carried collective may need beyond its verdict: the group's exchange
// (none: no KeyedPick), and its seq.
struct InBandReading {
  std::shared_ptr<const InBandExchange> exchange;
  uint64_t seq = 0;
};

class InBandCheck {
 public:
  static constexpr int64_t kMaxBytes = 64 * 1024;
  // all_gather_into_tensor's output, reduce_scatter_tensor's input: copied in
  // and out, which costs less than a round up to a few MB (FSDP2's layers).
  static constexpr int64_t kMaxCopyBytes = 4 * 1024 * 1024;
  // Elements in front of the data, whatever the op (SUM's 64 words, padded).
  static constexpr int64_t kWordSlots = 128;
  // The carried all_reduce's length for `n` data elements: kWordSlots + n,
  // rounded up to a power of two (at least 256), so that ranks whose lengths
  // differ a little (a mismatch) send gloo the same number of bytes and learn
  // it from the words.
  static int64_t carriedLength(int64_t n);

  // The check words an all_reduce of `tensors` with `op` over `worldSize`
  // ranks carries (64 or 128), or 0 when it carries none. The same on every
  // rank that issues the same collective.
  static int64_t words(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op, int worldSize);
  // Whether an all_gather_into_tensor / reduce_scatter_tensor of these
  // tensors carries its check. The same on every rank that issues the same
  // collective.
  static bool carriesAllGather(const at::Tensor& output, const at::Tensor& input, int worldSize);
  static bool carriesReduceScatter(const at::Tensor& output, const at::Tensor& input, const c10d::ReduceOp& op,
                                   int worldSize);

  // Each issues its collective carrying this rank's `rolling` hash on
  // `inner`. The work returned completes (its future too) once the data is
  // in the caller's output, and `verdict(agree)` is called by its future's
  // first callback (without a future: in the wait() or isCompleted() that
  // sees it done, before it returns); an inner failure is its failure.
  using Verdict = std::function<void(bool)>;
  using Exchange = InBandExchange;
  using Reading = InBandReading;
  // Whether the collective `r` describes carries its check, and issuing it so.
  static bool carries(const InBandRequest& r, const c10d::Backend& inner, int worldSize);
  static c10::intrusive_ptr<c10d::Work> issue(const InBandRequest& r, c10d::Backend& inner, uint64_t rolling,
                                              int worldSize, Verdict verdict, const Reading& reading);
  static c10::intrusive_ptr<c10d::Work> allreduce(c10d::Backend& inner, std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts, uint64_t rolling, int worldSize,
                                                  Verdict verdict, const Reading& reading = Reading());
  static c10::intrusive_ptr<c10d::Work> allgather(c10d::Backend& inner, at::Tensor& output, at::Tensor& input,
                                                  const c10d::AllgatherOptions& opts, uint64_t rolling, int worldSize,
                                                  Verdict verdict);
  static c10::intrusive_ptr<c10d::Work> reduceScatter(c10d::Backend& inner, at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts, uint64_t rolling,
                                                      int worldSize, Verdict verdict);

  // Between two ranks on gloo, a SUM, MAX or MIN of one dense tensor of the
  // four dtypes up to PairExchange::kMaxDataBytes (a loss, a metric vector, an
  // early-stop flag) is a pair exchange (PairExchange.h): the two ranks'
  // [check, data] words summed by the inner all_reduce, from which each rank
  // reads the other's operands and reduces them as gloo's ring does. A
  // 4-byte element takes one word, the ring's cheapest path (a second element
  // costs about 1.3x: docs/performance.md).
  static bool exchanges(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op, int worldSize,
                        const c10d::Backend& inner);

  // A one-element integer SUM (a count, a flag), or between two ranks any
  // one-element SUM the exchange does not take (on an inner backend other
  // than gloo), carries one word instead: the element widened
  // to int64 (float64 for a floating one) beside compactWord. gloo's ring reduces two
  // elements on the cheap path one element takes (most of its 2W segments
  // stay empty: at world 4, one or two elements take 0.7-1.0 ms where three or
  // more take 2.4-4.8), and W words sum exactly (below 2^53): each rank reads
  // W times its own word exactly when the others' sum to it. The widened sum
  // wraps as the narrower type's own would. A floating element is not carried
  // so: widened, a float32 sum among more than two ranks rounds once where the
  // ring rounds W - 1 times, and may differ from it in the last bit (issue 56);
  // between two ranks the ring adds once, and float64's sum narrowed is the
  // element type's own. Every rank that issues the same collective carries it
  // so (compact).
  static bool compact(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op, int worldSize);

  // Among three or more ranks on gloo, an all_reduce the above do not take
  // (floating ones too) carries its words where gloo's ring leaves every user
  // element in its chunk, and so its result bit for bit (RingCarry.h).
  static std::optional<RingCarry> ringCarry(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op,
                                            int worldSize, const c10d::Backend& inner);
  // Among three or more ranks on gloo, a one-element MAX or MIN of float32 or
  // int32 (an early-stop flag) travels inside two int64 words, as keys behind
  // the check (KeyedPick.h): the ring's two-element path, where RingCarry's
  // pair beside the element needs a second chunk.
  static std::optional<KeyedPick> keyedPick(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op,
                                            int worldSize, const c10d::Backend& inner);
  // On gloo, a reduce_scatter_tensor (FSDP2's gradients, floating ones too)
  // is carried as the all_reduce gloo makes of it, in RingCarry's layout.
  static std::optional<RingCarry> ringScatter(const at::Tensor& output, const at::Tensor& input,
                                              const c10d::ReduceOp& op, int worldSize, const c10d::Backend& inner);
  // The word: the top compactBits(W) - 1 bits of `rolling` with bit
  // compactBits(W) - 1 set, so W words stay below 2^53 and none is 0. Ranks
  // that differ pass with probability 2^-(bits - 1) (2^-51 at world 2, 2^-50
  // at 4), and every later check compares again, the rolling hash carrying
  // this collective on.
  static int compactBits(int worldSize);
  static uint64_t compactWord(uint64_t rolling, int worldSize);
  // Whether the reduced word says that `worldSize` ranks carried `word`.
  static bool compactAgree(int64_t reduced, uint64_t word, int worldSize);

  // Pure, for tests: the words of `rolling` under `op`, and whether reduced
  // words (as doubles) say that `worldSize` ranks agree.
  static std::vector<double> encode(uint64_t rolling, const c10d::ReduceOp& op);
  static bool agree(const std::vector<double>& reduced, const c10d::ReduceOp& op, int worldSize);

 private:
  static c10::intrusive_ptr<c10d::Work> exchangeAllreduce(c10d::Backend& inner, at::Tensor user,
                                                          const c10d::AllreduceOptions& opts, uint64_t rolling,
                                                          Verdict verdict);
  // On gloo, an all_gather_into_tensor of a dtype whose element divides 8
  // bytes: [input, rolling hash] through gloo's coalesced all_gather, straight
  // into the user's output (allgather() in the .cpp).
  static c10::intrusive_ptr<c10d::Work> gatherBeside(c10d::Backend& inner, at::Tensor& output, at::Tensor& input,
                                                     uint64_t rolling, int worldSize, Verdict verdict);
  static c10::intrusive_ptr<c10d::Work> keyedAllreduce(c10d::Backend& inner, at::Tensor user,
                                                       const c10d::AllreduceOptions& opts, uint64_t rolling,
                                                       const KeyedPick& plan, Verdict verdict, const Reading& reading);
  static c10::intrusive_ptr<c10d::Work> compactAllreduce(c10d::Backend& inner, at::Tensor user,
                                                         const c10d::AllreduceOptions& opts, uint64_t rolling,
                                                         int worldSize, Verdict verdict);
};

}  // namespace torch_ext
