#include "guard/modes/strict/StrictMode.h"

#include "guard/collective/WorkRetirement.h"

#include "guard/Errors.h"
#include "guard/collective/CallSite.h"
#include "guard/collective/IssuedWords.h"
#include "guard/collective/LabelTable.h"
#include "guard/collective/StoreExchange.h"
#include "guard/modes/strict/StrictExchange.h"
#include "guard/report/Messages.h"
#include "guard/store/StoreKeys.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace torch_ext {

namespace {

// The call site and the label active on this (the issuing) thread, as the
// strict checks' reports name them.
std::string describeSite(uint32_t callSite) {
  const std::vector<Frame> frames = CallSites::instance().frames(callSite);
  return describeCallSite(frames) + labelSuffix(LabelTable::instance().get(LabelTable::current()), frames);
}

}  // namespace

std::shared_ptr<Mode> StrictMode::make(const std::shared_ptr<GroupState>& state,
                                       c10::intrusive_ptr<c10d::Backend> helper) {
  TORCH_CHECK(helper, "guard: strict mode needs a helper backend for its check collective");
  return std::make_shared<StrictMode>(state, std::move(helper));
}

StrictMode::StrictMode(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper)
    : Mode(Answers{true, true, state->config().callPaths != CallPathMode::Off}),
      st_(*state),
      weak_(state),
      helper_(std::move(helper)) {}

bool StrictMode::keepsFingerprint(const Operation& op) const {
  return op.op != Op::RecvAnySource;  // its source is known only once it completes
}

void StrictMode::beforeInner(Operation& op) {
  if (!isP2P(op.op)) {
    check(*op.kept, op.seq, op.site);
  } else if (op.op != Op::RecvAnySource && !checkPair(*op.kept, op.ordinal, op.site)) {
    op.route = Route::Deferred;
  }
}

c10::intrusive_ptr<c10d::Work> StrictMode::deferReceive(std::function<c10::intrusive_ptr<c10d::Work>()> post,
                                                        const Operation& op) {
  return deferred_->defer(weak_.lock(), *op.kept, op.ordinal, describeSite(op.site), std::move(post));
}

StrictMode::~StrictMode() {
  WorkRetirement::instance().keep(std::move(helper_));
}

void StrictMode::dropBackends() {
  helper_.reset();
}

void StrictMode::waitForHelper(const c10::intrusive_ptr<c10d::Work>& work) {
  // Waited on through its future, so a group failure (a lost store, a
  // deadline) ends the wait: gloo's own wait() is not released by abort(), and
  // a peer that froze would hold this thread forever.
  auto fut = work->getFuture();
  std::weak_ptr<GroupState> weak = weak_;
  fut->addCallback([weak](c10::ivalue::Future&) {
    if (auto st = weak.lock()) st->notify();
  });
  st_.waitUntil([&] { return fut->completed(); }, std::chrono::milliseconds(0));
  if (!fut->completed()) st_.throwFailure("");
  if (fut->hasError()) std::rethrow_exception(fut->exception_ptr());
}

void StrictMode::check(const Fingerprint& fp, uint64_t seq, uint32_t callSite) {
  // ONE small all_reduce(MAX) of [v, ~v], v = the fingerprint bound to its seq:
  // every rank gets max(v) and, as ~max(~v), min(v), so all ranks see the same
  // verdict (equal iff min == max). A 2-element all_reduce is the cheapest
  // agreement primitive on gloo (an all_gather costs 3x more at 4 ranks).
  // With two ranks one element is enough: v0 + v1 == 2 * v_self (mod 2^64)
  // holds on both ranks exactly when v0 == v1.
  const int64_t v = static_cast<int64_t>(detail::combine(fp.hash, seq));
  const bool pair = st_.id().size == 2;
  at::Tensor t = at::empty({pair ? 1 : 2}, at::TensorOptions().dtype(at::kLong));
  auto* p = t.data_ptr<int64_t>();
  p[0] = v;
  if (!pair) p[1] = ~v;
  c10d::AllreduceOptions opts;
  opts.reduceOp = pair ? c10d::ReduceOp::SUM : c10d::ReduceOp::MAX;
  std::vector<at::Tensor> ts{t};
  waitForHelper(helper_->allreduce(ts, opts));
  bool same = pair ? static_cast<uint64_t>(p[0]) == 2 * static_cast<uint64_t>(v) : p[0] == ~p[1];
  bool paired = true;
  if (same && isAllToAll(fp.op)) {
    // Splits differ per rank by nature: their pairing sums must add up.
    at::Tensor d = at::empty({1}, at::TensorOptions().dtype(at::kLong));
    d.data_ptr<int64_t>()[0] = static_cast<int64_t>(fp.splitSend - fp.splitRecv);
    std::vector<at::Tensor> ds{d};
    waitForHelper(helper_->allreduce(ds, c10d::AllreduceOptions()));
    paired = d.data_ptr<int64_t>()[0] == 0;
  }
  if (same && paired) return;
  // Slow path, taken by every rank since all saw the same reduction: fetch the
  // full fingerprints through the store and raise the same report everywhere.
  // This rank's metric syncs around #seq (the op at hand carries the current label).
  const LabelTable& labels = LabelTable::instance();
  const Ledger& ledger = st_.ledger();
  auto metricAt = [&](uint64_t s) -> std::optional<std::string> {
    if (s == seq) return labels.metricOf(LabelTable::current());
    auto e = ledger.bySeq(s);
    return e ? labels.metricOf(e->label) : std::nullopt;
  };
  OpWords mine = issuedWords(fp, callSite, LabelTable::current(), fp.hash);
  mine.metricSync = metricAt(seq).has_value();
  mine.metrics = metricRunAround(seq, seq, seq, metricAt);
  Difference d;
  d.group = st_.label();
  d.groupSize = st_.id().size;
  d.seq = seq;
  d.ops = exchangeStrictFingerprints(st_, mine, seq, &d.metrics);
  d.note = same ? messages::kSplitsDoNotPair : "";
  // Shown when the op is a metric sync on some rank; every rank's list is known.
  bool metricSync = false;
  for (auto& m : d.metrics) {
    metricSync = metricSync || m.known;
    m.known = true;
  }
  if (!metricSync) d.metrics.clear();
  // As verify's: the desk renders it, every rank dumps (TORCH_EXT_DUMP_DIR), group rank 0 logs, the group fails.
  st_.incidents().failGroup(st_, GroupFailure::of(std::move(d), Telling{Telling::Who::GroupRankZero}));
  st_.throwFailure("");
}

bool StrictMode::checkPair(const Fingerprint& fp, uint64_t ordinal, uint32_t callSite) {
  const int me = st_.id().rank;
  if (fp.op == Op::Send) {
    // A store that does not take it is lost: the watchdog fails the group, and
    // the receiver's wait ends with that failure.
    publishP2PPrint(st_, keys::p2pPrint(me, fp.root, fp.tag, ordinal),
                    issuedWords(fp, callSite, LabelTable::current(), fp.p2pPairHash()));
    return true;
  }
  if (deferred_->waiting()) return false;  // posted in issue order: behind the waiting ones
  const int src = fp.root;
  auto theirs = takeP2PPrintIfThere(st_, keys::p2pPrint(src, me, fp.tag, ordinal), opName(fp.op));
  if (!theirs) return false;
  p2pPairsOrFails(weak_.lock(), *theirs, fp, ordinal, src, describeSite(callSite), /*raise=*/true);
  return true;
}

}  // namespace torch_ext
