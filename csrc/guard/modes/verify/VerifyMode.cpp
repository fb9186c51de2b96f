#include "guard/modes/verify/VerifyMode.h"

#include "guard/modes/verify/InBandCheck.h"
#include "guard/modes/verify/P2PPairing.h"
#include "guard/modes/verify/Verifier.h"

namespace torch_ext {

std::shared_ptr<Mode> VerifyMode::make(const std::shared_ptr<GroupState>& state,
                                       c10::intrusive_ptr<c10d::Backend> helper) {
  return std::make_shared<VerifyMode>(state, std::move(helper));
}

VerifyMode::VerifyMode(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper)
    : Mode(Answers{true, true, state->config().callPaths == CallPathMode::On}), st_(*state) {
  if (!helper || state->id().size <= 1) return;
  verifier_ = std::make_shared<Verifier>(state, helper);
  std::weak_ptr<Verifier> weak = verifier_;
  exchange_ = std::make_shared<const InBandCheck::Exchange>([weak](uint32_t mine, uint64_t seq) {
    std::shared_ptr<Verifier> v = weak.lock();
    TORCH_CHECK(v, "torch_ext: collective #", seq, " could not be read: its group is gone");
    return v->exchange(mine, seq);
  });
  pairing_ = std::make_unique<P2PPairing>(state, helper);
  if (state->streamOrdered() && state->config().streamGate != StreamGateMode::Off) {
    state->setStreamGate(std::make_shared<device::StreamGate>(state->config().streamGate == StreamGateMode::On));
  }
}

VerifyMode::~VerifyMode() = default;

bool VerifyMode::comparesInStatusRing() const {
  return verifier_ != nullptr && verifier_->carriedUnverified();
}

bool VerifyMode::paired(const Operation& op) const {
  return pairing_ && (op.op == Op::Send || op.op == Op::Recv) && !op.streamOrdered;
}

bool VerifyMode::keepsFingerprint(const Operation& op) const {
  return paired(op);
}

void VerifyMode::recorded(Operation& op, const c10d::Backend& inner, const InBandRequest* inBand, bool coalescing) {
  if (verifier_ == nullptr || op.seq == 0) return;
  // Carried by the collective itself (InBandCheck.h): decided from what every
  // rank issuing the same collective has alike.
  if (inBand != nullptr && !coalescing && !op.streamOrdered && InBandCheck::carries(*inBand, inner, st_.id().size)) {
    op.route = Route::InBand;
  }
  verifier_->issued(op.seq, op.rolling, op.hash, op.splitSend, op.splitRecv, op.route == Route::InBand);
}

c10::intrusive_ptr<c10d::Work> VerifyMode::carry(const Operation& op, c10d::Backend& inner,
                                                 const InBandRequest& inBand) {
  std::weak_ptr<Verifier> weak = verifier_;
  auto verdict = [weak, seq = op.seq](bool agree) {
    if (auto v = weak.lock()) v->inBandVerdict(seq, agree);
  };
  return InBandCheck::issue(inBand, inner, op.rolling, st_.id().size, std::move(verdict),
                            InBandCheck::Reading{exchange_, op.seq});
}

void VerifyMode::afterInner(const Operation& op, bool issued) {
  if (issued && op.op == Op::Send && paired(op)) pairing_->sent(*op.kept, op.site);
}

c10::intrusive_ptr<c10d::Work> VerifyMode::release(const Operation& op, c10::intrusive_ptr<c10d::Work> work) {
  if (op.op == Op::Recv && paired(op)) return pairing_->received(std::move(work), *op.kept, op.ordinal, op.site);
  return work;
}

ReleaseGate* VerifyMode::gate() {
  return verifier_.get();
}

void VerifyMode::drain(std::chrono::milliseconds bound) {
  if (verifier_ == nullptr || st_.failed()) return;
  if (!verifier_->drain(bound) && verifier_->blocked(verifier_->verifiedSeq() + 1)) {
    st_.waitUntil([] { return false; }, bound);  // the report is on its way
  }
}

void VerifyMode::shutdown(std::chrono::milliseconds bound) {
  if (verifier_ == nullptr) return;
  if (!st_.failed()) {
    drain(bound);
    verifier_->stop();
  }
  // No stream stays held by a group that is gone: what the drain did not
  // verify passes poisoned (the group failed, or its verdict never came).
  if (st_.streamGate() != nullptr) st_.streamGate()->poison(verifier_->firstUnverifiable());
}

void VerifyMode::dropBackends() {
  if (pairing_) pairing_->release();  // the helper, and the words of sends still in flight
  pairing_.reset();
}

void VerifyMode::groupFailed(std::exception_ptr err) {
  if (verifier_ == nullptr) return;
  // Held streams pass now, their unverified results overwritten (the report
  // is written already; the inner backends are aborted next).
  if (st_.streamGate() != nullptr) st_.streamGate()->poison(verifier_->firstUnverifiable());
  // Futures whose collective completed but awaited the check's release.
  verifier_->failParked(std::move(err));
}

std::vector<std::pair<std::string, uint64_t>> VerifyMode::counters() const {
  if (verifier_ == nullptr) return {};
  const Verifier::Stats s = verifier_->stats();
  return {{"rounds", s.rounds},
          {"gather_us", s.gatherMicros},
          {"burst", s.burst},
          {"quiet_us", s.quietMicros},
          {"mispredictions", s.mispredictions},
          {"verified_seq", s.verifiedSeq},
          {"issued_seq", s.issuedSeq},
          {"in_band", s.inBand}};
}

}  // namespace torch_ext
