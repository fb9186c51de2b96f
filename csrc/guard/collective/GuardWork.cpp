#include "guard/collective/GuardWork.h"

#include "guard/Runtime.h"
#include "guard/collective/InnerFuture.h"
#include "guard/collective/WorkRetirement.h"

#include <c10/util/Exception.h>

#include <exception>
#include <sstream>

namespace torch_ext {

c10::intrusive_ptr<GuardWork> GuardWork::wrap(const std::shared_ptr<GroupState>& state,
                                              c10::intrusive_ptr<c10d::Work> inner, uint64_t id, uint64_t seq, Op op,
                                              bool streamOrdered, bool inBand) {
  WorkRetirement::instance().sweep();  // frees, on this thread, what the inner backend let go of since
  if (streamOrdered) {
    state->ledger().pollLater(id, inner, /*reportFailure=*/true);
    return c10::make_intrusive<GuardWork>(state, std::move(inner), id, seq, op, Completion::Device, nullptr);
  }
  // gloo's reduce_scatter, send and recv works have no future: completion is observed in wait().
  c10::intrusive_ptr<c10::ivalue::Future> innerFuture = futureOf(*inner);
  if (!innerFuture) {
    state->ledger().pollLater(id, inner);
    auto work = c10::make_intrusive<GuardWork>(state, std::move(inner), id, seq, op, Completion::Blocking, nullptr);
    work->inBand_ = inBand;
    return work;
  }
  if (innerFuture->completed()) {
    // Done already (a synchronous inner backend): no callback to run later.
    settle(state, id, seq, innerFuture);
  } else {
    // The callback holds the group state and the record id, not the work: a
    // work the user dropped still completes its record.
    innerFuture->addCallback([state, id, seq](c10::ivalue::Future& f) {
      settle(state, id, seq, c10::intrusive_ptr<c10::ivalue::Future>::unsafe_reclaim_from_nonowning(&f));
      state->notify();
    });
  }
  auto work =
      c10::make_intrusive<GuardWork>(state, std::move(inner), id, seq, op, Completion::Future, std::move(innerFuture));
  work->inBand_ = inBand;
  return work;
}

void GuardWork::settle(const std::shared_ptr<GroupState>& state, uint64_t id, uint64_t seq,
                       const c10::intrusive_ptr<c10::ivalue::Future>& inner) {
  const bool ok = !inner->hasError();
  if (seq > 0 && ok) {
    if (ReleaseGate* gate = state->gate()) gate->kick();  // check what completed, off the caller's thread
  }
  auto ours = state->ledger().complete(id, ok, ok ? std::string() : inner->tryRetrieveErrorMessage());
  if (!ours) return;
  if (!ok) {
    // The inner backend's own words ("Connection closed by peer") name no
    // rank: whoever waits on our future (DDP's reducer, a comm hook, FSDP2)
    // gets what a direct wait() gets, the group's verdict or the cross-rank
    // report of the failure. Made here, on the inner backend's thread, as
    // wait() makes it on the caller's: a few seconds at most.
    ours->setErrorIfNeeded(surfaced(innerFailure(state, id, inner->tryRetrieveErrorMessage())));
    return;
  }
  release(*state, seq, std::move(ours), inner);
}

std::exception_ptr GuardWork::innerFailure(const std::shared_ptr<GroupState>& state, uint64_t id,
                                           const std::string& err) {
  try {
    // A work is pending when its group fails, so the report speaks for it as is.
    if (state->failed()) return state->failureError();
    std::string report = state->incidents().failureReport(state, id, err);
    // The verdict fails the whole group only when a rank is gone; an op the
    // inner backend rejected (e.g. an unsupported reduce op) fails just this op.
    if (state->failed()) return state->failureError();
    throw CollectiveFailureError(report);
  } catch (...) {
    return std::current_exception();
  }
}

void GuardWork::release(GroupState& state, uint64_t seq, c10::intrusive_ptr<c10::ivalue::Future> ours,
                        const c10::intrusive_ptr<c10::ivalue::Future>& inner) {
  // Called for a completed inner future without error (settle() and
  // getFuture() hand errors the guard's report instead).
  ReleaseGate* gate = seq > 0 ? state.gate() : nullptr;
  if (gate == nullptr || gate->verified(seq)) {
    completeFrom(*ours, *inner);
    return;
  }
  // check="verify": the result reaches the future's callbacks only once every
  // rank is known to have issued the same collectives up to this one.
  gate->whenVerified(
      seq, [ours, inner] { completeFrom(*ours, *inner); },
      [ours](std::exception_ptr err) { ours->setErrorIfNeeded(surfaced(std::move(err))); });
}

ReleaseGate* GuardWork::gate() const {
  return (completion_ == Completion::Future && seq_ > 0) ? state_->gate() : nullptr;
}

bool GuardWork::released() const {
  ReleaseGate* v = gate();
  return v == nullptr || innerFuture_->hasError() || v->verified(seq_);
}

void GuardWork::completeFrom(c10::ivalue::Future& ours, c10::ivalue::Future& inner) {
  ours.markCompleted(inner.value());
}

GuardWork::GuardWork(std::shared_ptr<GroupState> state, c10::intrusive_ptr<c10d::Work> inner, uint64_t id, uint64_t seq,
                     Op op, Completion completion, c10::intrusive_ptr<c10::ivalue::Future> innerFuture)
    : c10d::Work(state->id().rank, toOpType(op)),
      state_(std::move(state)),
      inner_(std::move(inner)),
      id_(id),
      seq_(seq),
      op_(op),
      completion_(completion),
      innerFuture_(std::move(innerFuture)) {}

GuardWork::~GuardWork() {
  auto& retirement = WorkRetirement::instance();
  retirement.retire(std::move(inner_));
  retirement.retire(std::move(innerFuture_));
  retirement.retire(std::move(future_));
}

std::exception_ptr GuardWork::groupFailure() const {
  return surfaced(state_->failureError());
}

std::string GuardWork::describe() const {
  std::ostringstream os;
  os << opName(op_);
  if (seq_ > 0) os << " #" << seq_;
  os << " on group \"" << state_->label() << "\"";
  return os.str();
}

bool GuardWork::isCompleted() {
  return surfacing([this] { return completedOrThrow(); });
}

bool GuardWork::completedOrThrow() {
  if (completion_ == Completion::Future) {
    if (innerFuture_->completed()) {
      if (released()) return true;
      if (!inBand_) gate()->want(seq_);  // asked for: check it now (in band: its verdict is on its way)
    }
    // A result the check refused is never reported as done: a caller polling
    // is_completed() and then reading the tensor would read it. The failure
    // is raised instead, as wait() raises it.
    if (state_->failed()) {
      if (gate() != nullptr) state_->throwFailure("");
      return true;
    }
    return false;
  }
  if (state_->failed()) {
    if (completion_ == Completion::Device && seq_ > 0 && state_->gate() != nullptr) state_->throwFailure("");
    return true;
  }
  if (!inner_->isCompleted()) return false;
  if (ReleaseGate* v = inBand_ && seq_ > 0 ? state_->gate() : nullptr) {
    return v->verified(seq_);  // not done until released (a difference fails the group: raised above)
  }
  if (ReleaseGate* v = hostGate()) {
    v->want(seq_);  // asked for: check it now; not done until released
    return false;
  }
  return true;
}

bool GuardWork::isSuccess() const {
  if (completion_ == Completion::Future) return innerFuture_->completed() && !innerFuture_->hasError() && released();
  return !state_->failed() && !inner_->exception();
}

std::exception_ptr GuardWork::exception() const {
  if (state_->failed()) {
    const bool failedHere = completion_ == Completion::Future ? !innerFuture_->completed() || innerFuture_->hasError()
                                                              : inner_->exception() != nullptr;
    if (failedHere) return groupFailure();
  }
  if (completion_ == Completion::Future) return innerFuture_->completed() ? innerFuture_->exception_ptr() : nullptr;
  return inner_->exception();
}

int GuardWork::sourceRank() const {
  return inner_->sourceRank();
}

std::vector<at::Tensor> GuardWork::result() {
  return inner_->result();
}

void GuardWork::synchronize() {
  inner_->synchronize();
}

void GuardWork::blockCurrentStream() {
  inner_->blockCurrentStream();
  holdOwnResult();
}

void GuardWork::holdStream(GroupState& state, uint64_t seq, const std::vector<at::Tensor>& outputs,
                           c10::intrusive_ptr<c10::ivalue::Future> landed, bool asked) {
  device::StreamGate* gate = state.streamGate();
  if (seq == 0 || gate == nullptr || state.gate()->verified(seq)) return;
  try {
    // A wait asks for the verdict now, as on gloo; a future's hold (DDP's
    // buckets) leaves the rounds to the check's pacing: one per step.
    if (gate->hold(seq, outputs, std::move(landed)) && asked) state.gate()->want(seq);
  } catch (const std::exception& e) {
    // A launch the driver refused: the result goes out unheld, as in async; said, not hidden.
    logMessage(LogLevel::Warning, "guard: the stream gate could not hold collective #" + std::to_string(seq) +
                                      " on group \"" + state.label() + "\": " + e.what());
  }
}

void GuardWork::holdOwnResult() {
  // Checked before result() and landed(), which copy the outputs and may make
  // a future: every Device-completion wait passes here, gated or not.
  if (completion_ != Completion::Device || seq_ == 0 || state_->streamGate() == nullptr ||
      state_->gate()->verified(seq_)) {
    return;
  }
  holdStream(*state_, seq_, inner_->result(), landed());
}

c10::intrusive_ptr<c10::ivalue::Future> GuardWork::landed() const {
  // A CPU result of a stream backend (nccl_sim) is written by its stream's
  // thread: the poison fill waits for it. CUDA's fill is ordered on the device.
  if (inner_->isCompleted()) return {};
  try {
    return inner_->getFuture();
  } catch (const std::exception&) {
    return {};
  }
}

std::vector<at::Tensor> GuardWork::tensorsOf(const c10::IValue& value) {
  if (value.isTensor()) return {value.toTensor()};
  if (value.isTensorList()) return value.toTensorVector();
  std::vector<at::Tensor> out;
  if (value.isList()) {
    for (const c10::IValue& v : value.toListRef()) {
      if (v.isTensor()) out.push_back(v.toTensor());
    }
  }
  return out;
}

void GuardWork::abort() {
  inner_->abort();
}

float GuardWork::getDuration() const {
  return inner_->getDuration();
}

uint64_t GuardWork::getSequencenumber() const {
  return inner_->getSequencenumber();
}

c10::intrusive_ptr<c10::ivalue::Future> GuardWork::getFuture() {
  if (completion_ == Completion::Device) return deviceFuture();
  if (completion_ != Completion::Future) return inner_->getFuture();
  std::call_once(futureOnce_, [this] {
    // Made on first request (DDP's comm hooks ask; a plain wait() does not):
    // ours, not the inner one, so that a group failure can error it while the
    // inner backend's stays pending (a frozen peer).
    auto ours = c10::make_intrusive<c10::ivalue::Future>(innerFuture_->elementType(), innerFuture_->devices());
    if (state_->ledger().track(id_, ours)) {
      // Completed by the inner future's callback or errored by a group failure,
      // whichever takes it from the ledger first. The callback may have run
      // before it was tracked: then take it back here.
      if (innerFuture_->completed()) settle(state_, id_, seq_, innerFuture_);
    } else if (innerFuture_->completed()) {
      if (innerFuture_->hasError()) {
        ours->setError(surfaced(innerFailure(state_, id_, innerFuture_->tryRetrieveErrorMessage())));
      } else {
        release(*state_, seq_, ours, innerFuture_);
      }
    } else {
      ours->setError(groupFailure());  // failed while pending: the group failed
    }
    future_ = std::move(ours);
  });
  return future_;
}

c10::intrusive_ptr<c10::ivalue::Future> GuardWork::deviceFuture() {
  std::call_once(futureOnce_, [this] {
    // The inner future keeps its stream semantics (a CUDA future completes at
    // enqueue, with its events); ours completes from it in a callback, which
    // runs with the inner future's streams current, so the same events order
    // our callbacks. What changes is the error: when the guard fails the
    // group it aborts the inner backend, whose futures then fail in its own
    // words ("communicator ... was aborted"); ours carries the verdict.
    auto inner = inner_->getFuture();
    // check="verify" with a stream gate: the callback holds its (current)
    // streams until the verdict before completing ours, whose events are
    // recorded on those streams, so what waits for ours waits for the verdict.
    auto ours = c10::make_intrusive<c10::ivalue::Future>(inner->elementType(), inner->devices());
    inner->addCallback([ours, state = state_, id = id_, seq = seq_](c10::ivalue::Future& f) {
      if (!f.hasError()) {
        holdStream(*state, seq, tensorsOf(f.value()), {}, /*asked=*/false);
        ours->markCompleted(f.value(), f.storages());
      } else if (state->failed()) {
        ours->setErrorIfNeeded(surfaced(state->failureError()));
      } else {
        ours->setErrorIfNeeded(surfaced(innerFailure(state, id, f.tryRetrieveErrorMessage())));
      }
    });
    future_ = std::move(ours);
  });
  return future_;
}

void GuardWork::failFromInner(const std::string& err) {
  std::rethrow_exception(innerFailure(state_, id_, err));
}

void GuardWork::awaitVerdict(ReleaseGate* gate, std::chrono::milliseconds timeout) {
  // The collective completed, but its result is not released: the check found
  // a difference (or could not run), and the group's failure follows at once
  // (the gate fails it with the cross-rank report); or the caller's own
  // timeout expired first.
  if (state_->failed()) state_->throwFailure("");
  if (gate->blocked(seq_)) {
    constexpr auto kReportBound = std::chrono::seconds(30);
    if (!state_->waitUntil([] { return false; }, kReportBound)) {
      state_->incidents().failGroup(
          *state_,
          GroupFailure{GuardErrorKind::Mismatch,
                       describe() + " differs across ranks (found by the check before its result was released); "
                                    "the cross-rank report did not come within 30 s"});
    }
    state_->throwFailure("");
  }
  std::ostringstream os;
  os << describe() << ": wait(timeout=" << timeout.count()
     << " ms) expired before every rank was known to have issued the same collectives (check=verify)";
  throw c10::DistBackendError(os.str());
}

ReleaseGate* GuardWork::hostGate() {
  if (completion_ != Completion::Device || seq_ == 0) return nullptr;
  ReleaseGate* v = state_->gate();
  if (v == nullptr || v->verified(seq_) || !inner_->isCompleted()) return nullptr;
  return v;
}

namespace {

// A host thread in a wait without a deadline, for the watchdog's snapshots
// (Ledger::enterWait); leaving by an exception records where it raised.
class BlockingWait {
 public:
  BlockingWait(Ledger* ledger, uint64_t id) : ledger_(ledger), id_(id) {
    if (ledger_ != nullptr) ledger_->enterWait(id_);
  }
  ~BlockingWait() {
    if (ledger_ != nullptr) ledger_->leaveWait(id_, std::uncaught_exceptions() > unwinding_);
  }
  BlockingWait(const BlockingWait&) = delete;
  BlockingWait& operator=(const BlockingWait&) = delete;

