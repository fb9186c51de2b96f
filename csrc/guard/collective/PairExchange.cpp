#include "guard/collective/PairExchange.h"

#include "guard/Errands.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <type_traits>
#include <vector>

namespace torch_ext {

namespace {

// An exchange's work: its receive and send on the inner backend, and `finish`
// (the reduction, the verdict) once both are done, on the one thread that
// claimed it (PairExchange.h).
class ExchangeWork : public c10d::Work {
 public:
  ExchangeWork(c10::intrusive_ptr<c10d::Work> recv, c10::intrusive_ptr<c10d::Work> send, std::function<void()> finish,
               at::Tensor user)
      : c10d::Work(-1, c10d::OpType::ALLREDUCE),
        recv_(std::move(recv)),
        send_(std::move(send)),
        finish_(std::move(finish)),
        user_(std::move(user)) {}
  ~ExchangeWork() override {
    // A receive that did not complete is left to the process (PairExchange.h).
    if (state_ != State::Done || !ok_ || error_) {
      (void)recv_.release();
      (void)send_.release();
    }
  }

  bool isCompleted() override {
    drainInBackground();
    std::lock_guard<std::mutex> lock(mu_);
    return state_ == State::Done;
  }
  bool isSuccess() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return state_ == State::Done && ok_ && !error_;
  }
  std::exception_ptr exception() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    bool mine = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (state_ == State::Idle && timeout == kNoTimeout) {
        state_ = State::Running;
        mine = true;
      }
    }
    if (mine) {
      run();
    } else {
      drainInBackground();  // a deadline: gloo's own would close the connections on expiry
      std::unique_lock<std::mutex> lock(mu_);
      auto done = [this] { return state_ == State::Done; };
      if (timeout == kNoTimeout) {
        cv_.wait(lock, done);
      } else if (!cv_.wait_for(lock, timeout, done)) {
        TORCH_CHECK_WITH(DistBackendError, false, "all_reduce: wait(timeout=", timeout.count(),
                         " ms) expired before the pair exchange completed");
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
    return ok_;
  }
  void abort() override {
    recv_->abort();
    send_->abort();
  }
  std::vector<at::Tensor> result() override {
    return {user_};
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    c10::intrusive_ptr<c10::ivalue::Future> future;
    bool done = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!future_) future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
      future = future_;
      done = state_ == State::Done;
    }
    if (done) {
      settle(future);
    } else {
      drainInBackground();
    }
    return future;
  }

 private:
  enum class State : uint8_t { Idle, Running, Done };

  // On the one thread that claimed the work.
  void run() {
    bool ok = false;
    std::exception_ptr error;
    try {
      ok = recv_->wait(kNoTimeout);
      ok = send_->wait(kNoTimeout) && ok;
      if (ok) finish_();
    } catch (...) {
      error = std::current_exception();
    }
    c10::intrusive_ptr<c10::ivalue::Future> future;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ok_ = ok;
      error_ = error;
      state_ = State::Done;
      future = future_;
      cv_.notify_all();
    }
    if (future) settle(future);
  }
  void drainInBackground() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (state_ != State::Idle) return;
      state_ = State::Running;
    }
    Errands::instance().run("pair exchange drain",
                            [self = c10::intrusive_ptr<ExchangeWork>::reclaim_copy(this)] { self->run(); });
  }
  // Once Done (ok_ and error_ final); by run() or getFuture(), whichever sees
  // both the future and the end.
  void settle(const c10::intrusive_ptr<c10::ivalue::Future>& future) {
    std::call_once(settled_, [&] {
      if (error_) {
        future->setError(error_);
      } else if (!ok_) {
        future->setError(aborted());
      } else {
        future->markCompleted(c10::IValue(std::vector<at::Tensor>{user_}));
      }
    });
  }
  static std::exception_ptr aborted() {
    try {
      TORCH_CHECK_WITH(DistBackendError, false, "all_reduce: the pair exchange was aborted (the group failed)");
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }

  c10::intrusive_ptr<c10d::Work> recv_, send_;
  std::function<void()> finish_;
  at::Tensor user_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::Idle;
  bool ok_ = false;
  std::exception_ptr error_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::once_flag settled_;
};

constexpr int64_t kHeaderBytes = 2 * sizeof(uint64_t);  // rolling hash, data length

// out[i] = a[i] (combine) b[i] for n elements of T, as gloo's reductions compute
// it (gloo/math.h: std::max(a, b), std::min(a, b), a + b).
template <typename T>
void combineInto(T* out, const T* a, const T* b, int64_t n, PairExchange::Combine combine) {
  switch (combine) {
    case PairExchange::Combine::Max:
      for (int64_t i = 0; i < n; ++i) out[i] = std::max(a[i], b[i]);
      return;
    case PairExchange::Combine::Min:
      for (int64_t i = 0; i < n; ++i) out[i] = std::min(a[i], b[i]);
      return;
    case PairExchange::Combine::Sum:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;  // wraps as the inner backend's sum does
        for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(static_cast<U>(a[i]) + static_cast<U>(b[i]));
      } else {
        for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
      }
      return;
  }
}

