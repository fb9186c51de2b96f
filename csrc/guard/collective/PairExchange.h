#pragma once

// PairExchange: an all_reduce between two ranks as one message each way, with
// the check in it (issue 40; InBandCheck decides which all_reduces take it).
//
// Each rank sends the other [its rolling hash, its data's length, its data]
// with the inner backend's send/recv under kTag, and reduces the two itself.
// gloo's ring sends two messages in turn, and one more per non-empty segment
// of 2W (two elements cost twice one), so in a loop of syncs the exchange
// costs less than the all_reduce it replaces (right after CPU work on cores
// the ranks share, gloo's send/recv hand-offs cost more than its ring:
// docs/performance.md). The reduction is gloo's, in gloo's operand order
// for each element (the ring's rank 0 reduces the first half, its own operand
// first): a sum is the same in either order (IEEE addition is commutative,
// integers wrap alike), and a MAX/MIN keeps gloo's choice between a NaN and a
// number, or 0 and -0. The verdict compares the whole hash and the length:
// the same on both ranks.
//
// The receive is posted for the longest message an exchange sends
// (kMaxDataBytes and the header): a peer whose exchange differs in length is
// told apart by the header, where a message longer than the receive stops
// gloo's transport thread (watchdog/TerminateHandler) with the pair's lock
// held, and the issuing thread with it at its next send.
//
// gloo's send/recv works have no future and complete only in their wait(), so
// exactly one thread waits on them: the caller's wait(), or, for a work nobody
// waits on at once (isCompleted() from the watchdog's poll, getFuture() from a
// comm hook), a thread of the work's own. A group failure's abort() releases
// either. A receive that did not complete is never destroyed: gloo's buffer
// waits in its destructor for the transport thread to let go of it, which a
// stopped thread never does.

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <functional>

namespace torch_ext {

class PairExchange {
 public:
  // The p2p tag the exchanges use on the inner backend: a user's own send or
  // recv on the same group under it would pair with one, so the guard refuses
  // those (GuardBackend::checkUserTag).
  static constexpr int kTag = 0x7E570000;
  // The longest data an exchange carries (the receive's size, with the header).
  static constexpr int64_t kMaxDataBytes = 64 * 1024;

  enum class Combine : uint8_t { Sum, Max, Min };
  using Verdict = std::function<void(bool)>;

  // Exchanges `user` (one dense CPU float32/float64/int32/int64 tensor of at
  // most kMaxDataBytes) with the other rank of `inner`'s two. The work
  // completes once both messages are through; then `user` holds the
  // reduction if verdict(true) was called (the peer's hash and length are
  // this rank's), and is left as it was if verdict(false).
  static c10::intrusive_ptr<c10d::Work> issue(c10d::Backend& inner, at::Tensor user, Combine combine, uint64_t rolling,
                                              Verdict verdict);
  // Between two ranks: user := the reduction of rank 0's and rank 1's
  // operands (user's element type and length, each read from its bytes), in
  // gloo's operand order for each element, as gloo's ring computes it. Also
  // for an exchange carried by the inner all_reduce (InBandCheck::packs).
  static void reduceInGlooOrder(const at::Tensor& user, const uint8_t* rankZero, const uint8_t* rankOne,
                                Combine combine);
  // SUM, MAX or MIN (the three an exchange takes).
  static Combine combineOf(const c10d::ReduceOp& op);
  // Whether `work` is an exchange's: its future is made on request only.
  static bool isExchange(const c10d::Work& work);
};

}  // namespace torch_ext
