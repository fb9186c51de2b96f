#include "guard/modes/strict/DeferredReceives.h"

#include "guard/Errands.h"
#include "guard/collective/StoreExchange.h"
#include "guard/store/StoreKeys.h"

#include <condition_variable>

namespace torch_ext {

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

namespace {

// How often the poster looks for the print of the oldest deferred receive.
constexpr std::chrono::milliseconds kPrintPoll{20};

}  // namespace

bool DeferredReceives::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !queue_.empty();
}

c10::intrusive_ptr<c10d::Work> DeferredReceives::defer(const std::shared_ptr<GroupState>& state, const Fingerprint& fp,
                                                       uint64_t ordinal, std::string where, Post post) {
  auto work = c10::make_intrusive<DeferredReceiveWork>();
  Entry e;
  e.src = fp.root;
  e.key = keys::p2pPrint(e.src, state->id().rank, fp.tag, ordinal);
  e.fp = fp;
  e.ordinal = ordinal;
  e.where = std::move(where);
  e.post = std::move(post);
  e.work = work;
  bool start = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(e));
    start = !posting_;
    posting_ = true;
  }
  if (start) {
    // A short-lived poster (an errand): it drains the queue and ends. It
    // holds the queue and the group's state, never the backend.
    Errands::instance().run("strict receive poster of group " + state->label(),
                            [self = shared_from_this(), state] { self->postAll(state); });
  }
  return work;
}

void DeferredReceives::cancelAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& q : queue_) q.work->cancel();
  queue_.clear();
  posting_ = false;
}

void DeferredReceives::postAll(const std::shared_ptr<GroupState>& state) {
  GroupState& st = *state;
  while (true) {
    Entry* front = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty()) {
        posting_ = false;
        return;
      }
      front = &queue_.front();  // only this thread pops: stays valid
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
        st.incidents().failGroup(
            st, GroupFailure{GuardErrorKind::Failure, std::string("guard: a deferred receive failed: ") + e.what()});
      cancelAll();
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    queue_.pop_front();
  }
}

}  // namespace torch_ext
