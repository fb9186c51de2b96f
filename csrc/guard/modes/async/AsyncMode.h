#pragma once

// AsyncMode: check="async". Nothing waits for a check: the collectives are
// compared after the fact, by the rolling fingerprints each rank's status
// carries to its ring neighbours (the watchdog's exchange, about a second),
// so a wrong result can be read first. An all-to-all's split sizes differ per
// rank by nature, which the ring cannot see: a tiny all_gather of the pairing
// sums runs on the helper group next to the op, without delaying it.

#include "guard/collective/GroupState.h"
#include "guard/collective/Mode.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <memory>

namespace torch_ext {

class AsyncMode : public Mode {
 public:
  // `helper` may be null (no split audit then).
  static std::shared_ptr<Mode> make(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper);
  AsyncMode(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper);
  // Its helper goes to a later sweep: the mode may be destroyed with its group
  // on a worker thread of that helper (WorkRetirement::keep).
  ~AsyncMode() override;

  bool comparesInStatusRing() const override {
    return true;
  }
  void afterInner(const Operation& op, bool issued) override;
  void dropBackends() override;

 private:
  // Never throws: a difference raises a mismatch incident.
  void auditSplits(uint64_t splitSend, uint64_t splitRecv);

  GroupState& st_;  // the group, which owns this mode
  std::weak_ptr<GroupState> weak_;
  c10::intrusive_ptr<c10d::Backend> helper_;
};

}  // namespace torch_ext
