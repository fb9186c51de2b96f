#pragma once

// NcclSimBackend: "nccl_sim", a c10d backend with NCCL's host semantics on CPU
// tensors, so that the guard's device path (GuardWork::Completion::Device) and a
// user's NCCL training loop can run on a CPU-only CI machine.
//
// Each communicator (process group) has one stream (SimStream). Every
// operation is queued on it and returns at once with a SimWork; the stream runs
// the exchange on a private gloo group (the transport), in issue order. Point by
// point against ProcessGroupNCCL (docs/testing.md, "nccl_sim"):
//  - issue returns at once; the host is never held by a peer (only by a full
//    queue, TORCH_EXT_NCCL_SIM_QUEUE, like CUDA's launch queue);
//  - wait() returns without waiting for the data (stream order only);
//  - isCompleted()/isSuccess()/exception() follow the stream;
//  - a stuck operation (a peer that never comes, or TORCH_EXT_NCCL_SIM_STALL)
//    runs until abort()/shutdown(), which fail it and everything queued;
//  - counts that differ across ranks (CountAgreement, agreed before the data
//    moves) hang the stream at the operation, as on NCCL, where gloo would
//    std::terminate the rank that receives more bytes than it posted;
//  - one failed operation leaves the communicator in error (everything after
//    it fails), like NCCL's asynchronous errors;
//  - synchronize() (nccl_sim.synchronize() in Python) blocks the host until
//    the stream is idle, with no timeout of its own;
//  - coalescing blocks (batch_isend_irecv, *_coalesced) run as one stream
//    operation, so a block's sends and receives pair in any order, as in an
//    NCCL group call; outside a block a receive posted before the matching send
//    on the same stream deadlocks, as it does on NCCL;
//  - ReduceOp.AVG is supported (a sum, then a division on the stream);
//    PREMUL_SUM and recv from any source are refused at issue.
// Differences that remain: data lives in host memory, so host code that reads
// a result must synchronize first where CUDA would do it implicitly (.item(),
// .cpu(), print); the future completes when the data is there (see SimWork).

#include "guard/collective/StreamOrdered.h"
#include "nccl_sim/NcclSimSettings.h"
#include "nccl_sim/SimStream.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torch_ext::nccl_sim {

class NcclSimBackend : public c10d::Backend, public StreamOrdered {
 public:
  // `transport` carries the data (a gloo group of the same ranks, private to
  // this communicator); `faultsApply`: the test switches apply here (the
  // default group). `label` names it in messages.
  NcclSimBackend(int rank, int size, std::string label, bool faultsApply, c10::intrusive_ptr<c10d::Backend> transport,
                 NcclSimSettings settings);
  ~NcclSimBackend() override;

  const std::string getBackendName() const override {
    return "nccl_sim";
  }
  bool supportsCoalescing() const override {
    return true;
  }

  // Blocks until this communicator's stream has run everything issued so far.
  void synchronizeStream();
  const std::shared_ptr<SimStream>& stream() const {
    return stream_;
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
  // Sequence numbers for torch's group bookkeeping: the transport's.
  void setSequenceNumberForGroup() override;
  uint64_t getSequenceNumberForGroup() override;
  c10d::ErrorType getError() override;
  void abort() override;
  void shutdown() override;

 private:
  using Launch = std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&)>;
  // Queues one operation (or adds it to the open coalescing block).
  // `agreement`: what the exchange expects of the peers (CountAgreement).
  c10::intrusive_ptr<c10d::Work> issue(const char* name, c10d::OpType type, std::vector<at::Tensor> outputs,
                                       Agreement agreement, Launch launch, std::function<void()> finish = {});
  // ReduceOp.AVG runs as SUM followed by a division of `outputs` (NCCL has
  // AVG, gloo does not); PREMUL_SUM is refused. Returns the op for the transport.
  c10d::ReduceOp transportOp(const c10d::ReduceOp& op, const char* name) const;
  std::function<void()> averageOf(const c10d::ReduceOp& op, std::vector<at::Tensor> outputs) const;
  std::shared_ptr<StreamOp> newOp(std::string name) const;

  const std::string label_;
  c10::intrusive_ptr<c10d::Backend> transport_;
  std::shared_ptr<SimStream> stream_;
  std::shared_ptr<StreamOp> block_;  // the open coalescing block
  bool shutdown_ = false;
};

}  // namespace torch_ext::nccl_sim
