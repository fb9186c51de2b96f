#include "nccl_sim/SimStream.h"

#include "guard/collective/InnerFuture.h"

#include <c10/util/Exception.h>

#include <chrono>
#include <thread>

namespace torch_ext::nccl_sim {

namespace {

int64_t steadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::shared_ptr<SimStream> SimStream::start(std::string label, int rank, int size, bool faultsApply,
                                            NcclSimSettings settings) {
  std::shared_ptr<SimStream> s(new SimStream(std::move(label), rank, size, faultsApply, settings));
  // The thread owns the stream: it may outlive the communicator (stuck in a
  // transport wait until the transport's own timeout), never the other way.
  std::thread([s] { s->run(); }).detach();
  return s;
}

SimStream::SimStream(std::string label, int rank, int size, bool faultsApply, NcclSimSettings settings)
    : label_(std::move(label)), rank_(rank), size_(size), faultsApply_(faultsApply), settings_(settings) {}

bool SimStream::appliesAt(const NcclSimSettings::Fault& f, uint64_t index) const {
  return faultsApply_ && f.rank == rank_ && static_cast<uint64_t>(f.value) == index;
}

std::string SimStream::abortedText() const {
  return "nccl_sim: communicator " + label_ + " (rank " + std::to_string(rank_) + ") was aborted (" + abortReason_ +
         ")";
}

void SimStream::enqueue(const std::shared_ptr<StreamOp>& op) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return aborted_ || queue_.size() < static_cast<size_t>(settings_.queueDepth); });
  if (aborted_) throw c10::DistBackendError(abortedText() + ": " + op->name + " was not issued");
  op->index = ++issued_;
  queue_.push_back(op);
  cv_.notify_all();
}

void SimStream::synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = issued_;
  cv_.wait(lock, [&] { return aborted_ || finished_ >= target; });
  if (aborted_) throw c10::DistBackendError(abortedText());
  if (!error_.empty()) throw c10::DistBackendError("nccl_sim: communicator " + label_ + " is in error: " + error_);
}

bool SimStream::waitFor(const StreamOp& op) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return aborted_ || op.state.load() != OpState::Queued; });
  return op.state.load() == OpState::Done;
}

bool SimStream::drain(std::chrono::milliseconds bound) {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t target = issued_;
  return cv_.wait_for(lock, bound, [&] { return aborted_ || finished_ >= target; }) && !aborted_;
}

void SimStream::abort(const std::string& why) {
  std::vector<std::shared_ptr<StreamOp>> failed;
  c10::intrusive_ptr<c10d::Work> current;
  std::string text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    abortReason_ = why;
    text = abortedText();
    failed.assign(queue_.begin(), queue_.end());
    finished_ += queue_.size();
    queue_.clear();
    current = current_;
    cv_.notify_all();
  }
  for (auto& op : failed) {
    std::string note;
    {
      std::lock_guard<std::mutex> lock(mu_);
      note = op->hangNote;
    }
    settle(*op, false, text + " while " + op->name + " was pending" + (note.empty() ? "" : " (" + note + ")"));
  }
  if (current) {
    try {
      current->abort();  // a transport p2p wait (gloo's send/recv works can be aborted)
    } catch (const std::exception&) {
    }
  }
}

void SimStream::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_all();
}

bool SimStream::aborted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aborted_;
}

size_t SimStream::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

std::string SimStream::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void SimStream::settle(StreamOp& op, bool ok, const std::string& error) {
  {
    // Once: the stream's thread and abort() may both settle the running op.
    std::lock_guard<std::mutex> lock(mu_);
    if (op.state.load() != OpState::Queued) return;
    if (!ok) op.error = error;  // before the state: readers load the state first
    op.state.store(ok ? OpState::Done : OpState::Failed);
    cv_.notify_all();  // waitFor()
  }
  if (!op.future) return;
  if (ok) {
    c10::List<at::Tensor> list;
    for (const auto& t : op.outputs) list.push_back(t);
    op.future->markCompleted(c10::IValue(list));
  } else {
    op.future->setErrorIfNeeded(std::make_exception_ptr(c10::DistBackendError(error)));
  }
}

