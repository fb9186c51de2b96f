#pragma once

// CollectiveChecks: the checks an operation gets on its way to the inner
// backend, beside the ledger record every operation gets.
//
//  - strict, collectives: before the op, ONE small all_reduce on the helper
//    group tells every rank whether all fingerprints agree; on a difference
//    every rank raises the same CollectiveMismatchError (StrictExchange
//    fetches the full fingerprints) and no data moves.
//  - strict, send/recv: the sender publishes its fingerprint in the store, the
//    receiver compares before receiving. A receive posted before its send (a
//    legal order: every rank's irecv, then its isend) is not held at issue:
//    it returns at once and is posted, on a thread of the checks, once the
//    sender's print is there and pairs.
//  - async, all-to-all: split pairing cannot be seen by the ring check (splits
//    differ per rank by nature), so a tiny all_gather of the pairing sums runs
//    on the helper group next to the op, without delaying it.

#include "guard/collective/Fingerprint.h"
#include "guard/collective/GroupState.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace torch_ext {

struct P2PPrint;
struct DeferredReceives;

// True when `theirs` (the sender's print) pairs with receive `fp`; else the
// difference is published to every rank as a verdict, fails the group, and
// with `raise` is thrown here too (strict receives, P2PPairing).
bool p2pPairsOrFails(const std::shared_ptr<GroupState>& state, const P2PPrint& theirs, const Fingerprint& fp,
                     uint64_t ordinal, int src, const std::string& where, bool raise);

class CollectiveChecks {
 public:
  // `helper` may be null when checks are off (then only plan() is called).
  CollectiveChecks(std::shared_ptr<GroupState> state, c10::intrusive_ptr<c10d::Backend> helper, CheckPolicy policy);

  struct Plan {
    bool strict = false;     // collective: the check all_reduce before the op
    bool strictP2P = false;  // send/recv: fingerprints through the store
    bool audit = false;      // async all-to-all: the split audit next to the op (verify covers splits itself)
    bool beforeIssue() const {
      return strict || strictP2P;
    }
  };
  Plan plan(Op op) const;

  // The strict checks of `plan`, before the op reaches the inner backend.
  // Throws the group's CollectiveMismatchError (every rank does) on a
  // difference, or the transport's error if the check itself failed.
  void beforeIssue(const Plan& plan, const Fingerprint& fp, uint64_t seq, uint64_t ordinal, uint32_t callSite);
  // The split audit of `plan`, once the op is issued; never throws: a
  // difference raises a mismatch incident through the watchdog.
  void afterIssue(const Plan& plan, uint64_t splitSend, uint64_t splitRecv);

  // Strict receive: true when it may be posted now (its sender's print is
  // there and pairs; throws the mismatch on every rank when it does not);
  // false when it must wait for the print (see deferReceive).
  bool receiveReady(const Fingerprint& fp, uint64_t ordinal, uint32_t callSite);
  // Queues a strict receive whose sender has not published yet: returns the
  // work that stands for it; `post` runs (posting the inner receive) once the
  // print is there and pairs. Receives are posted in the order they were issued.
  c10::intrusive_ptr<c10d::Work> deferReceive(std::function<c10::intrusive_ptr<c10d::Work>()> post,
                                              const Fingerprint& fp, uint64_t ordinal, uint32_t callSite);

 private:
  void strictCheck(const Fingerprint& fp, uint64_t seq, uint32_t callSite);
  void strictP2PCheck(const Fingerprint& fp, uint64_t ordinal, uint32_t callSite);
  void auditSplits(uint64_t splitSend, uint64_t splitRecv);
  // Waits for a work of the helper backend, or throws the group's failure.
  void waitForHelper(const c10::intrusive_ptr<c10d::Work>& work);

  std::shared_ptr<GroupState> state_;
  c10::intrusive_ptr<c10d::Backend> helper_;
  CheckPolicy policy_;
  // Strict receives waiting for their sender's print (CollectiveChecks.cpp).
  std::shared_ptr<DeferredReceives> deferred_;
};

}  // namespace torch_ext
