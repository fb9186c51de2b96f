#pragma once

// The C++ tests' shared kit: in-memory stores (store_testing.h), works and a
// helper backend through which several ranks in one process meet, so that a
// test drives a whole group (checks, the verifier) without processes.

#include "store_testing.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace torch_ext::testkit {

// A work whose future the rendezvous completes.
class FutureWork : public c10d::Work {
 public:
  explicit FutureWork(c10d::OpType type)
      : c10d::Work(-1, type),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}
  bool isCompleted() override {
    return future_->completed();
  }
  bool wait(std::chrono::milliseconds) override {
    future_->wait();
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The helper group's transport: the k-th call of every rank meets the k-th
// call of the others (as collectives do). Each call registers its input and a
// work; the last rank to arrive computes every rank's output and completes
// every work.
class Rendezvous {
 public:
  enum class Kind { SumInt64, MaxInt64, Gather };
  struct Call {
    std::string what;  // "allreduce SUM x1", "allreduce MAX x2", "allgather x2"
  };

  explicit Rendezvous(int size) : size_(size) {}

  c10::intrusive_ptr<c10d::Work> join(int rank, Kind kind, at::Tensor in, at::Tensor out, c10d::OpType type) {
    auto work = c10::make_intrusive<FutureWork>(type);
    std::vector<Slot> ready;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const uint64_t k = next_[rank]++;
      Round& round = rounds_[k];
      round.slots.push_back(Slot{rank, kind, in, out, work});
      calls_[rank].push_back(describe(kind, in));
      if (static_cast<int>(round.slots.size()) < size_) return work;
      ready = std::move(round.slots);
      rounds_.erase(k);
    }
    finish(ready);
    return work;
  }

  // Errors every work still waiting for its peers (the test's time bound).
  void abort(const std::string& why) {
    std::map<uint64_t, Round> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending.swap(rounds_);
    }
    for (auto& [k, round] : pending) {
      for (auto& s : round.slots) {
        s.work->future_->setError(std::make_exception_ptr(std::runtime_error(why)));
      }
    }
  }

  std::vector<std::string> calls(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[rank];
  }

 private:
  struct Slot {
    int rank;
    Kind kind;
    at::Tensor in, out;
    c10::intrusive_ptr<FutureWork> work;
  };
  struct Round {
    std::vector<Slot> slots;
  };

  static std::string describe(Kind kind, const at::Tensor& in) {
    const std::string n = " x" + std::to_string(in.numel());
    switch (kind) {
      case Kind::SumInt64:
        return "allreduce SUM" + n;
      case Kind::MaxInt64:
        return "allreduce MAX" + n;
      case Kind::Gather:
        return "allgather" + n;
    }
    return "?";
  }

  void finish(std::vector<Slot>& slots) {
    std::sort(slots.begin(), slots.end(), [](const Slot& a, const Slot& b) { return a.rank < b.rank; });
    const Kind kind = slots[0].kind;
    const int64_t n = slots[0].in.numel();
    std::string error;
    for (const auto& s : slots) {
      if (s.kind != kind || s.in.numel() != n || s.in.scalar_type() != at::kLong) {
        error = "helper ops do not match across ranks";
      }
    }
    if (error.empty()) {
      if (kind == Kind::Gather) {
        for (auto& s : slots) {
          int64_t* o = s.out.data_ptr<int64_t>();
          for (size_t r = 0; r < slots.size(); ++r) {
            std::copy_n(slots[r].in.data_ptr<int64_t>(), n, o + r * n);
          }
        }
      } else {
        std::vector<uint64_t> acc(n);
        for (int64_t i = 0; i < n; ++i) {
          // SUM wraps (mod 2^64) as the check expects; MAX is signed.
          uint64_t sum = 0;
          int64_t max = INT64_MIN;
          for (const auto& s : slots) {
            const int64_t v = s.in.data_ptr<int64_t>()[i];
            sum += static_cast<uint64_t>(v);
            max = std::max(max, v);
          }
          acc[i] = kind == Kind::SumInt64 ? sum : static_cast<uint64_t>(max);
        }
        for (auto& s : slots) {
          for (int64_t i = 0; i < n; ++i) s.in.data_ptr<int64_t>()[i] = static_cast<int64_t>(acc[i]);
        }
      }
    }
    for (auto& s : slots) {
      if (!error.empty()) {
        s.work->future_->setError(std::make_exception_ptr(std::runtime_error(error)));
      } else {
        s.work->future_->markCompleted(c10::IValue(std::vector<at::Tensor>{s.kind == Kind::Gather ? s.out : s.in}));
      }
    }
  }

  const int size_;
  std::mutex mu_;
  std::map<int, uint64_t> next_;
  std::map<uint64_t, Round> rounds_;
  std::map<int, std::vector<std::string>> calls_;
};

// One rank's helper backend.
class MemHelper : public c10d::Backend {
 public:
  MemHelper(int rank, int size, std::shared_ptr<Rendezvous> rv) : c10d::Backend(rank, size), rv_(std::move(rv)) {}
  const std::string getBackendName() const override {
    return "mem";
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& ts, const c10d::AllreduceOptions& opts) override {
    TORCH_CHECK(ts.size() == 1, "one tensor");
    Rendezvous::Kind kind;
    if (opts.reduceOp == c10d::ReduceOp::SUM) {
      kind = Rendezvous::Kind::SumInt64;
    } else if (opts.reduceOp == c10d::ReduceOp::MAX) {
      kind = Rendezvous::Kind::MaxInt64;
    } else {
      TORCH_CHECK(false, "the test helper runs SUM and MAX only");
    }
    return rv_->join(getRank(), kind, ts[0], ts[0], c10d::OpType::ALLREDUCE);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions&) override {
    TORCH_CHECK(out.numel() == in.numel() * getSize(), "output must hold every rank's input");
    return rv_->join(getRank(), Rendezvous::Kind::Gather, in, out, c10d::OpType::_ALLGATHER_BASE);
  }

 private:
  std::shared_ptr<Rendezvous> rv_;
};

}  // namespace torch_ext::testkit
