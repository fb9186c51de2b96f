#pragma once

// Verifier: check="verify" (the default). A collective's result is released
// to the caller (wait(), the future, isCompleted()) only once every rank of
// the group is known to have issued the same collectives up to it. The check
// runs next to the collectives, batched, on the group's helper backend:
//
//  - A round gathers, from every rank, [target, rolling hash at target,
//    all-to-all pairing sums up to target], where target is the last
//    collective this rank has issued. If the ranks' targets agree, one gather
//    decides; otherwise a second gather compares the values at the lowest
//    target S. Every rank reads the same data, so every rank reaches the same
//    verdict: collectives up to S are verified, or they differ.
//  - A round starts when a collective is issued or completes and none is in
//    flight; it runs on the helper backend's threads (the caller only
//    enqueues it): a round covers everything issued while the previous one
//    ran, so DDP's bucket all_reduces of a step cost one or two rounds, and a
//    loop of waited small all_reduces costs one round each (what strict
//    costs). Rounds start at issue, not only at completion, because a
//    mismatch can leave the inner collective pending for good.
//  - A round needs every rank to have issued a collective past the verified
//    one, which the collective itself needs anyway: the check adds no
//    dependency between ranks that the program did not have.
//  - On a difference, every rank gathers the per-collective hashes of the
//    unverified range, finds the first collective that differs, gathers each
//    rank's description and call site of it, and fails the group with the
//    same CollectiveMismatchError text everywhere: no store involved, so it
//    holds when the store (rank 0's process) is going away.

#include "guard/collective/GroupState.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace torch_ext {

class Verifier : public std::enable_shared_from_this<Verifier> {
 public:
  Verifier(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper);

  // Issue side: collective #seq was recorded (any order between threads).
  // Starts a round unless one is in flight (then the next covers it).
  void issued(uint64_t seq, uint64_t rolling, uint64_t hash, uint64_t splitSend, uint64_t splitRecv);
  // A collective completed on this rank (the inner backend's callback): start
  // a round over what is issued, unless one is in flight.
  void kick();

  bool verified(uint64_t seq) const {
    return verifiedSeq_.load(std::memory_order_acquire) >= seq;
  }
  uint64_t verifiedSeq() const {
    return verifiedSeq_.load(std::memory_order_acquire);
  }
  // The check cannot release `seq` any more: a difference was found, or the
  // helper backend failed (a peer is gone); the group's failure follows.
  bool blocked(uint64_t seq) const;

  // Runs `release` once `seq` is verified (at once if it is). Dropped if the
  // check is blocked: the group fails, and `onFailure` is told instead.
  void whenVerified(uint64_t seq, std::function<void()> release,
                    std::function<void(std::exception_ptr)> onFailure);
  // The group failed: every parked release gets the failure instead.
  void failParked(std::exception_ptr err);

  // Waits until everything issued is verified or blocked, or the group failed,
  // at most `timeout`; returns whether everything issued is verified.
  bool drain(std::chrono::milliseconds timeout);
  // No more rounds (the group is shut down).
  void stop();

  struct Stats {
    uint64_t rounds = 0;        // gathers started (second gathers included)
    uint64_t verifiedSeq = 0;
    uint64_t issuedSeq = 0;
  };
  Stats stats() const;

 private:
  struct Issued {
    uint64_t rolling = 0;
    uint64_t hash = 0;
    uint64_t splitSend = 0;
    uint64_t splitRecv = 0;
  };
  struct Parked {
    uint64_t seq;
    std::function<void()> release;
    std::function<void(std::exception_ptr)> onFailure;
  };
  // [target, rolling, cumulative send, cumulative recv] of this rank at seq.
  std::vector<int64_t> valuesAt(uint64_t seq) const;  // mu_ held
  uint64_t contiguousTarget() const;                   // mu_ held
  void maybeStartRound();
  void gather(std::vector<int64_t> mine, std::function<void(const std::vector<int64_t>&)> then);
  void onRound(const std::vector<int64_t>& all, bool second);
  void verifiedUpTo(uint64_t seq);
  void differs(uint64_t seq);
  void reportDifference(uint64_t from, uint64_t upTo, const std::vector<int64_t>& perSeq);
  void helperFailed(const std::string& what);
  // A difference was found at `seq`: dumps, the report logged once, the group failed.
  void failWithReport(GroupState& st, uint64_t seq, const std::string& report);

  std::weak_ptr<GroupState> state_;
  c10::intrusive_ptr<c10d::Backend> helper_;
  const int rank_;
  const int size_;

  mutable std::mutex mu_;
  std::map<uint64_t, Issued> pending_;  // issued, not yet verified
  uint64_t baseSend_ = 0, baseRecv_ = 0;  // pairing sums up to verifiedSeq_
  bool inFlight_ = false;
  bool stopped_ = false;
  uint64_t blockedFrom_ = 0;  // 0: not blocked; else the first seq that cannot be released
  std::vector<Parked> parked_;
  uint64_t rounds_ = 0;
  std::atomic<uint64_t> verifiedSeq_{0};
};

} // namespace torch_ext
