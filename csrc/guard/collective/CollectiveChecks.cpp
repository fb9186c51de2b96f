#include "guard/collective/CollectiveChecks.h"

#include "guard/Errands.h"
#include "guard/Errors.h"
#include "guard/Runtime.h"
#include "guard/collective/CallSite.h"
#include "guard/collective/GuardWork.h"
#include "guard/collective/InBandCheck.h"
#include "guard/collective/LabelTable.h"
#include "guard/collective/P2PPairing.h"
#include "guard/collective/StrictExchange.h"
#include "guard/collective/Verifier.h"
#include "guard/report/Messages.h"
#include "guard/store/StoreKeys.h"

#include <sstream>
#include <mutex>
#include <deque>
#include <condition_variable>

namespace torch_ext {

namespace {

// The call site and the label active on this (the issuing) thread, as the
// strict checks' reports name them.
std::string describeSite(uint32_t callSite) {
  const std::vector<Frame> frames = CallSites::instance().frames(callSite);
  return describeCallSite(frames) + labelSuffix(LabelTable::instance().get(LabelTable::current()), frames);
}

}  // namespace

CollectiveChecks::CollectiveChecks(std::shared_ptr<GroupState> state, c10::intrusive_ptr<c10d::Backend> helper,
                                   CheckPolicy policy, std::unique_ptr<P2PPairing> pairing)
    : state_(std::move(state)), helper_(std::move(helper)), policy_(policy), pairing_(std::move(pairing)) {}

CollectiveChecks::CollectiveChecks(std::shared_ptr<GroupState> state, c10::intrusive_ptr<c10d::Backend> helper,
                                   CheckPolicy policy)
    : CollectiveChecks(std::move(state), std::move(helper), policy, nullptr) {}

CollectiveChecks::~CollectiveChecks() = default;

Operation CollectiveChecks::plan(Op op) const {
  Operation o;
  o.op = op;
  const bool p2p = isP2P(op);
  const bool strict = policy_.checksBeforeIssue;
  o.strict = strict && !p2p;
  o.strictP2P = strict && p2p && op != Op::RecvAnySource;
  o.audit = helper_ && policy_.auditsSplitsAfterIssue && isAllToAll(op);
  return o;
}

Operation CollectiveChecks::record(Fingerprint fp, c10::DeviceType device, bool streamOrdered,
                                   const c10d::Backend& inner, const InBandRequest* inBand, bool coalescing) {
  fp.device = device;  // the device whose inner backend runs it (a barrier has no tensor to tell)
  Operation o = plan(fp.op);
  o.device = device;
  o.streamOrdered = streamOrdered;
  o.site = state_->config().callSites ? CallSites::instance().capture() : 0;
  o.label = LabelTable::current();  // one thread_local load
  // A metric sync: the metric is part of what ranks must agree on (two ranks
  // syncing different metrics of one shape would mix their values silently).
  if (const uint64_t identity = LabelTable::currentIdentity(); identity != 0 && !isP2P(o.op)) {
    fp.hash = detail::combine(fp.hash, identity);
  }
  // The call path, where the policy compares it: look-alikes from other lines differ.
  if (policy_.comparesCallPaths && o.site != 0 && !isP2P(o.op)) {
    fp.hash = detail::combine(fp.hash, CallSites::instance().pathKey(o.site));
  }
  o.hash = fp.hash;
  o.splitSend = fp.splitSend;
  o.splitRecv = fp.splitRecv;
  // verify pairs a send with its receive on CPU transports.
  o.paired = pairing_ && (o.op == Op::Send || o.op == Op::Recv) && !streamOrdered;
  if (o.checksBeforeIssue() || o.paired) o.kept = fp;
  o.id = state_->ledger().record(std::move(fp), o.site, &o.seq, &o.ordinal, &o.rolling, o.label);
  // verify, carried by the collective itself (InBandCheck.h): decided from
  // what every rank issuing the same collective has alike.
  Verifier* verifier = o.seq > 0 ? state_->verifier() : nullptr;
  if (verifier == nullptr) return o;
  const int size = state_->id().size;
  if (inBand != nullptr && !coalescing && !streamOrdered && !o.checksBeforeIssue() && inBand->carries(inner, size)) {
    o.route = Route::InBand;
  }
  verifier->issued(o.seq, o.rolling, o.hash, o.splitSend, o.splitRecv, o.route == Route::InBand);
  return o;
}

void CollectiveChecks::beforeInner(Operation& op) {
  if (op.strict) strictCheck(*op.kept, op.seq, op.site);
  if (op.strictP2P && !strictP2PCheck(*op.kept, op.ordinal, op.site)) op.route = Route::Deferred;
}

c10::intrusive_ptr<c10d::Work> CollectiveChecks::carry(const Operation& op, c10d::Backend& inner,
                                                       const InBandRequest& inBand) {
  std::weak_ptr<Verifier> weak = state_->verifierPtr();
  return inBand.issue(inner, op.rolling, state_->id().size, [weak, seq = op.seq](bool agree) {
    if (auto v = weak.lock()) v->inBandVerdict(seq, agree);
  });
}

void CollectiveChecks::afterInner(const Operation& op, bool issued) {
  if (op.audit) auditSplits(op.splitSend, op.splitRecv);
  if (op.paired && op.op == Op::Send && issued) pairing_->sent(*op.kept, op.site);
}

c10::intrusive_ptr<c10d::Work> CollectiveChecks::release(const Operation& op, c10::intrusive_ptr<c10d::Work> work) {
  c10::intrusive_ptr<c10d::Work> wrapped =
      GuardWork::wrap(state_, std::move(work), op.id, op.seq, op.op, op.streamOrdered, op.route == Route::InBand);
  if (op.paired && op.op == Op::Recv) wrapped = pairing_->received(std::move(wrapped), *op.kept, op.ordinal, op.site);
  return wrapped;
}

void CollectiveChecks::waitForHelper(const c10::intrusive_ptr<c10d::Work>& work) {
  // Waited on through its future, so a group failure (a lost store, a
  // deadline) ends the wait: gloo's own wait() is not released by abort(), and
  // a peer that froze would hold this thread forever.
  auto fut = work->getFuture();
  std::weak_ptr<GroupState> weak = state_;
  fut->addCallback([weak](c10::ivalue::Future&) {
    if (auto st = weak.lock()) st->notify();
  });
  state_->waitUntil([&] { return fut->completed(); }, std::chrono::milliseconds(0));
  if (!fut->completed()) state_->throwFailure("");
  if (fut->hasError()) std::rethrow_exception(fut->exception_ptr());
}

void CollectiveChecks::strictCheck(const Fingerprint& fp, uint64_t seq, uint32_t callSite) {
  // ONE small all_reduce(MAX) of [v, ~v], v = the fingerprint bound to its seq:
  // every rank gets max(v) and, as ~max(~v), min(v), so all ranks see the same
  // verdict (equal iff min == max). A 2-element all_reduce is the cheapest
  // agreement primitive on gloo (an all_gather costs 3x more at 4 ranks).
  // With two ranks one element is enough: v0 + v1 == 2 * v_self (mod 2^64)
  // holds on both ranks exactly when v0 == v1.
  const int64_t v = static_cast<int64_t>(detail::combine(fp.hash, seq));
  const bool pair = state_->id().size == 2;
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
  const int size = state_->id().size;
  // This rank's metric syncs around #seq (the op at hand carries the current label).
  const LabelTable& labels = LabelTable::instance();
  const Ledger& ledger = state_->ledger();
  auto metricAt = [&](uint64_t s) -> std::optional<std::string> {
    if (s == seq) return labels.metricOf(LabelTable::current());
    auto e = ledger.bySeq(s);
    return e ? labels.metricOf(e->label) : std::nullopt;
  };
  std::vector<RankMetrics> metrics(1);
  metrics[0].known = metricAt(seq).has_value();
  metrics[0].names = metricRunAround(seq, seq, seq, metricAt);
  std::vector<RankOp> ops = exchangeStrictFingerprints(
      *state_, fp, seq, describeSite(callSite), describeCaller(CallSites::instance().frames(callSite)),
      LabelTable::instance().get(LabelTable::current()).hint, &metrics);
  // Shown when the op is a metric sync on some rank; every rank's list is known.
  bool metricSync = false;
  for (auto& m : metrics) {
    metricSync = metricSync || m.known;
    m.known = true;
  }
  Verdict verdict =
      differenceVerdict(state_->label(), size, seq, std::move(ops), same ? messages::kSplitsDoNotPair : "",
                        metricSync ? formatMetricSyncs(metrics) : std::string());
  // As verify's: the watchdog dumps (TORCH_EXT_DUMP_DIR), group rank 0 logs, the group fails.
  state_->incidents().failGroup(*state_, GroupFailure{GuardErrorKind::Mismatch, verdict.text, seq, std::move(verdict),
                                                      Telling{Telling::Who::GroupRankZero}});
  state_->throwFailure("");
}

// --- strict receives posted before their sends ------------------------------------

namespace {

// Stands for a strict receive until it is posted; then for the inner receive.
// Like gloo's send/recv works it has no future, so GuardWork waits on it.
class DeferredReceiveWork : public c10d::Work {
 public:
  DeferredReceiveWork() : c10d::Work(-1, c10d::OpType::RECV) {}
  void posted(c10::intrusive_ptr<c10d::Work> real) {
    std::lock_guard<std::mutex> lock(mu_);
    real_ = std::move(real);
    cv_.notify_all();
  }
  // Never posted: the group failed (or the check found a mismatch).
  void cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }
  bool isCompleted() override {
    auto r = real();
    return r ? r->isCompleted() : cancelledNow();
  }
  bool isSuccess() const override {
    auto r = real();
    return r && !r->exception();
  }
  std::exception_ptr exception() const override {
    auto r = real();
    return r ? r->exception() : nullptr;
  }
  int sourceRank() const override {
    auto r = real();
    return r ? r->sourceRank() : -1;
  }
  std::vector<at::Tensor> result() override {
    auto r = real();
    return r ? r->result() : std::vector<at::Tensor>{};
  }
  bool wait(std::chrono::milliseconds timeout) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [this] { return real_ || cancelled_; };
      if (timeout == kNoTimeout) {
        cv_.wait(lock, ready);
      } else if (!cv_.wait_for(lock, timeout, ready)) {
        return false;
      }
      if (!real_) return false;  // cancelled: the caller raises the group's failure
    }
    return real()->wait(timeout);
  }
  void abort() override {
    c10::intrusive_ptr<c10d::Work> r;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      r = real_;
      cv_.notify_all();
    }
    if (r) r->abort();
  }

 private:
  c10::intrusive_ptr<c10d::Work> real() const {
    std::lock_guard<std::mutex> lock(mu_);
    return real_;
  }
  bool cancelledNow() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }
  mutable std::mutex mu_;
  std::condition_variable cv_;
  c10::intrusive_ptr<c10d::Work> real_;
  bool cancelled_ = false;
};

