#include "guard/backend/GuardBackend.h"

#include "guard/TorchCompat.h"

#include "guard/collective/CallSite.h"
#include "guard/collective/GuardWork.h"
#include "guard/collective/InBandRequest.h"
#include "guard/collective/LabelTable.h"
#include "guard/collective/StreamOrdered.h"
#include "guard/modes/Modes.h"
#include "guard/report/Report.h"  // Verdict (coalescing reports)
#include "guard/Runtime.h"
#include "guard/watchdog/TerminateHandler.h"
#include "guard/watchdog/Watchdog.h"
#include "guard/collective/WorkRetirement.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <optional>
#include <sstream>

namespace torch_ext {

namespace {

// Inner backends of failed groups, and of every group at interpreter exit, are
// kept alive on purpose: gloo joins its worker threads on destruction, and a
// worker stuck waiting for a frozen peer would turn a clean error exit into a
// hang (NCCL's teardown can block the same way on a hung communicator).
void keepForever(const c10::intrusive_ptr<c10d::Backend>& backend) {
  static auto* graveyard = new std::vector<c10::intrusive_ptr<c10d::Backend>>();
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  graveyard->push_back(backend);
}

std::string deviceName(c10::DeviceType t) {
  return c10::DeviceTypeName(t, /*lower_case=*/true);
}

c10::DeviceType deviceOf(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (t.defined()) return t.device().type();
  }
  return c10::DeviceType::CPU;
}

std::vector<int64_t> equalSplits(int64_t rows, int size) {
  return std::vector<int64_t>(static_cast<size_t>(size), size > 0 ? rows / size : 0);
}

std::vector<int64_t> numels(const std::vector<at::Tensor>& ts) {
  std::vector<int64_t> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(t.defined() ? t.numel() : 0);
  return out;
}

// On failure: error every pending future, abort pending works and the inner
// backends (NCCL aborts its communicators; gloo has no abort, so its pending
// waits are released through the futures), and never destroy them.
void abortGroup(const std::weak_ptr<GroupState>& weak, const std::vector<c10::intrusive_ptr<c10d::Backend>>& inners) {
  auto state = weak.lock();
  if (!state) return;
  auto failure = state->failure();
  if (!failure) return;
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> futures;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  state->ledger().failPending(std::string("group failed: ") + guardErrorKindName(failure->kind), &futures, &works);
  const std::exception_ptr err = surfaced(state->failureError());
  // Whatever the mode holds (held streams, results awaiting their release) gets the failure.
  state->mode().groupFailed(err);
  for (auto& f : futures) f->setErrorIfNeeded(err);
  for (auto& w : works) {
    try {
      w->abort();
    } catch (const std::exception&) {
      // Works that cannot abort are released by the inner backend's abort.
    }
  }
  for (auto& b : inners) {
    keepForever(b);
    try {
      b->abort();
    } catch (const std::exception& e) {
      logMessage(LogLevel::Warning, std::string("guard: abort() of an inner backend failed: ") + e.what());
    }
  }
}

}  // namespace

