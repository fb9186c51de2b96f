#pragma once

// DeferredReceives: strict receives posted before their sends. A receive
// posted before its send is legal (every rank's irecv, then its isend), so a
// strict receive whose sender has not published its print yet is not held at
// issue: it returns at once with a work that stands for it, and a short-lived
// poster (an errand) posts it once the print is there and pairs. Receives are
// posted in the order they were issued; a difference fails the group, which
// every waiting receive then raises.

#include "guard/collective/Fingerprint.h"
#include "guard/collective/GroupState.h"

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace torch_ext {

class DeferredReceiveWork;

class DeferredReceives : public std::enable_shared_from_this<DeferredReceives> {
 public:
  using Post = std::function<c10::intrusive_ptr<c10d::Work>()>;

  // Some receive is waiting: a later one waits behind it (issue order).
  bool waiting() const;
  // Queues receive `fp` (the `ordinal`-th of its pair, issued at `where`);
  // `post` posts the inner receive once its sender's print pairs. Returns the
  // work that stands for it.
  c10::intrusive_ptr<c10d::Work> defer(const std::shared_ptr<GroupState>& state, const Fingerprint& fp,
                                       uint64_t ordinal, std::string where, Post post);

 private:
  struct Entry {
    std::string key;
    Fingerprint fp;
    uint64_t ordinal = 0;
    int src = -1;
    std::string where;
    Post post;
    c10::intrusive_ptr<DeferredReceiveWork> work;
  };
  // The poster: drains the queue and ends.
  void postAll(const std::shared_ptr<GroupState>& state);
  void cancelAll();

  mutable std::mutex mu_;
  std::deque<Entry> queue_;
  bool posting_ = false;  // a poster is running
};

}  // namespace torch_ext