 private:
  Ledger* ledger_;
  uint64_t id_;
  int unwinding_ = std::uncaught_exceptions();
};

}  // namespace

bool GuardWork::wait(std::chrono::milliseconds timeout) {
  return surfacing([this, timeout] { return waitOrThrow(timeout); });
}

bool GuardWork::waitOrThrow(std::chrono::milliseconds timeout) {
  // A wait without a deadline blocks this thread until the operation ends: the
  // watchdog's snapshots say so (a wait-for cycle of such waits is certain).
  BlockingWait scope(timeout == kNoTimeout ? &state_->ledger() : nullptr, id_);
  if (completion_ == Completion::Future) {
    ReleaseGate* held = gate();
    // Asked for: check it now; a collective that carries its check brings its verdict itself.
    if (held != nullptr && !inBand_) held->want(seq_);
    const bool done = state_->waitUntil(
        [this, held] {
          return innerFuture_->completed() &&
                 (held == nullptr || innerFuture_->hasError() || held->verified(seq_) || held->blocked(seq_));
        },
        timeout);
    if (!innerFuture_->completed()) {
      if (state_->failed()) state_->throwFailure("");
      if (!done) {
        std::ostringstream os;
        os << describe() << ": wait(timeout=" << timeout.count() << " ms) expired before the collective completed";
        throw c10::DistBackendError(os.str());
      }
    }
    if (innerFuture_->hasError()) {
      if (state_->failed()) state_->throwFailure("");
      failFromInner(innerFuture_->tryRetrieveErrorMessage());
    }
    if (!released()) awaitVerdict(gate(), timeout);
    // Completed (its future is: c10d's contract for a work's future). What is
    // left of the inner wait() is its synchronize() (the stream sync of CUDA
    // tensors on gloo). Not wait() itself: gloo marks its work completed only
    // after the future's callbacks have run, ours among them, so this thread,
    // woken by them, would sleep a second time per collective (docs/performance.md).
    inner_->synchronize();
    return true;
  }
  if (state_->failed()) state_->throwFailure("");
  bool result = false;
  try {
    result = inner_->wait(timeout);
  } catch (const std::exception& e) {
    state_->ledger().complete(id_, false, e.what());
    if (state_->failed()) state_->throwFailure("");
    failFromInner(e.what());
  }
  // An inner wait that returns false was cut short: the group failed meanwhile (the
  // watchdog aborts the inner work, e.g. a send/recv that will never pair). Say so,
  // rather than return as if the data had arrived.
  if (!result && state_->failed()) state_->throwFailure("");
  if (ReleaseGate* v = result && inBand_ && seq_ > 0 ? state_->gate() : nullptr) {
    // A carried collective without a future (gloo's reduce_scatter): its
    // verdict came in the inner wait() (InBandCheck.h), a disagreement's from
    // the rounds it started.
    state_->waitUntil([this, v] { return v->verified(seq_) || v->blocked(seq_); }, timeout);
    if (!v->verified(seq_)) awaitVerdict(v, timeout);
  } else if (ReleaseGate* v = result ? hostGate() : nullptr) {
    // A stream backend whose wait() waited for the data (nccl_sim with
    // TORCH_EXT_NCCL_SIM_WAIT=data: on CPU the host is the compute stream):
    // released only once every rank is known to have issued the same
    // collectives, as on gloo. On NCCL wait() returns before completion and
    // nothing is held here (docs/architecture.md, the device path).
    v->want(seq_);
    state_->waitUntil([this, v] { return v->verified(seq_) || v->blocked(seq_); }, timeout);
    if (!v->verified(seq_)) awaitVerdict(v, timeout);
  } else if (result) {
    // The inner wait ordered the caller's stream after the collective and
    // returned: the stream waits for the verdict too (StreamGate.h).
    holdOwnResult();
  }
  if (completion_ == Completion::Blocking) {
    state_->ledger().complete(id_, true);
    // The watchdog's poll has nothing left to learn from it; holding it until
    // then kept each reduce_scatter's tensors (FSDP2) alive for a whole tick.
    state_->ledger().forgetPolled(id_);
  }
  return result;
}

CoalescedWork::CoalescedWork(std::vector<c10::intrusive_ptr<c10d::Work>> works)
    : c10d::Work(-1, c10d::OpType::COALESCED), works_(std::move(works)) {}

bool CoalescedWork::isCompleted() {
  for (auto& w : works_) {
    if (!w->isCompleted()) return false;
  }
  return true;
}

bool CoalescedWork::isSuccess() const {
  for (auto& w : works_) {
    if (w->exception()) return false;
  }
  return true;
}

std::exception_ptr CoalescedWork::exception() const {
  for (auto& w : works_) {
    if (auto e = w->exception()) return e;
  }
  return nullptr;
}

bool CoalescedWork::wait(std::chrono::milliseconds timeout) {
  bool ok = true;
  for (auto& w : works_) ok = w->wait(timeout) && ok;
  return ok;
}

void CoalescedWork::synchronize() {
  for (auto& w : works_) w->synchronize();
}

void CoalescedWork::abort() {
  for (auto& w : works_) w->abort();
}

c10::intrusive_ptr<c10::ivalue::Future> CoalescedWork::getFuture() {
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
  futures.reserve(works_.size());
  for (auto& w : works_) futures.push_back(w->getFuture());
  c10::List<c10::intrusive_ptr<c10::ivalue::Future>> list(c10::FutureType::create(c10::AnyType::get()));
  for (auto& f : futures) list.push_back(f);
  return c10::collectAll(list);
}

}  // namespace torch_ext
