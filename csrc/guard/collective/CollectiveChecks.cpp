#include "guard/collective/CollectiveChecks.h"

#include "guard/collective/CallSite.h"
#include "guard/collective/GuardWork.h"
#include "guard/collective/LabelTable.h"

namespace torch_ext {

CollectiveChecks::CollectiveChecks(std::shared_ptr<GroupState> state)
    : state_(std::move(state)), mode_(state_->modePtr()) {}

Operation CollectiveChecks::record(Fingerprint&& fp, c10::DeviceType device, bool streamOrdered,
                                   const c10d::Backend& inner, const InBandRequest* inBand, bool coalescing) {
  fp.device = device;  // the device whose inner backend runs it (a barrier has no tensor to tell)
  Operation o;
  o.op = fp.op;
  o.device = device;
  o.streamOrdered = streamOrdered;
  o.site = state_->config().callSites ? CallSites::instance().capture() : 0;
  o.label = LabelTable::current();  // one thread_local load
  // A metric sync: the metric is part of what ranks must agree on (two ranks
  // syncing different metrics of one shape would mix their values silently).
  if (const uint64_t identity = LabelTable::currentIdentity(); identity != 0 && !isP2P(o.op)) {
    fp.hash = detail::combine(fp.hash, identity);
  }
  // The call path, where the mode compares it: look-alikes from other lines differ.
  if (o.site != 0 && !isP2P(o.op) && mode_->comparesCallPaths()) {
    fp.hash = detail::combine(fp.hash, CallSites::instance().pathKey(o.site));
  }
  o.hash = fp.hash;
  o.splitSend = fp.splitSend;
  o.splitRecv = fp.splitRecv;
  if (mode_->keepsFingerprint(o)) o.kept = fp;
  o.id = state_->ledger().record(std::move(fp), o.site, &o.seq, &o.ordinal, &o.rolling, o.label);
  mode_->recorded(o, inner, inBand, coalescing);
  return o;
}

c10::intrusive_ptr<c10d::Work> CollectiveChecks::release(const Operation& op, c10::intrusive_ptr<c10d::Work> work) {
  return mode_->release(
      op, GuardWork::wrap(state_, std::move(work), op.id, op.seq, op.op, op.streamOrdered, op.route == Route::InBand));
}

}  // namespace torch_ext
