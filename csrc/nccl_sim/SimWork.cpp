#include "nccl_sim/SimWork.h"

#include <c10/util/Exception.h>

namespace torch_ext::nccl_sim {

SimWork::SimWork(std::shared_ptr<SimStream> stream, std::shared_ptr<StreamOp> op, int rank, c10d::OpType type)
    : c10d::Work(rank, type), stream_(std::move(stream)), op_(std::move(op)) {}

bool SimWork::streamStarted() const {
  return op_->started.load(std::memory_order_acquire) || op_->state.load() != OpState::Queued;
}

bool SimWork::isCompleted() {
  return op_->state.load() != OpState::Queued;
}

bool SimWork::isSuccess() const {
  return op_->state.load() == OpState::Done;
}

std::exception_ptr SimWork::exception() const {
  if (op_->state.load() != OpState::Failed) return nullptr;
  return std::make_exception_ptr(c10::DistBackendError(op_->error));
}

std::vector<at::Tensor> SimWork::result() {
  return op_->outputs;
}

bool SimWork::wait(std::chrono::milliseconds /*timeout*/) {
  // Stream order only (see the header), unless TORCH_EXT_NCCL_SIM_WAIT=data;
  // a failure already known is raised.
  if (stream_->waitsForData() && !stream_->waitFor(*op_) && op_->state.load() != OpState::Failed) {
    throw c10::DistBackendError("nccl_sim: " + op_->name + ": the communicator " + stream_->label() +
                                " was aborted while wait() waited for it");
  }
  if (op_->state.load() == OpState::Failed) throw c10::DistBackendError(op_->error);
  return true;
}

void SimWork::synchronize() {
  wait();
}

void SimWork::abort() {
  stream_->abort("Work.abort() was called on " + op_->name);
}

c10::intrusive_ptr<c10::ivalue::Future> SimWork::getFuture() {
  return op_->future;
}

float SimWork::getDuration() const {
  TORCH_CHECK(op_->state.load() == OpState::Done, "nccl_sim: ", op_->name, " has not completed: no duration yet");
  return static_cast<float>(op_->durationNs) / 1e6f;
}

}  // namespace torch_ext::nccl_sim
