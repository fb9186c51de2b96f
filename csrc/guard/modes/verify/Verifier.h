#pragma once

// Verifier: check="verify" (the default). A collective's result is released
// to the caller (wait(), the future, isCompleted()) only once every rank of
// the group is known to have issued the same collectives up to it. The check
// runs next to the collectives, batched, on the group's helper backend:
//
//  - A round gathers, from every rank, its target (the last collective it
//    has issued) and [rolling hash, all-to-all pairing sums] at each of its
//    last four collectives. The ranks compare at the lowest target S: one
//    gather decides when every rank is fewer than four collectives past S;
//    otherwise a second gather compares the values at S. Every rank reads the
//    same data, so every rank reaches the same verdict: collectives up to S
//    are verified, or they differ.
//  - A round runs on the helper backend's threads (the caller only enqueues
//    it) and covers everything issued before it starts. By default one
//    starts whenever a collective is issued or completes and none is in
//    flight, and whenever a result is asked for (wait(), is_completed(), the
//    exit drain). On a 2-core machine a round costs 100-300 us of CPU, so
//    DDP's 24 bucket all_reduces of a step, one round each, cost it about 5%.
//    Pacing: when the issuing comes in bursts of the same length, separated
//    by quiet gaps, three bursts in a row (DDP's buckets of a step), the
//    verifier predicts the last collective of the next burst and starts the
//    round there (with the last bucket, overlapping it: one round per step).
//    Bursts inside which a result is asked for (FSDP2 waits for each layer's
//    all_gather) are not predicted: their rounds start at issue, overlapping;
//    results asked for still start one at once, and a burst that goes quiet
//    before its predicted end gets its round from the pacer thread then and
//    ends the prediction (a collective nobody waits for, e.g. one a mismatch
//    left pending for good, still gets its verdict).
//  - A round needs every rank to have issued a collective past the verified
//    one, which the collective itself needs anyway: the check adds no
//    dependency between ranks that the program did not have.
//  - On a difference, every rank gathers the per-collective hashes of the
//    unverified range, finds the first collective that differs, gathers each
//    rank's description and call site of it, and fails the group with the
//    same CollectiveMismatchError text everywhere: no store involved, so it
//    holds when the store (rank 0's process) is going away.

#include "guard/collective/GroupState.h"
#include "guard/collective/ReleaseGate.h"
#include "guard/modes/verify/BurstPacing.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace torch_ext {

class Verifier : public ReleaseGate, public std::enable_shared_from_this<Verifier> {
 public:
  // `nowNs`: the steady clock the pacing reads (a test's made-up one; steadyNs by default).
  using NowNs = std::function<int64_t()>;
  Verifier(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper, NowNs nowNs = NowNs());

  Verifier(const Verifier&) = delete;
  Verifier& operator=(const Verifier&) = delete;
  ~Verifier() override;

