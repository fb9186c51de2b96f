#include "guard/modes/async/AsyncMode.h"

#include "guard/collective/WorkRetirement.h"

#include "guard/Runtime.h"

#include <ATen/ATen.h>

namespace torch_ext {

std::shared_ptr<Mode> AsyncMode::make(const std::shared_ptr<GroupState>& state,
                                      c10::intrusive_ptr<c10d::Backend> helper) {
  return std::make_shared<AsyncMode>(state, std::move(helper));
}

AsyncMode::AsyncMode(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper)
    : Mode(Answers{true, false, state->config().callPaths == CallPathMode::On}),
      st_(*state),
      weak_(state),
      helper_(std::move(helper)) {}

void AsyncMode::afterInner(const Operation& op, bool /*issued*/) {
  if (helper_ && isAllToAll(op.op)) auditSplits(op.splitSend, op.splitRecv);
}

AsyncMode::~AsyncMode() {
  WorkRetirement::instance().keep(std::move(helper_));
}

void AsyncMode::dropBackends() {
  helper_.reset();
}

void AsyncMode::auditSplits(uint64_t splitSend, uint64_t splitRecv) {
  const int size = st_.id().size;
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
  std::weak_ptr<GroupState> weak = weak_;
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