GuardBackend::GuardBackend(c10::intrusive_ptr<c10d::Store> store, StoreAddress storeAddress, int rank, int size,
                           std::chrono::milliseconds timeout, std::string groupName, std::vector<int64_t> globalRanks,
                           Config config, std::map<std::string, InnerBackend> inner,
                           c10::intrusive_ptr<c10d::Backend> helper)
    : c10d::Backend(rank, size), inner_(std::move(inner)), helper_(std::move(helper)) {
  for (auto& kv : inner_) {
    TORCH_CHECK(kv.second.backend, "guard: inner backend for device '", kv.first, "' is null");
    kv.second.streamOrdered = isStreamOrdered(*kv.second.backend);
    TORCH_CHECK(kv.second.name != "guard", "guard cannot wrap guard (device '", kv.first, "')");
    innerNames_ += (innerNames_.empty() ? "" : ",") + kv.first + ":" + kv.second.name;
    if (kv.first == "cpu") {
      cpu_ = kv.second.backend;
      cpuStreamOrdered_ = kv.second.streamOrdered;
    }
    if (kv.first == "cuda") {
      cuda_ = kv.second.backend;
      cudaStreamOrdered_ = kv.second.streamOrdered;
    }
  }
  GroupIdentity id;
  id.name = std::move(groupName);
  id.rank = rank;
  id.size = size;
  id.globalRanks = std::move(globalRanks);
  const auto storeTimeout = std::chrono::milliseconds(static_cast<int64_t>(config.storeTimeoutS * 1000.0));
  auto opened = StoreChannel::open(store, std::move(storeAddress), storeTimeout);
  auto jobStore = std::make_shared<GroupStore>(opened.channel, opened.root);
  auto guardStore = std::make_shared<GroupStore>(std::move(opened.channel), std::move(opened.view),
                                                 std::move(opened.root), std::move(opened.rootPrefix));
  state_ = std::make_shared<GroupState>(std::move(id), std::move(config), std::move(guardStore), timeout);
  state_->setJobStore(std::move(jobStore));
  for (const auto& kv : inner_) {
    if (kv.second.streamOrdered) state_->setStreamOrdered(true);
  }
  // The group's check mode (modes/Modes.h): everything it checks and holds.
  installMode(state_, helper_);
  checks_ = std::make_unique<CollectiveChecks>(state_);
  pg_uid_ = state_->id().name;
  if (helper_) helper_->setGroupUid(pg_uid_ + kHelperSuffix);

  // On failure (abortGroup): the inner backends are aborted, never destroyed.
  std::vector<c10::intrusive_ptr<c10d::Backend>> inners;
  for (const auto& kv : inner_) inners.push_back(kv.second.backend);
  if (helper_) inners.push_back(helper_);
  std::weak_ptr<GroupState> weak = state_;
  state_->setAbortHook([weak, inners]() { abortGroup(weak, inners); });
  init();
  // Once per process: what a terminated process says (gloo's transport thread
  // terminates it on a byte-count difference).
  installTerminateHandler();
  Watchdog::instance().add(state_);
}

GuardBackend::~GuardBackend() {
  stopWatchdog();
  // At interpreter exit nothing is torn down that could block (see keepForever).
  if (Watchdog::instance().exiting()) keepInnersForever();
}

void GuardBackend::keepInnersForever() {
  for (const auto& kv : inner_) {
    if (kv.second.backend) keepForever(kv.second.backend);
  }
  if (helper_) keepForever(helper_);
}

void GuardBackend::stopWatchdog() {
  if (stopped_) return;
  stopped_ = true;
  Watchdog::instance().remove(state_);
}

std::string GuardBackend::repr() const {
  std::ostringstream os;
  os << "GuardBackend(group=\"" << state_->label() << "\", rank=" << getRank() << ", size=" << getSize()
     << ", inner=" << innerNames_ << ", check=" << checkModeName(state_->config().check) << ")";
  return os.str();
}

c10::intrusive_ptr<c10d::Backend> GuardBackend::innerFor(c10::DeviceType device) const {
  if (device == c10::DeviceType::CPU) return cpu_;
  if (device == c10::DeviceType::CUDA) return cuda_;
  auto it = inner_.find(deviceName(device));
  return it == inner_.end() ? nullptr : it->second.backend;
}

bool GuardBackend::streamOrdered(c10::DeviceType device) const {
  // Per collective: the common devices without a string or a map lookup.
  if (device == c10::DeviceType::CPU) return cpuStreamOrdered_;
  if (device == c10::DeviceType::CUDA) return cudaStreamOrdered_;
  auto it = inner_.find(deviceName(device));
  return it != inner_.end() && it->second.streamOrdered;
}

c10d::Backend& GuardBackend::innerOrThrow(c10::DeviceType device, Op op) {
  auto* b = device == c10::DeviceType::CPU ? cpu_.get() : device == c10::DeviceType::CUDA ? cuda_.get() : nullptr;
  if (b != nullptr) return *b;
  auto it = inner_.find(deviceName(device));
  if (it != inner_.end()) return *it->second.backend;
  const std::string dev = deviceName(device);
  std::ostringstream os;
  os << "guard: " << opName(op) << " on group \"" << state_->label() << "\" (rank " << getRank() << ") got " << dev
     << " tensors, but no inner backend serves device '" << dev << "' (inner backends: " << innerNames_
     << "). Name one with TORCH_EXT_INNER=" << dev << ":<backend> or GuardOptions(inner={\"" << dev
     << "\": ...}); a CUDA inner backend is only created when "
     << "CUDA is available at init_process_group.";
  throw c10::DistBackendError(os.str());
}

