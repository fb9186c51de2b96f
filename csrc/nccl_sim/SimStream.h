#pragma once

// SimStream: the "NCCL stream" of one nccl_sim communicator, on the CPU.
//
// A CUDA stream runs what was enqueued on it in order, on the device, while the
// host goes on issuing. This is the same on a thread: collectives are queued
// (the host returns at once), the stream's thread runs them one after the other
// on the transport (a private gloo group, so real data moves between real
// processes), and an operation is done only when its exchange is. What the host
// can observe follows NCCL (../shared/DESIGN.md section 6):
//  - issuing never waits for peers; it blocks only when the queue is full, as a
//    CUDA launch does when the device's launch queue is (no timeout);
//  - synchronize() blocks until everything issued so far has run, with no
//    timeout of its own, like torch.cuda.synchronize();
//  - an operation whose peer never comes runs forever; only abort() releases
//    it, failing it and everything queued behind it;
//  - after one operation failed the communicator is in error: everything after
//    it fails too (NCCL's asynchronous error state), until it is aborted.
// The test switches (TORCH_EXT_NCCL_SIM_STALL/FAIL/SLOW) act here, by position
// on the stream. The stream is Python-free: the transport is a c10d::Backend.

#include "nccl_sim/CountAgreement.h"
#include "nccl_sim/NcclSimSettings.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace torch_ext::nccl_sim {

enum class OpState : uint8_t { Queued, Done, Failed };

// One operation on the stream (a collective, a p2p op, or a coalesced block).
struct StreamOp {
  std::string name;    // "all_reduce", for messages
  uint64_t index = 0;  // position on the stream (1, 2, ...), set by enqueue()
  // Issues the operation on the transport and returns the works to wait for.
  // Called on the stream's thread, in stream order.
  std::vector<std::function<std::vector<c10::intrusive_ptr<c10d::Work>>()>> launches;
  // Run after the works completed (e.g. the division of ReduceOp.AVG).
  std::vector<std::function<void()>> finishes;
  std::vector<at::Tensor> outputs;
  // What the exchange expects of the peers, agreed before it on `transport`
  // (CountAgreement), which the launches carry too.
  Agreement agreement;
  c10::intrusive_ptr<c10d::Backend> transport;
  // Why the stream hangs at this operation (the ranks' counts did not fit);
  // said when abort() fails it. Written under the stream's mutex.
  std::string hangNote;
  c10::intrusive_ptr<c10::ivalue::Future> future;  // completed with `outputs` once done
  std::atomic<OpState> state{OpState::Queued};
  std::atomic<bool> started{false};  // the stream began its exchange (not stalled ahead of it)
  std::string error;                 // written before state turns Failed
  int64_t durationNs = 0;            // stream time of the exchange (start to end on the stream)
};

class SimStream : public std::enable_shared_from_this<SimStream> {
 public:
  // `label` names the communicator in messages; `faultsApply`: the switches
  // apply to this stream (this rank, the default group).
  static std::shared_ptr<SimStream> start(std::string label, int rank, int size, bool faultsApply,
                                          NcclSimSettings settings);

  // Queues `op` (blocks while the queue is full). Throws c10::DistBackendError
  // once the communicator was aborted.
  void enqueue(const std::shared_ptr<StreamOp>& op);
  // Blocks until every operation issued so far has run. Throws
  // c10::DistBackendError when the communicator was aborted or is in error
  // (an operation failed: on a GPU its output would be garbage).
  void synchronize();
  // ncclCommAbort: fails the running and queued operations, releases a stuck
  // stream and every host blocked on it. Idempotent.
  void abort(const std::string& why);
  // Blocks until `op` has run (true) or failed / the communicator was aborted
  // (false), with no timeout, for TORCH_EXT_NCCL_SIM_WAIT=data.
  bool waitFor(const StreamOp& op);
  bool waitsForData() const {
    return settings_.waitForData;
  }
  // Waits up to `bound` for the stream to run what was issued; false if it did
  // not (a stuck or aborted stream).
  bool drain(std::chrono::milliseconds bound);
  // The communicator goes away: the thread ends once the queue is empty (or at
  // once if the stream is stalled by the switch).
  void stop();

  bool aborted() const;
  // Operations issued and not yet run.
  size_t pending() const;
  // The error state: empty while healthy.
  std::string error() const;
  const std::string& label() const {
    return label_;
  }

 private:
  SimStream(std::string label, int rank, int size, bool faultsApply, NcclSimSettings settings);
  void run();
  void execute(StreamOp& op);
  // The agreement ahead of `op`'s exchange: true when the ranks fit; false when
  // aborted meanwhile, or after hanging (as NCCL) until abort() or stop().
  bool agree(StreamOp& op, std::string* error);
  // The stream stops at `op`, which never completes, until abort() or stop().
  void hang();
  // Waits (abortably) for one transport work; false if aborted meanwhile.
  bool await(const c10::intrusive_ptr<c10d::Work>& work, std::string* error);
  // Completes `op` once: Done, or Failed with `error`.
  void settle(StreamOp& op, bool ok, const std::string& error);
  bool appliesAt(const NcclSimSettings::Fault& f, uint64_t index) const;
  std::string abortedText() const;  // mu_ held

  const std::string label_;
  const int rank_;
  const int size_;
  const bool faultsApply_;
  const NcclSimSettings settings_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<StreamOp>> queue_;  // front: running or next
  uint64_t issued_ = 0;
  uint64_t finished_ = 0;
  bool aborted_ = false;
  bool stopping_ = false;
  std::string abortReason_;
  std::string error_;                       // first failure: the communicator's error state
  c10::intrusive_ptr<c10d::Work> current_;  // the transport work being waited on (abortable)
};

}  // namespace torch_ext::nccl_sim
