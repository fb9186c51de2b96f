#pragma once

// CollectiveChecks: the one pipeline every operation takes (GuardBackend::
// issue): record (the ledger and the Operation that describes it), the
// checks before the inner call, the route to the inner backend, the checks
// after it, the work the program gets. What runs at each step is the group's
// mode's (Mode.h: off, async, strict and verify, each in its folder under
// csrc/guard/modes/); this class calls it in order and asks no mode what it
// is.

#include "guard/collective/Fingerprint.h"
#include "guard/collective/GroupState.h"
#include "guard/collective/Mode.h"
#include "guard/collective/Operation.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <functional>
#include <memory>

namespace torch_ext {

class CollectiveChecks {
 public:
  // The group's mode is set on `state` (modes/Modes.h, installMode).
  explicit CollectiveChecks(std::shared_ptr<GroupState> state);

  // --- the pipeline, in the order GuardBackend::issue takes it -------------
  // Records `fp` in the ledger and describes the operation: its call site,
  // label and seq, and the route the mode picks (`inBand`: the collective
  // could carry its check; null if not).
  Operation record(Fingerprint&& fp, c10::DeviceType device, bool streamOrdered, const c10d::Backend& inner,
                   const InBandRequest* inBand, bool coalescing);
  // Before the inner call. Throws the group's CollectiveMismatchError (every
  // rank does) on a difference, or the transport's error if the check itself
  // failed; may change the route (Route::Deferred).
  void beforeInner(Operation& op) {
    mode_->beforeInner(op);
  }
  // Route::InBand: the collective, carrying this rank's check.
  c10::intrusive_ptr<c10d::Work> carry(const Operation& op, c10d::Backend& inner, const InBandRequest& inBand) {
    return mode_->carry(op, inner, inBand);
  }
  // Route::Deferred: queues the receive; `post` posts it later. Returns the
  // work that stands for it.
  c10::intrusive_ptr<c10d::Work> deferReceive(std::function<c10::intrusive_ptr<c10d::Work>()> post,
                                              const Operation& op) {
    return mode_->deferReceive(std::move(post), op);
  }
  // After the inner call (`issued`: it returned a work). Never throws.
  void afterInner(const Operation& op, bool issued) {
    mode_->afterInner(op, issued);
  }
  // The work the program gets: the inner work wrapped (GuardWork), then as
  // the mode hands it out.
  c10::intrusive_ptr<c10d::Work> release(const Operation& op, c10::intrusive_ptr<c10d::Work> work);

 private:
  std::shared_ptr<GroupState> state_;
  std::shared_ptr<Mode> mode_;
};

}  // namespace torch_ext
