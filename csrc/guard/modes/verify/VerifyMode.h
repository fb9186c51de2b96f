#pragma once

// VerifyMode: check="verify" (the default). A collective's result reaches the
// program only once every rank is known to have issued the same collectives
// up to it: the group's Verifier checks them in rounds next to them
// (Verifier.h) and is the release gate the works ask; a small collective
// carries its own check instead (InBandCheck.h); a send is paired with its
// receive on the helper group (P2PPairing.h); on a stream backend the waiting
// streams are held on the device until the verdict (device/StreamGate.h).
// A lone rank cannot disagree with itself: at world size 1, or without a
// helper backend, nothing is checked or held.

#include "guard/collective/GroupState.h"
#include "guard/collective/Mode.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace torch_ext {

class P2PPairing;
class Verifier;

class VerifyMode : public Mode {
 public:
  static std::shared_ptr<Mode> make(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper);
  VerifyMode(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper);
  ~VerifyMode() override;

  // Only while a collective that carries its check (and so starts no round)
  // is unverified: the rounds cover the others.
  bool comparesInStatusRing() const override;

  bool keepsFingerprint(const Operation& op) const override;
  void recorded(Operation& op, const c10d::Backend& inner, const InBandRequest* inBand, bool coalescing) override;
  c10::intrusive_ptr<c10d::Work> carry(const Operation& op, c10d::Backend& inner, const InBandRequest& inBand) override;
  void afterInner(const Operation& op, bool issued) override;
  c10::intrusive_ptr<c10d::Work> release(const Operation& op, c10::intrusive_ptr<c10d::Work> work) override;

  ReleaseGate* gate() override;
  void drain(std::chrono::milliseconds bound) override;
  void shutdown(std::chrono::milliseconds bound) override;
  void dropBackends() override;
  void groupFailed(std::exception_ptr err) override;
  std::vector<std::pair<std::string, uint64_t>> counters() const override;

 private:
  // A send or receive whose words go on the helper group (CPU transports).
  bool paired(const Operation& op) const;

  GroupState& st_;                      // the group, which owns this mode
  std::shared_ptr<Verifier> verifier_;  // null: nothing to check (world size 1, no helper)
  std::unique_ptr<P2PPairing> pairing_;
  // The verifier's exchange, for the rare KeyedPick that needs every rank's element (one per group).
  std::shared_ptr<const std::function<std::vector<uint32_t>(uint32_t, uint64_t)>> exchange_;
};

}  // namespace torch_ext