// How often the poster looks for the print of the oldest deferred receive.
constexpr std::chrono::milliseconds kPrintPoll{20};

}  // namespace

struct DeferredReceives {
  struct Entry {
    std::string key;
    Fingerprint fp;
    uint64_t ordinal = 0;
    int src = -1;
    std::string where;
    std::function<c10::intrusive_ptr<c10d::Work>()> post;
    c10::intrusive_ptr<DeferredReceiveWork> work;
  };
  std::mutex mu;
  std::deque<Entry> queue;
  bool posting = false;  // a poster thread is running
};

bool CollectiveChecks::strictP2PCheck(const Fingerprint& fp, uint64_t ordinal, uint32_t callSite) {
  const int me = state_->id().rank;
  if (fp.op == Op::Send) {
    // A store that does not take it is lost: the watchdog fails the group, and
    // the receiver's wait ends with that failure.
    publishP2PPrint(*state_, keys::p2pPrint(me, fp.root, fp.tag, ordinal),
                    P2PPrint{fp.describe(), describeSite(callSite), fp.p2pPairHash()});
    return true;
  }
  if (deferred_) {
    std::lock_guard<std::mutex> lock(deferred_->mu);
    if (!deferred_->queue.empty()) return false;  // posted in issue order: behind the waiting ones
  }
  const int src = fp.root;
  auto theirs = takeP2PPrintIfThere(*state_, keys::p2pPrint(src, me, fp.tag, ordinal), opName(fp.op));
  if (!theirs) return false;
  p2pPairsOrFails(state_, *theirs, fp, ordinal, src, describeSite(callSite), /*raise=*/true);
  return true;
}