template <typename Call>
c10::intrusive_ptr<c10d::Work> GuardBackend::run(FingerprintBuilder&& builder, c10::DeviceType device, Call&& call,
                                                 const InBandRequest* inBand) {
  return surfacing([&] { return issue(std::move(builder), device, std::forward<Call>(call), inBand); });
}

// The path every operation takes, top to bottom: described once (record),
// checked before the inner call, issued by the route its checks chose, checked
// after, handed back as the work the program waits on. What runs at each step
// is the group's mode's (collective/Mode.h), which CollectiveChecks calls in order.
template <typename Call>
c10::intrusive_ptr<c10d::Work> GuardBackend::issue(FingerprintBuilder&& builder, c10::DeviceType device, Call&& call,
                                                   const InBandRequest* inBand) {
  Fingerprint fp = builder.finish();
  c10d::Backend& inner = admit(fp.op, device);
  Operation op = checks_->record(std::move(fp), device, streamOrdered(device), inner, inBand, coalescing_);
  try {
    checks_->beforeInner(op);
  } catch (const GuardError&) {
    state_->ledger().complete(op.id, false, "strict check failed");
    throw;
  } catch (const std::exception& e) {
    failWhileIssuing(op.id, e);  // the check's own transport failed (a peer is gone?)
  }
  joinNativeCoalescing(inner, device);
  c10::intrusive_ptr<c10d::Work> work;
  try {
    switch (op.route) {
      case Route::Inner:
        work = call(inner);
        break;
      case Route::InBand:
        work = checks_->carry(op, inner, *inBand);
        break;
      case Route::Deferred:  // the caller goes on: its isend may be what the sender waits for
        work = checks_->deferReceive([call, target = innerFor(device)]() mutable { return call(*target); }, op);
        break;
    }
  } catch (c10::Error& e) {
    innerRefused(op, inner, e);
    throw;
  } catch (const std::exception& e) {
    failWhileIssuing(op.id, e);  // not a c10::Error: the transport failed (gloo found a peer's connection closed)
  }
  checks_->afterInner(op, static_cast<bool>(work));
  return handOut(op, std::move(work));
}

c10d::Backend& GuardBackend::admit(Op op, c10::DeviceType device) {
  if (state_->failed()) state_->throwFailure(opName(op));
  if (shutdown_) {
    throw c10::DistBackendError(std::string("guard: ") + opName(op) + " on group \"" + state_->label() +
                                "\", which was shut down (destroy_process_group): create a new group to go on");
  }
  c10d::Backend& inner = innerOrThrow(device, op);
  if (!descSynced_) {
    // torch sets the description after creating the backend; pick it up on the
    // first operation, on the issuing thread, where reading it cannot race.
    descSynced_ = true;
    syncDesc();
  }
  return inner;
}

void GuardBackend::joinNativeCoalescing(c10d::Backend& inner, c10::DeviceType device) {
  if (coalescing_ && nativeCoalescing_ == nullptr && coalescedWorks_.empty() && inner.supportsCoalescing()) {
    inner.startCoalescing();
    nativeCoalescing_ = &inner;
    coalescedDevice_ = device;
  }
}

void GuardBackend::innerRefused(const Operation& op, c10d::Backend& inner, c10::Error& e) {
  state_->ledger().complete(op.id, false, e.what_without_backtrace());
  // The inner backend refused because the group failed meanwhile (a
  // stream-ordered backend aborted while the host waited for room in its
  // queue): the group's typed error, not the abort's side effect.
  if (state_->failed()) state_->throwFailure(opName(op.op));
  std::ostringstream os;
  os << "guard: inner backend '" << deviceName(op.device) << ":" << inner.getBackendName() << "' failed "
     << opName(op.op);
  if (op.seq) os << " #" << op.seq;
  os << " on group \"" << state_->label() << "\" (rank " << getRank() << ")";
  e.add_context(os.str());
}

