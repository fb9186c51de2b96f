#pragma once

// StrictMode: check="strict". No data moves before every rank is known to
// have issued the same operation.
//
//  - Collectives: before each, ONE small all_reduce on the helper group tells
//    every rank whether all fingerprints agree (StrictMode.cpp); on a
//    difference every rank raises the same CollectiveMismatchError
//    (StrictExchange fetches the full fingerprints) and no data moves.
//  - Send/recv: the sender publishes its fingerprint in the store, the
//    receiver compares before receiving. A receive posted before its send is
//    not held at issue (DeferredReceives.h).
//  - Call paths are compared too unless call_paths=off.

#include "guard/collective/GroupState.h"
#include "guard/collective/Mode.h"
#include "guard/modes/strict/DeferredReceives.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <memory>

namespace torch_ext {

class StrictMode : public Mode {
 public:
  // Throws when `helper` is null: the check collective needs it.
  static std::shared_ptr<Mode> make(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper);
  StrictMode(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper);
  // Its helper goes to a later sweep: the mode may be destroyed with its group
  // on a worker thread of that helper (WorkRetirement::keep).
  ~StrictMode() override;

  bool keepsFingerprint(const Operation& op) const override;
  void beforeInner(Operation& op) override;
  c10::intrusive_ptr<c10d::Work> deferReceive(std::function<c10::intrusive_ptr<c10d::Work>()> post,
                                              const Operation& op) override;
  void dropBackends() override;

 private:
  // The check collective; throws every rank's same report on a difference.
  void check(const Fingerprint& fp, uint64_t seq, uint32_t callSite);
  // A send publishes its print (true). A receive: true when it may be posted
  // now (its sender's print is there and pairs; throws the mismatch on every
  // rank when it does not), false when it must wait for the print.
  bool checkPair(const Fingerprint& fp, uint64_t ordinal, uint32_t callSite);
  // Waits for a work of the helper backend, or throws the group's failure.
  void waitForHelper(const c10::intrusive_ptr<c10d::Work>& work);

  GroupState& st_;  // the group, which owns this mode
  std::weak_ptr<GroupState> weak_;
  c10::intrusive_ptr<c10d::Backend> helper_;
  std::shared_ptr<DeferredReceives> deferred_ = std::make_shared<DeferredReceives>();
};

}  // namespace torch_ext
