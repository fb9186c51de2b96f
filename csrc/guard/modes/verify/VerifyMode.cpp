#include "guard/modes/verify/VerifyMode.h"

#include "guard/modes/verify/InBandCheck.h"
#include "guard/modes/verify/P2PPairing.h"
#include "guard/modes/verify/Verifier.h"

#include <ATen/ATen.h>

namespace torch_ext {

namespace {

// Tags of the helper group's point-to-point messages that exchange a
// KeyedPick's elements: one per collective seq (modulo 2^24), above the tags
// programs use (docs/architecture.md, Known limits). gloo keeps point-to-point
// slots apart from its collectives', so the rounds never meet them.
constexpr int kExchangeTags = 0x7E000000;

// Every rank's 32-bit element, sent to and received from every other rank of
// the helper group, which has the user group's ranks.
std::vector<uint32_t> exchangeOn(c10d::Backend& helper, uint32_t mine, uint64_t seq) {
  const int world = helper.getSize();
  const int me = helper.getRank();
  const int tag = kExchangeTags | static_cast<int>(seq & 0xFFFFFF);
  at::Tensor own = at::full({1}, static_cast<int64_t>(mine), at::kLong);
  std::vector<at::Tensor> from(world);
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (int p = 0; p < world; ++p) {
    if (p == me) continue;
    std::vector<at::Tensor> out{own};
    works.push_back(helper.send(out, p, tag));
    from[p] = at::empty({1}, at::kLong);
    std::vector<at::Tensor> in{from[p]};
    works.push_back(helper.recv(in, p, tag));
  }
  for (auto& w : works) w->wait();
  std::vector<uint32_t> all(world, mine);
  for (int p = 0; p < world; ++p) {
    if (p != me) all[p] = static_cast<uint32_t>(from[p].item<int64_t>());
  }
  return all;
}

}  // namespace

std::shared_ptr<Mode> VerifyMode::make(const std::shared_ptr<GroupState>& state,
                                       c10::intrusive_ptr<c10d::Backend> helper) {
  return std::make_shared<VerifyMode>(state, std::move(helper));
}

VerifyMode::VerifyMode(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper)
    : Mode(Answers{true, true, state->config().callPaths == CallPathMode::On}), st_(*state) {
  if (!helper || state->id().size <= 1) return;
  helper_ = c10::weak_intrusive_ptr<c10d::Backend>(helper);
  verifier_ = std::make_shared<Verifier>(state, helper);
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
  auto exchange = [helper = helper_, seq = op.seq](uint32_t mine) {
    c10::intrusive_ptr<c10d::Backend> h = helper.lock();
    TORCH_CHECK(h, "torch_ext: the group's helper backend is gone before collective #", seq, " could be read");
    return exchangeOn(*h, mine, seq);
  };
  return InBandCheck::issue(inBand, inner, op.rolling, st_.id().size, std::move(verdict), std::move(exchange));
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