  // Issue side: collective #seq was recorded (any order between threads).
  // Starts a round unless one is in flight or bursts are predicted (Pacing).
  // `inBand`: the collective carries its own check (InBandCheck.h): no round
  // for it.
  void issued(uint64_t seq, uint64_t rolling, uint64_t hash, uint64_t splitSend, uint64_t splitRecv,
              bool inBand = false);
  // An in-band collective #seq completed: every rank read the same reduced
  // check words, and they say whether all ranks' rolling hashes at #seq agree.
  // Agreeing verifies up to #seq here; otherwise a round decides (and reports).
  void inBandVerdict(uint64_t seq, bool agree);
  // Every rank's 32-bit element of carried collective #seq, in group rank
  // order: sent to and received from every other rank on the helper group
  // (point-to-point, under a tag of #seq's), where a KeyedPick's words cannot
  // tell gloo's result (KeyedPick.h). Every rank calls it for #seq, or none.
  // Raises the group's failure, or what the helper raised, within
  // kExchangeWithin.
  std::vector<uint32_t> exchange(uint32_t mine, uint64_t seq);
  static constexpr std::chrono::milliseconds kExchangeWithin{30'000};
  // Tags of those messages: one per seq modulo 2^24, above the tags programs
  // use (docs/architecture.md, Known limits). gloo keeps point-to-point slots
  // apart from its collectives', so the rounds never meet them.
  static constexpr int kExchangeTags = 0x7E000000;
  // Some collective that carries its check is not verified yet. Such a
  // collective starts no round, so one whose peers are in another collective
  // (which gloo cannot pair: it never completes) is found by the status ring
  // while this holds (Watchdog::exchange), as in async mode.
  bool carriedUnverified() const {
    return lastCarried_.load(std::memory_order_relaxed) > verifiedSeq_.load(std::memory_order_relaxed);
  }
  // A collective completed on this rank (the inner backend's callback):
  // start a round over what is issued, unless one is in flight or bursts are
  // predicted, or nothing issued past the verified needs one (collectives
  // that carry their check get their verdicts with their data: async metric
  // all_reduces in flight behind the one that completed are not rounds' work).
  void kick() override;
  // Someone needs #seq's verdict now (wait(), is_completed(), the exit drain):
  // a round starts at once, or right after the one in flight.
  void want(uint64_t seq) override;

  bool verified(uint64_t seq) const override {
    return verifiedSeq_.load(std::memory_order_acquire) >= seq;
  }
  uint64_t verifiedSeq() const {
    return verifiedSeq_.load(std::memory_order_acquire);
  }
  // The first collective that will never be verified once the check is
  // blocked: after a difference, the first that differs (the ones before it
  // agree on every rank, though their results were not released yet).
  uint64_t firstUnverifiable() const {
    return std::max(verifiedSeq_.load(std::memory_order_acquire), agreedSeq_.load(std::memory_order_acquire)) + 1;
  }
  // The check cannot release `seq` any more: a difference was found, or the
  // helper backend failed (a peer is gone); the group's failure follows.
  bool blocked(uint64_t seq) const override;

  // Runs `release` once `seq` is verified (at once if it is). Dropped if the
  // check is blocked: the group fails, and `onFailure` is told instead.
  void whenVerified(uint64_t seq, std::function<void()> release,
                    std::function<void(std::exception_ptr)> onFailure) override;
  // The group failed: every parked release gets the failure instead.
  void failParked(std::exception_ptr err);

  // Waits until everything issued is verified or blocked, or the group failed,
  // at most `timeout`; returns whether everything issued is verified.
  bool drain(std::chrono::milliseconds timeout);
  // No more rounds (the group is shut down).
  void stop();

  struct Stats {
    uint64_t rounds = 0;       // gathers started (second gathers included)
    uint64_t burst = 0;        // the learned burst length (collectives between quiet gaps)
    uint64_t quietMicros = 0;  // the gap that ends a burst now
    uint64_t mispredictions = 0;
    uint64_t gatherMicros = 0;  // summed time from a gather's start to its result
    uint64_t verifiedSeq = 0;
    uint64_t issuedSeq = 0;
    uint64_t inBand = 0;  // in-band verdicts that verified (InBandCheck.h)
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
  // [seq, then (rolling, cumulative send, cumulative recv) at seq, seq - 1, ...
  // for the window of this rank's last collectives], 0 below the verified.
  std::vector<int64_t> valuesAt(uint64_t seq) const;  // mu_ held
  uint64_t contiguousTarget() const;                  // mu_ held
  // Starts a round if none is in flight and one is wanted past the verified.
  void maybeStartRound();
  void pacerLoop();
  void gather(std::vector<int64_t> mine, std::function<void(const std::vector<int64_t>&)> then);
  void onRound(const std::vector<int64_t>& all, bool second);
  // `fromRound`: a round's verdict (its in-flight flag is cleared). `carried`:
  // the collective whose in-band verdict this is (0 for a round's).
  void verifiedUpTo(uint64_t seq, bool fromRound, uint64_t carried = 0);
  void differs(uint64_t seq, uint64_t from);
  void reportDifference(uint64_t from, uint64_t upTo, const std::vector<int64_t>& perSeq);
  void helperFailed(const std::string& what);
  // A difference was found: the desk renders and dumps it, the report is logged once, the group fails.
  void failWithReport(GroupState& st, Difference difference);

  std::weak_ptr<GroupState> state_;
  c10::intrusive_ptr<c10d::Backend> helper_;
  const int rank_;
  const int size_;

  mutable std::mutex mu_;
  std::map<uint64_t, Issued> pending_;    // issued, not yet verified
  uint64_t baseSend_ = 0, baseRecv_ = 0;  // pairing sums up to verifiedSeq_
  bool inFlight_ = false;
  uint64_t wantedSeq_ = 0;  // a round is wanted up to here (starts when none is in flight)

  // Pacing (see the top and BurstPacing.h), on the clock nowNs_ reads.
  const NowNs nowNs_;
  BurstPacing pacing_;
  std::condition_variable pacerCv_;
  bool pacerIdle_ = false;  // the pacer waits for an issue (nothing unwanted pending)
  std::thread pacer_;
  bool stopped_ = false;
  std::atomic<uint64_t> inBandVerified_{0};
  std::atomic<uint64_t> lastCarried_{0};  // the last collective issued that carries its check
  uint64_t lastUncarried_ = 0;            // the last collective issued that needs a round
  uint64_t agreedPastSplit_ = 0;          // an in-band agreement waiting for a round past an uneven all_to_all
  std::atomic<uint64_t> agreedSeq_{0};    // set by a difference's scan: the last collective that agrees
  uint64_t blockedFrom_ = 0;              // 0: not blocked; else the first seq that cannot be released
  std::vector<Parked> parked_;
  uint64_t rounds_ = 0;
  std::atomic<uint64_t> gatherMicros_{0};
  std::atomic<uint64_t> verifiedSeq_{0};
};

}  // namespace torch_ext