c10::intrusive_ptr<c10d::Work> GuardBackend::handOut(const Operation& op, c10::intrusive_ptr<c10d::Work> work) {
  if (coalescing_ && nativeCoalescing_ != nullptr) {
    // Native coalescing: the block's work comes from endCoalescing().
    coalescedIds_.push_back(op.id);
    return work;
  }
  if (!work) {
    state_->ledger().complete(op.id, true);
    return work;
  }
  c10::intrusive_ptr<c10d::Work> released = checks_->release(op, std::move(work));
  if (coalescing_) coalescedWorks_.push_back(released);
  return released;
}

void GuardBackend::failWhileIssuing(uint64_t id, const std::exception& e) {
  // Explained like a failure seen in wait(): with the cross-rank report, or
  // with the group's own failure if a verdict failed it meanwhile.
  state_->ledger().complete(id, false, e.what());
  if (state_->failed()) state_->throwFailure("");
  std::string report = Watchdog::instance().failureReport(state_, id, e.what());
  if (state_->failed()) state_->throwFailure("");
  throw CollectiveFailureError(report);
}

// --- collectives ---------------------------------------------------------

c10::intrusive_ptr<c10d::Work> GuardBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  return run(std::move(FingerprintBuilder(Op::Broadcast).tensors(tensors).root(opts.rootRank)), deviceOf(tensors),
             [&](c10d::Backend& b) { return b.broadcast(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  InBandRequest inBand{InBandRequest::Kind::AllReduce};
  inBand.tensors = &tensors;
  inBand.allreduce = &opts;
  return run(
      std::move(FingerprintBuilder(Op::AllReduce).tensors(tensors).reduceOp(opts.reduceOp)), deviceOf(tensors),
      [&](c10d::Backend& b) { return b.allreduce(tensors, opts); }, &inBand);
}

c10::intrusive_ptr<c10d::Work> GuardBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                              const c10d::AllreduceOptions& opts) {
  // Sparse tensors: only dtype and dense shape are comparable across ranks.
  FingerprintBuilder b(Op::AllReduceSparse);
  b.reduceOp(opts.reduceOp);
  for (const auto& t : tensors) b.meta(t.scalar_type(), t.sizes(), t.device().type());
  return run(std::move(b), deviceOf(tensors), [&](c10d::Backend& be) { return be.allreduce_sparse(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceCoalescedOptions& opts) {
  return run(std::move(FingerprintBuilder(Op::AllReduceCoalesced).tensors(tensors).reduceOp(opts.reduceOp)),
             deviceOf(tensors), [&](c10d::Backend& b) { return b.allreduce_coalesced(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  return run(std::move(FingerprintBuilder(Op::Reduce).tensors(tensors).reduceOp(opts.reduceOp).root(opts.rootRank)),
             deviceOf(tensors), [&](c10d::Backend& b) { return b.reduce(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  return run(std::move(FingerprintBuilder(Op::AllGather).tensors(inputs)), deviceOf(inputs),
             [&](c10d::Backend& b) { return b.allgather(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  InBandRequest inBand{InBandRequest::Kind::AllGather};
  inBand.output = &output;
  inBand.input = &input;
  inBand.allgather = &opts;
  return run(
      std::move(FingerprintBuilder(Op::AllGatherIntoTensor).tensor(input)), input.device().type(),
      [&](c10d::Backend& b) { return b._allgather_base(output, input, opts); }, &inBand);
}

c10::intrusive_ptr<c10d::Work> GuardBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) {
  return run(std::move(FingerprintBuilder(Op::AllGatherCoalesced).tensors(inputs)), deviceOf(inputs),
             [&](c10d::Backend& b) { return b.allgather_coalesced(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  return run(std::move(FingerprintBuilder(Op::AllGatherIntoTensorCoalesced).tensors(inputs)), deviceOf(inputs),
             [&](c10d::Backend& b) { return b.allgather_into_tensor_coalesced(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  return run(std::move(FingerprintBuilder(Op::Gather).tensors(inputs).root(opts.rootRank)), deviceOf(inputs),
             [&](c10d::Backend& b) { return b.gather(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  return run(std::move(FingerprintBuilder(Op::Scatter).tensors(outputs).root(opts.rootRank)), deviceOf(outputs),
             [&](c10d::Backend& b) { return b.scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  return run(std::move(FingerprintBuilder(Op::ReduceScatter).tensors(outputs).reduceOp(opts.reduceOp)),
             deviceOf(outputs), [&](c10d::Backend& b) { return b.reduce_scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  InBandRequest inBand{InBandRequest::Kind::ReduceScatter};
  inBand.output = &output;
  inBand.input = &input;
  inBand.reduceScatter = &opts;
  return run(
      std::move(FingerprintBuilder(Op::ReduceScatterTensor).tensor(output).reduceOp(opts.reduceOp)),
      output.device().type(), [&](c10d::Backend& b) { return b._reduce_scatter_base(output, input, opts); }, &inBand);
}

c10::intrusive_ptr<c10d::Work> GuardBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::ReduceScatterOptions& opts) {
  return run(std::move(FingerprintBuilder(Op::ReduceScatterTensorCoalesced).tensors(outputs).reduceOp(opts.reduceOp)),
             deviceOf(outputs),
             [&](c10d::Backend& b) { return b.reduce_scatter_tensor_coalesced(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& outputSplitSizes,
                                                           std::vector<int64_t>& inputSplitSizes,
                                                           const c10d::AllToAllOptions& opts) {
  // Splits count rows of dim 0; compare elements so row shapes need not match.
  const int64_t inRow = input.dim() > 0 && input.size(0) > 0 ? input.numel() / input.size(0) : 0;
  const int64_t outRow = output.dim() > 0 && output.size(0) > 0 ? output.numel() / output.size(0) : 0;
  auto send = inputSplitSizes.empty() ? equalSplits(input.dim() ? input.size(0) : 0, getSize()) : inputSplitSizes;
  auto recv = outputSplitSizes.empty() ? equalSplits(output.dim() ? output.size(0) : 0, getSize()) : outputSplitSizes;
  for (auto& s : send) s *= inRow;
  for (auto& s : recv) s *= outRow;
  return run(std::move(FingerprintBuilder(Op::AllToAllSingle).rowShape(input).splits(getRank(), send, recv)),
             input.device().type(),
             [&](c10d::Backend& b) { return b.alltoall_base(output, input, outputSplitSizes, inputSplitSizes, opts); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  FingerprintBuilder b(Op::AllToAll);
  if (!inputs.empty() && inputs[0].defined()) {
    // Only the dtype is rank-invariant: per-peer tensors may have any shape.
    b.meta(inputs[0].scalar_type(), {}, inputs[0].device().type());
  }
  b.splits(getRank(), numels(inputs), numels(outputs));
  return run(std::move(b), deviceOf(inputs), [&](c10d::Backend& be) { return be.alltoall(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::barrier(const c10d::BarrierOptions& opts) {
  c10::DeviceType device = c10::DeviceType::CPU;
  if (opts.device.has_value()) {
    device = opts.device->type();
  } else if (!opts.device_ids.empty() && innerFor(c10::DeviceType::CUDA) != nullptr) {
    // Device ids name GPUs for NCCL; gloo ignores them. Without a CUDA inner backend
    // (a CPU-only job) the barrier runs on CPU, as it would on plain gloo: Hugging Face
    // Accelerate passes device_ids=[local_rank] on CPU too.
    device = c10::DeviceType::CUDA;
  }
  return run(FingerprintBuilder(Op::Barrier), device, [&](c10d::Backend& b) { return b.barrier(opts); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return run(std::move(FingerprintBuilder(Op::Send).tensors(tensors).peer(dstRank, tag)), deviceOf(tensors),
             [&](c10d::Backend& b) { return b.send(tensors, dstRank, tag); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  // By value: a strict receive may be posted after this call returns.
  return run(std::move(FingerprintBuilder(Op::Recv).tensors(tensors).peer(srcRank, tag)), deviceOf(tensors),
             [tensors, srcRank, tag](c10d::Backend& b) mutable { return b.recv(tensors, srcRank, tag); });
}

c10::intrusive_ptr<c10d::Work> GuardBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return run(std::move(FingerprintBuilder(Op::RecvAnySource).tensors(tensors).peer(-1, tag)), deviceOf(tensors),
             [&](c10d::Backend& b) { return b.recvAnysource(tensors, tag); });
}

void GuardBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  if (state_->failed()) std::rethrow_exception(surfaced(state_->failureError("monitored_barrier")));
  TORCH_CHECK(!shutdown_, "guard: monitored_barrier on a group that was shut down");
  innerOrThrow(c10::DeviceType::CPU, Op::Barrier).monitoredBarrier(opts, waitAllRanks);
}

// --- coalescing --------------------------------------------------------------

void GuardBackend::startCoalescing() {
  if (coalescing_) {
    // The previous block was abandoned (an op inside raised before torch called
    // endCoalescing): drop it rather than leak its works into this one.
    logMessage(LogLevel::Warning, "guard: a coalescing block on group \"" + state_->label() +
                                      "\" was never ended (an op in it raised?); starting a new one");
    if (nativeCoalescing_ != nullptr) {
      try {
        nativeCoalescing_->endCoalescing();
      } catch (const std::exception&) {
      }
    }
  }
  coalescing_ = true;
  nativeCoalescing_ = nullptr;
  coalescedIds_.clear();
  coalescedWorks_.clear();
}

c10::intrusive_ptr<c10d::Work> GuardBackend::endCoalescing() {
  TORCH_CHECK(coalescing_, "guard: endCoalescing() without startCoalescing() on group \"", state_->label(), "\"");
  coalescing_ = false;
  if (nativeCoalescing_ != nullptr) {
    c10d::Backend* inner = nativeCoalescing_;
    nativeCoalescing_ = nullptr;
    auto work = surfacing([inner] { return inner->endCoalescing(); });
    auto ids = std::move(coalescedIds_);
    coalescedIds_.clear();
    if (!work) {
      for (auto id : ids) state_->ledger().complete(id, true);
      return work;
    }
    for (size_t i = 0; i + 1 < ids.size(); ++i) state_->ledger().pollLater(ids[i], work);
    return GuardWork::wrap(state_, std::move(work), ids.empty() ? 0 : ids.back(), 0, Op::AllReduceCoalesced,
                           streamOrdered(coalescedDevice_));
  }
  auto works = std::move(coalescedWorks_);
  coalescedWorks_.clear();
  return c10::make_intrusive<CoalescedWork>(std::move(works));
}

// --- lifecycle and forwarding ---------------------------------------------

void GuardBackend::setSequenceNumberForGroup() {
  for (auto& kv : inner_) {
    if (kv.second.backend) compat::setSequenceNumber(*kv.second.backend);
  }
}

uint64_t GuardBackend::getSequenceNumberForGroup() {
  auto b = cpu_ ? cpu_ : inner_.begin()->second.backend;
  TORCH_CHECK(b, "guard: group \"", state_->label(), "\" was shut down");
  return b->getSequenceNumberForGroup();
}

void GuardBackend::setTimeout(std::chrono::milliseconds timeout) {
  for (auto& kv : inner_) {
    if (kv.second.backend) kv.second.backend->setTimeout(timeout);
  }
}

void GuardBackend::setGroupUid(const std::string& pgUid) {
  c10d::Backend::setGroupUid(pgUid);
  for (auto& kv : inner_) {
    if (kv.second.backend) kv.second.backend->setGroupUid(pgUid);
  }
  if (helper_) helper_->setGroupUid(pgUid + kHelperSuffix);
}

void GuardBackend::syncDesc() {
  // What records an operation under the group's (name, description) (Flight
  // Recorder: gloo records each collective it runs) records the user's group:
  // the inner backends get both; the helper's check collectives are filed
  // under a name of their own, never as the user's.
  state_->setDesc(pg_desc_);
  for (auto& kv : inner_) {
    if (kv.second.backend) kv.second.backend->setGroupDesc(pg_desc_);
  }
  if (helper_) helper_->setGroupDesc(pg_desc_ + kHelperSuffix);
}

void GuardBackend::eagerConnectSingleDevice(at::Device device) {
  if (auto b = innerFor(device.type())) b->eagerConnectSingleDevice(device);
}

c10d::ErrorType GuardBackend::getError() {
  if (auto f = state_->failure()) {
    return f->kind == GuardErrorKind::Timeout || f->kind == GuardErrorKind::Deadlock ? c10d::ErrorType::TIMEOUT
                                                                                     : c10d::ErrorType::COMM_ERROR;
  }
  if (cuda_) return cuda_->getError();
  return c10d::ErrorType::SUCCESS;
}

c10::intrusive_ptr<c10d::Backend::Options> GuardBackend::getBackendOptions() {
  auto opts = c10::make_intrusive<c10d::Backend::Options>("guard", state_->timeout());
  opts->group_name = state_->id().name;
  opts->global_ranks_in_group.assign(state_->id().globalRanks.begin(), state_->id().globalRanks.end());
  return opts;
}

void GuardBackend::abort() {
  state_->incidents().failGroup(
      *state_, GroupFailure{GuardErrorKind::Failure, "process group \"" + state_->label() + "\" was aborted on rank " +
                                                         std::to_string(getRank()) + " (abort() was called)"});
  stopWatchdog();
}

#if TORCH_EXT_HAS_ABORT_HOOKS
bool GuardBackend::supportsAbortHooks() const {
  return true;
}

void GuardBackend::registerAbortHook(int64_t hookId, c10d::AbortHook hook) {
  state_->addFailureHook(hookId, std::move(hook));
}

void GuardBackend::unregisterAbortHook(int64_t hookId) {
  state_->removeFailureHook(hookId);
}
#endif

std::chrono::milliseconds GuardBackend::drainBound() const {
  return std::chrono::milliseconds(static_cast<int64_t>(state_->config().storeTimeoutS * 1000.0));
}

void GuardBackend::awaitVerdicts() {
  if (!state_->failed()) state_->mode().drain(drainBound());
  if (!state_->failed()) return;
  // The sync point: what the program reads next is filled, as a held stream
  // would be past the gate (the abort hook poisons, right after the failure).
  if (device::StreamGate* gate = state_->streamGate()) {
    gate->awaitHostPoison(drainBound());
  }
  std::rethrow_exception(surfaced(state_->failureError()));
}

void GuardBackend::shutdown() {
  if (shutdown_) return;
  shutdown_ = true;
  // No clean exit over a pending verdict: the mode drains (bounded by the
  // store timeout, like every exit path) what this rank issued; a difference
  // found meanwhile fails the group, and destroy_process_group() raises it below.
  state_->mode().shutdown(drainBound());
  // A mismatch the program never saw raised (found during the drain, or on a
  // collective nobody waited on) is raised here; one it saw is not raised again.
  const bool mismatched =
      state_->failed() && state_->failure()->kind == GuardErrorKind::Mismatch && !state_->failureRaised();
  stopWatchdog();
  if (state_->failed() || Watchdog::instance().exiting()) {
    // Failed inners stay alive on purpose, untouched: shutting down a gloo
    // group whose peer is gone can block (see keepForever).
    keepInnersForever();
    // Never a clean exit over a mismatch: a rank that reads nothing more
    // still ends with the error every rank raises.
    if (mismatched) std::rethrow_exception(surfaced(state_->failureError()));
    return;
  }
  for (auto& kv : inner_) kv.second.backend->shutdown();
  // Release the inner and helper backends now: torch may keep this object alive
  // after destroy_process_group(), and their threads should not outlive it.
  state_->setAbortHook(nullptr);
  for (auto& kv : inner_) kv.second.backend.reset();
  cpu_.reset();
  cuda_.reset();
  helper_.reset();
  checks_.reset();
  state_->mode().dropBackends();  // the helper, and the send/recv words still in flight
  // Their workers have let go of every work by now: free the ones kept for
  // them (a gloo work holds its context, and so the transport's thread).
  WorkRetirement::instance().sweepAll();
}

}  // namespace torch_ext