// How many leading elements of n (of `size` bytes) gloo's ring reduces on rank
// 0 between two ranks, rank 0's own operand first; rank 1 reduces the rest,
// its own first (gloo/allreduce.cc: 2W = 4 segments of ceil(bytes / 4) bytes,
// rounded up to the element; rank 0 receives and reduces segments 0 and 1).
// Under MAX/MIN the first operand is the one kept when neither is greater (a
// NaN, 0 against -0): reducing in gloo's order gives gloo's result bit for bit.
int64_t reducedOnRankZero(int64_t n, int64_t size) {
  const int64_t segmentBytes = ((n * size + 3) / 4 + size - 1) / size * size;
  return std::min(n, 2 * segmentBytes / size);
}

// combineInto at `user`'s element type, over the data behind the headers of
// rank 0's and rank 1's messages, each element in gloo's operand order.
template <typename T>
void combineInGlooOrder(const at::Tensor& user, const uint8_t* zero, const uint8_t* one,
                        PairExchange::Combine combine) {
  const int64_t n = user.numel();
  const int64_t h = reducedOnRankZero(n, sizeof(T));
  T* out = user.data_ptr<T>();
  const T* a = reinterpret_cast<const T*>(zero);
  const T* b = reinterpret_cast<const T*>(one);
  combineInto(out, a, b, h, combine);
  combineInto(out + h, b + h, a + h, n - h, combine);
}

void combineData(const at::Tensor& user, int rank, const at::Tensor& mine, const at::Tensor& theirs,
                 PairExchange::Combine combine) {
  const uint8_t* zero = (rank == 0 ? mine : theirs).data_ptr<uint8_t>() + kHeaderBytes;
  const uint8_t* one = (rank == 0 ? theirs : mine).data_ptr<uint8_t>() + kHeaderBytes;
  PairExchange::reduceInGlooOrder(user, zero, one, combine);
}

}  // namespace

void PairExchange::reduceInGlooOrder(const at::Tensor& user, const uint8_t* rankZero, const uint8_t* rankOne,
                                     Combine combine) {
  switch (user.scalar_type()) {
    case at::kFloat:
      return combineInGlooOrder<float>(user, rankZero, rankOne, combine);
    case at::kDouble:
      return combineInGlooOrder<double>(user, rankZero, rankOne, combine);
    case at::kInt:
      return combineInGlooOrder<int32_t>(user, rankZero, rankOne, combine);
    default:
      return combineInGlooOrder<int64_t>(user, rankZero, rankOne, combine);
  }
}

PairExchange::Combine PairExchange::combineOf(const c10d::ReduceOp& op) {
  return op == c10d::ReduceOp::MAX ? Combine::Max : op == c10d::ReduceOp::MIN ? Combine::Min : Combine::Sum;
}

c10::intrusive_ptr<c10d::Work> PairExchange::issue(c10d::Backend& inner, at::Tensor user, Combine combine,
                                                   uint64_t rolling, Verdict verdict) {
  const int64_t nb = user.numel() * static_cast<int64_t>(user.element_size());
  const int rank = inner.getRank();
  const int peer = 1 - rank;
  at::Tensor mine = at::empty({kHeaderBytes + nb}, user.options().dtype(at::kByte));
  at::Tensor theirs = at::empty({kHeaderBytes + kMaxDataBytes}, mine.options());  // the longest (PairExchange.h)
  const uint64_t head[2] = {rolling, static_cast<uint64_t>(nb)};
  std::memcpy(mine.data_ptr<uint8_t>(), head, kHeaderBytes);
  std::memcpy(mine.data_ptr<uint8_t>() + kHeaderBytes, user.data_ptr(), nb);
  std::vector<at::Tensor> in{theirs}, out{mine};
  auto recv = inner.recv(in, peer, kTag);
  auto send = inner.send(out, peer, kTag);
  auto finish = [mine, theirs, user, rank, head, combine, verdict = std::move(verdict)] {
    uint64_t other[2] = {0, 0};
    std::memcpy(other, theirs.data_ptr<uint8_t>(), kHeaderBytes);
    const bool same = other[0] == head[0] && other[1] == head[1];
    if (same) combineData(user, rank, mine, theirs, combine);
    verdict(same);
  };
  return c10::make_intrusive<ExchangeWork>(std::move(recv), std::move(send), std::move(finish), user);
}

bool PairExchange::isExchange(const c10d::Work& work) {
  return dynamic_cast<const ExchangeWork*>(&work) != nullptr;
}

}  // namespace torch_ext
