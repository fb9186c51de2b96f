#pragma once

// GuardBackend: the c10d backend registered as "guard".
//
// It wraps the real backends (one per device type: gloo for CPU, NCCL for CUDA,
// or any registered backend) that torch created for us, and sends every
// operation through ONE generic path, run():
//
//   fingerprint -> ledger -> [mode: before] -> inner backend -> [mode: after] -> GuardWork
//                                                                                   |
//                                    [mode's release gate: verify's Verifier] <-----+
//
// (the group's check mode is an object, collective/Mode.h, made by
// modes/Modes.h: "strict" compares before the inner op; "verify", the default,
// issues the op at once and its GuardWork hands the result over only once the
// Verifier has found every rank issued the same collectives up to it; "async"
// compares in the watchdog's exchange, after the fact.)
// so no collective has a hand-copied body that could drift from the others. The
// per-op overrides below only say which tensors are rank-invariant (what goes
// into the fingerprint) and which inner method to call.
//
// One ProcessGroup holds at most one CUSTOM backend, so the same GuardBackend
// serves every device: the inner backend is chosen per call from the device of
// the tensors.

#include "guard/Config.h"
#include "guard/TorchCompat.h"
#include "guard/collective/CollectiveChecks.h"
#include "guard/collective/Fingerprint.h"
#include "guard/collective/GroupState.h"
#include "guard/store/StoreChannel.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torch_ext {

struct InBandRequest;  // collective/InBandRequest.h

struct InnerBackend {
  std::string name;  // "gloo", "nccl", ...
  c10::intrusive_ptr<c10d::Backend> backend;
  // Its works complete on a stream (NCCL, nccl_sim): see StreamOrdered.h.
  bool streamOrdered = false;
};

class GuardBackend : public c10d::Backend {
 public:
  // `store` is the group's store (the guard talks to it through a StoreChannel
  // of its own; `storeAddress` names who serves it, for reports); `inner` maps
  // device type ("cpu", "cuda") to the wrapped backend; `helper` is a CPU
  // backend for the guard's own check collectives (null with checks off).
  GuardBackend(c10::intrusive_ptr<c10d::Store> store, StoreAddress storeAddress, int rank, int size,
               std::chrono::milliseconds timeout, std::string groupName, std::vector<int64_t> globalRanks,
               Config config, std::map<std::string, InnerBackend> inner, c10::intrusive_ptr<c10d::Backend> helper);
  ~GuardBackend() override;

  const std::string getBackendName() const override {
    return "guard";
  }

  const std::shared_ptr<GroupState>& state() const {
    return state_;
  }
  // The wrapped backend for `device`, or null.
  c10::intrusive_ptr<c10d::Backend> innerFor(c10::DeviceType device) const;
  const std::map<std::string, InnerBackend>& inners() const {
    return inner_;
  }
  // check="verify": waits (bounded by the store timeout) until what this rank
  // issued is known to agree across ranks; throws the group's typed error if
  // it failed (a difference found meanwhile). A sync point's gate
  // (nccl_sim.synchronize()): results issued before it may be read after it.
  void awaitVerdicts();
  std::string repr() const;

  // --- collectives -------------------------------------------------------
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks = false) override;

  // --- coalescing ----------------------------------------------------------
  // Always "supported": native where the inner backend has it (NCCL), emulated
  // otherwise (the block's ops run one by one; endCoalescing waits for all).
  bool supportsCoalescing() const override {
    return true;
  }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  // --- lifecycle and forwarding -----------------------------------------------
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  void setGroupUid(const std::string& pgUid) override;
  void eagerConnectSingleDevice(at::Device device) override;
  c10d::ErrorType getError() override;
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override;
  void abort() override;
#if TORCH_EXT_HAS_ABORT_HOOKS
  // torch 2.15: hooks that run when the group fails (GroupState::addFailureHook),
  // before its inner backends are aborted.
  bool supportsAbortHooks() const override;
  void registerAbortHook(int64_t hookId, c10d::AbortHook hook) override;
  void unregisterAbortHook(int64_t hookId) override;
#endif
  void shutdown() override;

 private:
  // The one path every operation takes. `call` invokes the inner backend;
  // `inBand`: the collective may carry its own check (InBandRequest.h).
  template <typename Call>
  c10::intrusive_ptr<c10d::Work> run(FingerprintBuilder&& builder, c10::DeviceType device, Call&& call,
                                     const InBandRequest* inBand = nullptr);
  // run()'s body: errors as the core throws them (run hands them out through
  // the error surface, Errors.h).
  template <typename Call>
  c10::intrusive_ptr<c10d::Work> issue(FingerprintBuilder&& builder, c10::DeviceType device, Call&& call,
                                       const InBandRequest* inBand);
  // issue()'s steps: the group takes the op (not failed, not shut down) and
  // names its inner backend; a native coalescing block starts on its first
  // op; a refusal of the inner backend gets the op's context; the work goes
  // to the program (or to the coalescing block).
  c10d::Backend& admit(Op op, c10::DeviceType device);
  void joinNativeCoalescing(c10d::Backend& inner, c10::DeviceType device);
  void innerRefused(const Operation& op, c10d::Backend& inner, c10::Error& e);
  c10::intrusive_ptr<c10d::Work> handOut(const Operation& op, c10::intrusive_ptr<c10d::Work> work);
  c10d::Backend& innerOrThrow(c10::DeviceType device, Op op);
  [[noreturn]] void failWhileIssuing(uint64_t id, const std::exception& e);
  void stopWatchdog();
  // Keeps the inner and helper backends alive for good (see keepForever).
  void keepInnersForever();

  std::shared_ptr<GroupState> state_;
  std::map<std::string, InnerBackend> inner_;
  // Fast lookup for the two common device types.
  c10::intrusive_ptr<c10d::Backend> cpu_;
  c10::intrusive_ptr<c10d::Backend> cuda_;
  // How works of each device's inner backend complete (StreamOrdered.h).
  bool streamOrdered(c10::DeviceType device) const;
  bool cpuStreamOrdered_ = false;
  // How long a drain at a sync point or shutdown waits: the store timeout.
  std::chrono::milliseconds drainBound() const;
  bool cudaStreamOrdered_ = false;
  c10::intrusive_ptr<c10d::Backend> helper_;
  std::string innerNames_;

  // The group's check mode applied to each op (CollectiveChecks.h).
  std::unique_ptr<CollectiveChecks> checks_;

  // Coalescing state (one block at a time per group, as in torch).
  bool coalescing_ = false;
  c10d::Backend* nativeCoalescing_ = nullptr;
  std::vector<uint64_t> coalescedIds_;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalescedWorks_;
  c10::DeviceType coalescedDevice_ = c10::DeviceType::CPU;

  // The user's description, to the state and the inner backends; the
  // helper's name and description are the group's with kHelperSuffix.
  void syncDesc();
  static constexpr const char* kHelperSuffix = ":torch_ext_check";

  bool stopped_ = false;
  bool descSynced_ = false;
  bool shutdown_ = false;
};

}  // namespace torch_ext
