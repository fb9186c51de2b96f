#pragma once

// SimWork: the Work of one nccl_sim operation, with WorkNCCL's host behaviour.
//  - wait() / synchronize(): on NCCL they make the caller's current stream wait
//    for the collective and return; the host does not block. Here they return
//    at once too (raising only if the operation has failed already), and the
//    order is the stream's: everything issued later on the same communicator
//    runs after it. Reading the data needs a sync point: nccl_sim's
//    synchronize() (torch.cuda.synchronize() on a GPU). With
//    TORCH_EXT_NCCL_SIM_WAIT=data, wait() blocks until the data is there
//    (on CPU the host is the compute stream that reads it).
//  - isCompleted() / isSuccess() / exception(): follow the stream, like
//    WorkNCCL's end-event query.
//  - getFuture(): completed when the stream has run the operation, with its
//    outputs. (WorkNCCL's future is marked complete right after enqueue, and
//    the CUDA streams order its callbacks after the kernel; CPU code has no
//    stream to be ordered on, so here the callbacks run once the data is
//    there, which is what they observe on a GPU.)
//  - abort(): aborts the communicator, as WorkNCCL::abort() does.

#include "guard/collective/StreamOrdered.h"
#include "nccl_sim/SimStream.h"

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>

namespace torch_ext::nccl_sim {

class SimWork : public c10d::Work, public StreamStartAware {
 public:
  SimWork(std::shared_ptr<SimStream> stream, std::shared_ptr<StreamOp> op, int rank, c10d::OpType type);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  void abort() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  float getDuration() const override;
  // The stream began the operation's exchange: false while it is queued
  // behind another, or stalled (TORCH_EXT_NCCL_SIM_STALL) at it.
  bool streamStarted() const override;

 private:
  std::shared_ptr<SimStream> stream_;
  std::shared_ptr<StreamOp> op_;
};

}  // namespace torch_ext::nccl_sim
