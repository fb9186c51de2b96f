#pragma once

// StreamGate: one group's gate for check="verify" on a stream backend (NCCL;
// nccl_sim on CPU). On such a backend wait() does not block the host: it
// orders the caller's stream after the collective. The gate adds, on that
// stream, a wait for the verifier's verdict on the collective, so the work the
// program enqueues next (the kernels that read the result, and .item() or
// .cpu(), which synchronise with the stream) runs only once every rank is
// known to have issued the same collectives. The host is not blocked.
//
//  - release(seq): the verifier verified everything up to #seq.
//  - poison(firstBad): #firstBad and later will never be verified (a
//    difference, or the group failed). Held streams pass, and the results
//    they hold from #firstBad on are overwritten first (GateWord.h's fill),
//    so no kernel reads a mismatched result; the group's error is raised by
//    the next guard call on the host. Called after the report is written and
//    before the inner backend is aborted (GuardBackend's abort hook).
//
// A CUDA result is held on the device (CudaGate: a kernel waits on the word
// in pinned memory). A CPU result (nccl_sim, where the host is the compute
// stream) is remembered until its verdict, and filled on poison by the thread
// that poisons: the same word, rule and fill, so CI runs the gate's logic.
// A result whose verdict is in already when it is held costs nothing.

#include "guard/device/GateWord.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torch_ext::device {

class StreamGate : public std::enable_shared_from_this<StreamGate> {
 public:
  // `cuda`: CUDA results are held too (stream_gate=on); otherwise only CPU
  // ones, and a CUDA hold does nothing.
  explicit StreamGate(bool cuda = true) : cuda_(cuda) {}
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  ~StreamGate();

  // Holds collective #seq's `outputs` (tensors of one device) on that
  // device's current stream until its verdict. Returns whether anything was
  // held (false: the verdict was in, the outputs are on no device the gate
  // knows, or CUDA's gate is unavailable, which is logged once). `landed`
  // (CPU outputs only) completes once the collective wrote them: a poison
  // fill waits for it, as the kernel comes after the collective on its
  // stream; null when they are written already.
  bool hold(uint64_t seq, const std::vector<at::Tensor>& outputs, c10::intrusive_ptr<c10::ivalue::Future> landed = {});
  void release(uint64_t verifiedSeq);
  void poison(uint64_t firstBad);
  // CPU holds: waits until the word is poisoned and every poisoned result
  // filled (the host's sync point, after a failure: on CUDA the stream
  // orders this). Returns false if `timeout` passed first.
  bool awaitHostPoison(std::chrono::milliseconds timeout);
  uint64_t word() const {
    return current().load(std::memory_order_acquire);
  }

  struct Stats {
    uint64_t deviceHolds = 0;  // kernels launched for this group
    uint64_t hostHolds = 0;    // CPU results remembered
    uint64_t passed = 0;       // holds that found their verdict in already
    uint64_t poisoned = 0;     // results filled
  };
  Stats stats() const;

 private:
  struct HostHold {
    uint64_t seq;
    std::vector<at::Tensor> outputs;
    c10::intrusive_ptr<c10::ivalue::Future> landed;
  };
  std::atomic<uint64_t>& current() const {
    return *word_.load(std::memory_order_acquire);
  }
  void publish(uint64_t value);
  bool holdCuda(uint64_t seq, const std::vector<at::Tensor>& outputs);
  // Under mu_: drops the host holds the word lets pass and fills the
  // poisoned ones; returns those whose collective has not written them yet.
  std::vector<HostHold> settleHost();
  // Outside mu_: fills each after its collective's write.
  void fillAfter(std::vector<HostHold> late);

  const bool cuda_;
  mutable std::atomic<uint64_t> heapWord_{0};
  // The word: heapWord_ until a CUDA stream is first held, then one in pinned memory.
  std::atomic<std::atomic<uint64_t>*> word_{&heapWord_};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<HostHold> host_;
  int fillsPending_ = 0;  // poison fills waiting for their collective's write (mu_)
  std::atomic<uint64_t> deviceHolds_{0}, hostHolds_{0}, passed_{0}, poisoned_{0};
};

// Overwrites `t`'s elements with their poison pattern (CPU tensors; a dense
// tensor's bytes, whatever its strides). Returns false for a tensor it cannot
// fill (not dense).
bool fillPoison(const at::Tensor& t);

}  // namespace torch_ext::device
