#pragma once

// P2PPairing: send/recv under check="verify" (the default). A result that
// does not pair with what its sender sent never reaches the program.
//
// A send is followed, on the helper group, by its pairing words: the dtype,
// element count and tag its receiver must have posted (Fingerprint::
// p2pPairHash), to the same peer with the same tag. A receive posts the
// matching receive of words at issue, and its work (PairedReceiveWork) hands
// the result out only once the words have come and pair: a receive of 6
// floats that got a message of 4 (gloo accepts a shorter message) raises
// CollectiveMismatchError naming both sides instead of returning
// [x, x, x, x, 0, 0], and the sender fails with the published verdict.
//
// Order: gloo pairs a peer's messages of one tag in the order they were
// posted, on the helper group as on the data group, so the k-th words from a
// peer with a tag go with the k-th message from it with that tag. No wait is
// added between ranks: a sender posts its words without waiting (receives
// posted before their sends, batch_isend_irecv and rings stay legal), and a
// receiver waits for them only once its data has come, which its sender
// posted just before the words. Not paired (checked as before, by the
// watchdog's comparison): receives from any source (the source is known only
// at completion), a receive's getFuture(), operations in a native coalescing
// block, and stream-ordered inner backends (NCCL, nccl_sim).

#include "guard/collective/Fingerprint.h"
#include "guard/collective/GroupState.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>

namespace torch_ext {

class P2PPairing {
 public:
  // `state`: the group, which owns its mode and so this (held weakly).
  P2PPairing(std::weak_ptr<GroupState> state, c10::intrusive_ptr<c10d::Backend> helper);
  // What it still holds of its helper goes to a later sweep: this may be
  // destroyed with its group on a worker thread of that helper
  // (WorkRetirement::keep).
  ~P2PPairing();
  // The group was shut down cleanly: lets go of the helper and its sends now.
  void release();

  // After the data of send `fp` (from `callSite`) was posted: posts its words.
  void sent(const Fingerprint& fp, uint32_t callSite);
  // After the data of receive `fp` was posted as `data`: posts the receive of
  // its words and returns the work that releases the result once they pair.
  c10::intrusive_ptr<c10d::Work> received(c10::intrusive_ptr<c10d::Work> data, const Fingerprint& fp, uint64_t ordinal,
                                          uint32_t callSite);

  // How long a receive whose data came waits for its sender's words before
  // it fails, naming the likely cause (that rank does not pair: another
  // check mode, or another torch_ext).
  static constexpr std::chrono::milliseconds kWordsWithin{30'000};

 private:
  std::weak_ptr<GroupState> state_;
  c10::intrusive_ptr<c10d::Backend> helper_;
  // Sends of words kept while the transport may still read their tensors:
  // the last kInFlight; an older one is waited for before it is dropped.
  static constexpr size_t kInFlight = 1024;
  std::mutex mu_;
  std::deque<c10::intrusive_ptr<c10d::Work>> sending_;
};

}  // namespace torch_ext
