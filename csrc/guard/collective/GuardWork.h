#pragma once

// GuardWork: the Work handed to torch for a guarded operation. It wraps the
// inner backend's Work and adds two things: completion updates the ledger, and a
// failure of the group (mismatch found by the watchdog, timeout, abort) wakes a
// blocked wait() with a typed error instead of letting it hang.
//
// How completion is observed depends on what the inner Work offers:
//  - Future: CPU works with a future (gloo collectives). A callback on the inner
//    future completes the ledger record; wait() blocks on the group's condition
//    variable, so a group failure can interrupt it. Our own future, which a
//    group failure errors, is made only when asked for (getFuture): a plain
//    wait() costs no future of ours (issue 11).
//  - Blocking: CPU works without a future (gloo send/recv). wait() calls the inner
//    wait(); a group failure aborts the inner work, which makes that wait return.
//  - Device: works of a stream-ordered inner backend (NCCL; nccl_sim on CPU, see
//    StreamOrdered.h), whatever the tensors' device. wait() keeps the inner
//    semantics (stream ordering, no host block); the watchdog polls
//    isCompleted(), reports a failed one to every rank and fails the group,
//    which aborts the inner backend.

#include "guard/collective/Fingerprint.h"
#include "guard/collective/GroupState.h"
#include "guard/collective/InnerFuture.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <mutex>
#include <vector>

namespace torch_ext {

class GuardWork : public c10d::Work, public ForwardsFuture {
 public:
  enum class Completion : uint8_t { Future, Blocking, Device };

  // Wraps `inner` (recorded as ledger record `id`) and starts tracking
  // completion; `streamOrdered`: the inner backend completes works on a stream.
  static c10::intrusive_ptr<GuardWork> wrap(const std::shared_ptr<GroupState>& state,
                                            c10::intrusive_ptr<c10d::Work> inner, uint64_t id, uint64_t seq, Op op,
                                            bool streamOrdered, bool inBand = false);

  GuardWork(std::shared_ptr<GroupState> state, c10::intrusive_ptr<c10d::Work> inner, uint64_t id, uint64_t seq, Op op,
            Completion completion, c10::intrusive_ptr<c10::ivalue::Future> innerFuture);
  // Hands the inner work and our future to WorkRetirement: the inner backend's
  // worker may still hold them, and must not be the one to free them.
  ~GuardWork() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  int sourceRank() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void blockCurrentStream() override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  float getDuration() const override;
  uint64_t getSequencenumber() const override;

  const c10::intrusive_ptr<c10d::Work>& inner() const {
    return inner_;
  }
  // "all_reduce #12 on group \"default_pg\"", for errors.
  std::string describe() const;

 private:
  // The inner work failed with `err`: fail the group with a cross-rank report
  // (unless it failed already) and throw the group's error.
  [[noreturn]] void failFromInner(const std::string& err);
  // What failFromInner throws, as an exception (waits a few seconds at most).
  static std::exception_ptr innerFailure(const std::shared_ptr<GroupState>& state, uint64_t id, const std::string& err);
  // wait() and isCompleted() inside the guard: GuardErrors as the core throws
  // them; the public ones hand them out through the error surface (Errors.h).
  bool waitOrThrow(std::chrono::milliseconds timeout);
  bool completedOrThrow();
  // The group's failure as an exception (the group has failed).
  std::exception_ptr groupFailure() const;
  // Completes record `id` from the finished `inner` future and, if one is
  // tracked for it and not yet taken, our future too.
  static void settle(const std::shared_ptr<GroupState>& state, uint64_t id, uint64_t seq,
                     const c10::intrusive_ptr<c10::ivalue::Future>& inner);
  // Completes our future from the inner one (which completed without error),
  // once check="verify" releases collective `seq` (at once in other modes and
  // for p2p).
  static void release(GroupState& state, uint64_t seq, c10::intrusive_ptr<c10::ivalue::Future> ours,
                      const c10::intrusive_ptr<c10::ivalue::Future>& inner);
  // The release gate that holds this work's result (null when none does).
  ReleaseGate* gate() const;
  // The result may be handed out: not gated, verified, or an error.
  bool released() const;
  // The collective completed but is not released: throws the group's failure
  // once a found difference has failed it, or the caller's timeout.
  [[noreturn]] void awaitVerdict(ReleaseGate* gate, std::chrono::milliseconds timeout);
  // Device completion: the release gate that holds a result already on the host (the
  // inner work has completed), or null (not gated, or the data is still on
  // its way: a stream backend orders, the host does not wait).
  ReleaseGate* hostGate();
  static void completeFrom(c10::ivalue::Future& ours, c10::ivalue::Future& inner);
  // Device completion, check="verify" with a stream gate: the current stream of
  // `outputs`' device waits for this collective's verdict (nothing if it is in).
  // `asked`: a wait, which starts the verdict's round now.
  static void holdStream(GroupState& state, uint64_t seq, const std::vector<at::Tensor>& outputs,
                         c10::intrusive_ptr<c10::ivalue::Future> landed = {}, bool asked = true);
  // holdStream for this work's own result, after the cheap checks (Device completion).
  void holdOwnResult();
  // What completes once the inner work wrote its result (null: written, or no future).
  c10::intrusive_ptr<c10::ivalue::Future> landed() const;
  static std::vector<at::Tensor> tensorsOf(const c10::IValue& value);
  // Device completion's getFuture(): the inner future's completion, with the
  // group's verdict as its error.
  c10::intrusive_ptr<c10::ivalue::Future> deviceFuture();

  std::shared_ptr<GroupState> state_;
  c10::intrusive_ptr<c10d::Work> inner_;
  uint64_t id_;
  uint64_t seq_;
  Op op_;
  Completion completion_;
  c10::intrusive_ptr<c10::ivalue::Future> innerFuture_;  // Completion::Future only
  std::once_flag futureOnce_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;  // ours: made by getFuture()
  // The collective carries its own check (InBandCheck.h): its verdict comes
  // with its data, so a wait does not ask the gate for a round.
  bool inBand_ = false;
};

// The work of an emulated coalescing block (inner backends without native
// coalescing, e.g. gloo): the block's ops ran one by one; this waits for all.
class CoalescedWork : public c10d::Work, public ForwardsFuture {
 public:
  explicit CoalescedWork(std::vector<c10::intrusive_ptr<c10d::Work>> works);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
};

}  // namespace torch_ext