void SimStream::run() {
  for (;;) {
    std::shared_ptr<StreamOp> op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return aborted_ || stopping_ || !queue_.empty(); });
      if (aborted_ || queue_.empty()) return;
      op = queue_.front();
    }
    execute(*op);
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;  // abort() failed and counted it
    queue_.pop_front();
    ++finished_;
    cv_.notify_all();
  }
}

void SimStream::execute(StreamOp& op) {
  if (appliesAt(settings_.stall, op.index)) {
    hang();  // a kernel whose peer never comes: nothing more runs until abort()
    return;
  }
  if (faultsApply_ && settings_.slow.rank == rank_ && settings_.slow.value > 0) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(settings_.slow.value), [&] { return aborted_; });
    if (aborted_) return;
  }
  std::string earlier;
  {
    std::lock_guard<std::mutex> lock(mu_);
    earlier = error_;
  }
  if (!earlier.empty()) {
    settle(op, false,
           "nccl_sim: communicator " + label_ + " is in error after an earlier failure (" + earlier + "): " + op.name +
               " did not run");
    return;
  }
  if (appliesAt(settings_.fail, op.index)) {
    const std::string text = "nccl_sim: " + op.name + " (operation " + std::to_string(op.index) + " on the stream of " +
                             label_ + ") failed: injected by TORCH_EXT_NCCL_SIM_FAIL=" + std::to_string(rank_) + ":" +
                             std::to_string(op.index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (error_.empty()) error_ = text;
    }
    settle(op, false, text);
    return;
  }
  const int64_t start = steadyNowNs();
  std::string error;
  bool ok = true;
  op.started.store(true, std::memory_order_release);
  try {
    if (!agree(op, &error)) {
      if (error.empty()) return;  // aborted, or hung until abort()/stop()
      ok = false;
    }
  } catch (const std::exception& e) {
    ok = false;
    error = e.what();
  }
  try {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& launch : ok ? op.launches : decltype(op.launches){}) {
      for (auto& w : launch()) {
        if (w) works.push_back(std::move(w));
      }
    }
    for (auto& w : works) {
      if (!await(w, &error)) {
        if (error.empty()) return;  // aborted: abort() settled it
        ok = false;
        break;
      }
    }
    if (ok) {
      for (auto& finish : op.finishes) finish();
    }
  } catch (const std::exception& e) {
    ok = false;
    error = e.what();
  }
  op.durationNs = steadyNowNs() - start;
  if (!ok) {
    error = "nccl_sim: " + op.name + " failed on the stream of " + label_ + ": " +
            error.substr(0, error.find("\nException raised from"));
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    if (error_.empty()) error_ = error;
  }
  settle(op, ok, error);
}

void SimStream::hang() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return aborted_ || stopping_; });
}

bool SimStream::agree(StreamOp& op, std::string* error) {
  if (op.agreement.empty() || !op.transport) return true;
  AgreementRound round(op.agreement, size_);
  for (auto& w : round.launch(*op.transport)) {
    if (!await(w, error)) return false;
  }
  const std::string diff = round.verdict();
  if (diff.empty()) return true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    op.hangNote = "nccl_sim: its counts do not fit across ranks, so it hangs as NCCL would: " + diff;
  }
  hang();
  return false;
}

bool SimStream::await(const c10::intrusive_ptr<c10d::Work>& work, std::string* error) {
  // gloo's send/recv works have no future: wait on the work, which abort() can release.
  c10::intrusive_ptr<c10::ivalue::Future> fut = futureOf(*work);
  if (fut) {
    std::weak_ptr<SimStream> weak = weak_from_this();
    fut->addCallback([weak](c10::ivalue::Future&) {
      if (auto s = weak.lock()) {
        std::lock_guard<std::mutex> lock(s->mu_);
        s->cv_.notify_all();
      }
    });
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return aborted_ || fut->completed(); });
    if (aborted_) return false;
    if (fut->hasError()) {
      *error = fut->tryRetrieveErrorMessage();
      return false;
    }
    return true;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return false;
    current_ = work;
  }
  bool ok = true;
  try {
    ok = work->wait();
  } catch (const std::exception& e) {
    ok = false;
    *error = e.what();
  }
  std::lock_guard<std::mutex> lock(mu_);
  current_.reset();
  if (aborted_) {
    error->clear();
    return false;
  }
  if (!ok && error->empty()) *error = "the transport's wait() returned false";
  return ok;
}

}  // namespace torch_ext::nccl_sim