c10::intrusive_ptr<c10d::Work> CollectiveChecks::deferReceive(std::function<c10::intrusive_ptr<c10d::Work>()> post,
                                                              const Operation& op) {
  const Fingerprint& fp = *op.kept;
  if (!deferred_) deferred_ = std::make_shared<DeferredReceives>();
  auto work = c10::make_intrusive<DeferredReceiveWork>();
  DeferredReceives::Entry e;
  e.src = fp.root;
  e.key = keys::p2pPrint(e.src, state_->id().rank, fp.tag, op.ordinal);
  e.fp = fp;
  e.ordinal = op.ordinal;
  e.where = describeSite(op.site);
  e.post = std::move(post);
  e.work = work;
  bool start = false;
  {
    std::lock_guard<std::mutex> lock(deferred_->mu);
    deferred_->queue.push_back(std::move(e));
    start = !deferred_->posting;
    deferred_->posting = true;
  }
  if (start) {
    // A short-lived poster (an errand): it drains the queue and ends. It
    // holds the queue and the group's state, never the backend.
    auto queue = deferred_;
    Errands::instance().run("strict receive poster of group " + state_->label(), [queue, state = state_] {
      auto cancelAll = [&queue] {
        std::lock_guard<std::mutex> lock(queue->mu);
        for (auto& q : queue->queue) q.work->cancel();
        queue->queue.clear();
        queue->posting = false;
      };
      GroupState& st = *state;
      while (true) {
        DeferredReceives::Entry* front = nullptr;
        {
          std::lock_guard<std::mutex> lock(queue->mu);
          if (queue->queue.empty()) {
            queue->posting = false;
            return;
          }
          front = &queue->queue.front();  // only this thread pops: stays valid
        }
        if (st.failed()) {  // its failure reaches the program through the waits
          cancelAll();
          return;
        }
        try {
          auto theirs = takeP2PPrintIfThere(st, front->key, opName(front->fp.op));
          if (!theirs) {
            st.waitUntil([] { return false; }, kPrintPoll);
            continue;
          }
          // A mismatch fails the group (the wait raises it), it is not raised here.
          if (!p2pPairsOrFails(state, *theirs, front->fp, front->ordinal, front->src, front->where,
                               /*raise=*/false)) {
            cancelAll();
            return;
          }
          front->work->posted(front->post());
        } catch (const std::exception& e) {
          // The group failed (a mismatch, a lost store) or the inner receive
          // could not be posted: nothing behind it will be posted either.
          if (!st.failed())
            st.incidents().failGroup(st, GroupFailure{GuardErrorKind::Failure,
                                                      std::string("guard: a deferred receive failed: ") + e.what()});
          cancelAll();
          return;
        }
        std::lock_guard<std::mutex> lock(queue->mu);
        queue->queue.pop_front();
      }
    });
  }
  return work;
}

