#pragma once

// CollectiveChecks: a group's check mode applied to each operation, the one
// pipeline every operation takes (GuardBackend::issue): record (the ledger
// and the Operation that describes it), checks before the inner call, the
// route to the inner backend, checks after it, the work the program gets.
// What each mode does is CheckPolicy's; this class does it.
//
//  - verify: collectives are checked by the group's Verifier, in rounds or
//    carried in band by the collective itself (InBandCheck.h); a send is
//    paired with its receive on the helper group (P2PPairing).
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
#include "guard/collective/Operation.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace torch_ext {

struct DeferredReceives;
class P2PPairing;
struct InBandRequest;

class CollectiveChecks {
 public:
  // `helper` may be null when checks are off. `pairing`: check="verify" on
  // send/recv (null in other modes, alone, or stream-ordered); the verifier,
  // where the mode has one, is the group's (GroupState::verifier).
  CollectiveChecks(std::shared_ptr<GroupState> state, c10::intrusive_ptr<c10d::Backend> helper, CheckPolicy policy,
                   std::unique_ptr<P2PPairing> pairing);
  CollectiveChecks(std::shared_ptr<GroupState> state, c10::intrusive_ptr<c10d::Backend> helper, CheckPolicy policy);
  ~CollectiveChecks();

  // What the mode does with an `op` (Operation's strict, strictP2P, audit).
  Operation plan(Op op) const;

  // --- the pipeline, in the order GuardBackend::issue takes it -------------
  // Records `fp` in the ledger and describes the operation: its call site,
  // label and seq, and what the mode does with it (whether it rides in band:
  // `inBand` says whether the collective can carry its check).
  Operation record(Fingerprint fp, c10::DeviceType device, bool streamOrdered, const c10d::Backend& inner,
                   const InBandRequest* inBand, bool coalescing);
  // Before the inner call: strict's checks. Throws the group's
  // CollectiveMismatchError (every rank does) on a difference, or the
  // transport's error if the check itself failed. A strict receive whose
  // sender has not published yet takes Route::Deferred.
  void beforeInner(Operation& op);
  // Route::InBand: the collective, carrying this rank's check.
  c10::intrusive_ptr<c10d::Work> carry(const Operation& op, c10d::Backend& inner, const InBandRequest& inBand);
  // Route::Deferred: queues the receive; returns the work that stands for it.
  // `post` runs (posting the inner receive) once the print is there and
  // pairs. Receives are posted in the order they were issued.
  c10::intrusive_ptr<c10d::Work> deferReceive(std::function<c10::intrusive_ptr<c10d::Work>()> post,
                                              const Operation& op);
  // After the inner call (`issued`: it returned a work): the split audit
  // (never throws: a difference raises a mismatch incident) and a verified
  // send's words.
  void afterInner(const Operation& op, bool issued);
  // The work the program gets: the inner work wrapped (GuardWork), a verified
  // receive held until its words pair.
  c10::intrusive_ptr<c10d::Work> release(const Operation& op, c10::intrusive_ptr<c10d::Work> work);

 private:
  void strictCheck(const Fingerprint& fp, uint64_t seq, uint32_t callSite);
  // Strict send: publishes its print. Strict receive: true when it may be
  // posted now (its sender's print is there and pairs; throws the mismatch
  // on every rank when it does not), false when it must wait for the print.
  bool strictP2PCheck(const Fingerprint& fp, uint64_t ordinal, uint32_t callSite);
  void auditSplits(uint64_t splitSend, uint64_t splitRecv);
  // Waits for a work of the helper backend, or throws the group's failure.
  void waitForHelper(const c10::intrusive_ptr<c10d::Work>& work);

  std::shared_ptr<GroupState> state_;
  c10::intrusive_ptr<c10d::Backend> helper_;
  CheckPolicy policy_;
  std::unique_ptr<P2PPairing> pairing_;
  // Strict receives waiting for their sender's print (CollectiveChecks.cpp).
  std::shared_ptr<DeferredReceives> deferred_;
};

}  // namespace torch_ext
