#pragma once

// WorkRetirement: where a guarded op's inner Work and future go when the
// GuardWork handed to torch is dropped, so that they are freed on a thread that
// issues collectives (a Python thread) and never on the inner backend's worker.
//
// Why: gloo's worker thread keeps its reference to a Work until just after
// completing it. When the user's thread has already dropped its own, the worker
// frees the Work, and with it the user's tensors; a tensor whose Python object
// outlived its Python references then needs the GIL to let it go. If that
// happens while the interpreter is finalizing, the worker is made to exit
// inside a noexcept destructor, and the process aborts ("terminate called
// without an active exception") after the script ended normally. Keeping a
// reference here until ours is the last one moves every such free onto the
// next issuing thread (sweep), and the references still here at exit are never
// released (the container is leaked on purpose), so no free runs after it.
//
// Cost: nothing is kept when the worker has let go already; otherwise a Work
// stays until the next collective is issued, whose sweep frees the oldest kept
// ones that only this still holds (the worker lets go of its works in the order
// it completes them) and stops at the first still held elsewhere: the user's
// tensors are freed a collective later than under the inner backend alone, not
// a batch of collectives later (before, an FSDP2 job at world 2 under
// check="off" kept up to 14 such works, with their tensors). A full scan runs only once
// the count has doubled since the last one: works that stay held elsewhere for
// a while (NCCL and send/recv works wait in the ledger for the watchdog's next
// poll, thousands per tick at NCCL's rate) cost amortised O(1) per collective.

#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <cstddef>
#include <deque>
#include <mutex>

namespace torch_ext {

class WorkRetirement {
 public:
  static WorkRetirement& instance();

  // Drops `ref` now if nobody else holds it, else keeps it until sweep()
  // finds ours to be the last reference.
  void retire(c10::intrusive_ptr<c10::intrusive_ptr_target> ref);
  // Keeps `ref` until a sweep, even if it is the last reference: for a
  // reference dropped on a thread that must not run its destructor (a check
  // mode's helper backend, let go on one of that backend's own worker threads,
  // whose destructor would join the thread it runs on).
  void keep(c10::intrusive_ptr<c10::intrusive_ptr_target> ref);

  // Frees, oldest first, what only this holds any more; everything of the kind
  // once the count has doubled. One relaxed load when nothing is kept.
  void sweep() {
    const size_t kept = kept_.load(std::memory_order_relaxed);
    if (kept == 0) return;
    if (kept > sweepAbove_.load(std::memory_order_relaxed)) {
      sweepSlow();
    } else {
      sweepOldest();
    }
  }
  // Frees what only this holds any more, whatever the count (shutdown).
  void sweepAll() {
    sweepSlow();
  }

  size_t kept() const {
    return kept_.load(std::memory_order_relaxed);
  }
  // Scans so far (tests: sweep() must stay amortised O(1)).
  size_t scans() const {
    return scans_.load(std::memory_order_relaxed);
  }

 private:
  void sweepSlow();
  void sweepOldest();

  static constexpr size_t kMinKept = 16;
  std::mutex mu_;
  std::deque<c10::intrusive_ptr<c10::intrusive_ptr_target>> refs_;  // oldest first
  std::atomic<size_t> kept_{0};
  // sweep() scans when more than this is kept: twice what the last scan left.
  std::atomic<size_t> sweepAbove_{kMinKept};
  std::atomic<size_t> scans_{0};
};

}  // namespace torch_ext