void CollectiveChecks::auditSplits(uint64_t splitSend, uint64_t splitRecv) {
  const int size = state_->id().size;
  at::Tensor mine = at::empty({2}, at::TensorOptions().dtype(at::kLong));
  mine.data_ptr<int64_t>()[0] = static_cast<int64_t>(splitSend);
  mine.data_ptr<int64_t>()[1] = static_cast<int64_t>(splitRecv);
  at::Tensor all = at::empty({2 * size}, at::TensorOptions().dtype(at::kLong));
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  try {
    fut = helper_->_allgather_base(all, mine)->getFuture();
  } catch (const std::exception& e) {
    logMessage(LogLevel::Debug, std::string("guard: split audit not started: ") + e.what());
    return;
  }
  std::weak_ptr<GroupState> weak = state_;
  fut->addCallback([weak, all, mine, size](c10::ivalue::Future& f) {
    if (f.hasError()) return;
    const int64_t* a = all.data_ptr<int64_t>();
    uint64_t send = 0, recv = 0;
    for (int r = 0; r < size; ++r) {
      send += static_cast<uint64_t>(a[2 * r]);
      recv += static_cast<uint64_t>(a[2 * r + 1]);
    }
    if (send == recv) return;
    if (auto st = weak.lock()) {
      st->incidents().requestIncident(st, Incident{IncidentKind::Mismatch, IncidentSubject::any(), st->id().rank, ""});
    }
  });
}

}  // namespace torch_ext
