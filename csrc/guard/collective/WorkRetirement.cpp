#include "guard/collective/WorkRetirement.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace torch_ext {

WorkRetirement& WorkRetirement::instance() {
  // Leaked: what is kept at exit must never be released by static destruction,
  // which runs after the interpreter is gone.
  static auto* r = new WorkRetirement();
  return *r;
}

void WorkRetirement::retire(c10::intrusive_ptr<c10::intrusive_ptr_target> ref) {
  if (!ref || ref.use_count() == 1) return;  // ours was the last: freed here, on this thread
  std::lock_guard<std::mutex> lock(mu_);
  refs_.push_back(std::move(ref));
  kept_.store(refs_.size(), std::memory_order_relaxed);
}

void WorkRetirement::keep(c10::intrusive_ptr<c10::intrusive_ptr_target> ref) {
  if (!ref) return;
  std::lock_guard<std::mutex> lock(mu_);
  refs_.push_back(std::move(ref));
  kept_.store(refs_.size(), std::memory_order_relaxed);
}

void WorkRetirement::sweepSlow() {
  // Freeing a Work can make its future's reference ours alone (a Work holds
  // its future), so scan again while a scan freed something: otherwise the
  // futures, and the tensors they hold, would wait for the count to double.
  for (int pass = 0; pass < 4; ++pass) {
    std::vector<c10::intrusive_ptr<c10::intrusive_ptr_target>> last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      scans_.fetch_add(1, std::memory_order_relaxed);
      auto keep = refs_.begin();
      for (auto it = refs_.begin(); it != refs_.end(); ++it) {
        if (it->use_count() == 1) {
          last.push_back(std::move(*it));
        } else {
          if (keep != it) *keep = std::move(*it);
          ++keep;
        }
      }
      refs_.erase(keep, refs_.end());
      kept_.store(refs_.size(), std::memory_order_relaxed);
      // At least kMinKept, so that a few works held elsewhere do not make
      // every issue scan; otherwise twice what is left (amortised O(1)).
      sweepAbove_.store(std::max<size_t>(2 * refs_.size(), kMinKept), std::memory_order_relaxed);
    }
    if (last.empty()) return;
    last.clear();  // freed here, outside the lock, on the issuing thread
  }
}

void WorkRetirement::sweepOldest() {
  // Freeing a Work can leave its future ours alone, next in line: a few passes.
  for (int pass = 0; pass < 4; ++pass) {
    std::vector<c10::intrusive_ptr<c10::intrusive_ptr_target>> last;
    {
      std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
      if (!lock.owns_lock()) return;  // another issuing thread is sweeping
      while (!refs_.empty() && refs_.front().use_count() == 1) {
        last.push_back(std::move(refs_.front()));
        refs_.pop_front();
      }
      kept_.store(refs_.size(), std::memory_order_relaxed);
    }
    if (last.empty()) return;
    last.clear();  // freed here, outside the lock, on the issuing thread
  }
}

}  // namespace torch_ext
