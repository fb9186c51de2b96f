#pragma once

// Ledger: a fixed-size ring of the most recent operations of one process group
// (a flight recorder), plus the counters the cross-rank checks need.
//
// Collectives get a group-wide sequence number (1, 2, ...) and advance a rolling
// hash over their fingerprints: two ranks that issued the same collectives up to
// seq s have equal rolling hashes at s, so comparing one 64-bit number compares
// their whole history. Point-to-point ops do not take part in the rolling hash
// (a send and its receive look different by nature); they get a per-(peer, tag)
// ordinal instead, so the k-th send from A to B can be paired with the k-th
// receive on B from A.
//
// Writers are the threads issuing collectives and the inner backend's completion
// callbacks; readers are the watchdog and Python (torch_ext.ledger()). One mutex
// guards the ring: every critical section is a few stores, and the watchdog takes
// it a few times per tick.

#include "guard/collective/Fingerprint.h"
#include "guard/collective/WaitWindows.h"
#include "guard/report/StatusRecord.h"  // SeqProgress

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <cstdint>
#include <ATen/core/ivalue.h>

#include <map>
#include <unordered_map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch_ext {

struct Entry {
  uint64_t id = 0;          // record id in this ledger (1, 2, ...), collectives and p2p alike
  uint64_t seq = 0;         // collective sequence number (0 for p2p)
  uint64_t p2pOrdinal = 0;  // k for the k-th p2p op with this (peer, tag, direction); 0 for collectives
  Fingerprint fp;
  uint64_t rolling = 0;  // rolling hash after this collective
  uint32_t callSite = 0;
  uint32_t label = 0;   // LabelTable id active on the issuing thread (0: none)
  int64_t startNs = 0;  // wall clock (for dumps)
  int64_t endNs = 0;
  int64_t startSteadyNs = 0;  // monotonic (for deadlines)
  EntryState state = EntryState::Scheduled;
  std::string error;
};

// What the watchdog needs each tick, copied under one lock.
struct Progress : SeqProgress {
  int64_t lastCompletedNs = 0;  // wall clock of the last completion of any op
  uint64_t lastId = 0;
  // Oldest pending operation (collective or p2p), if any.
  bool hasPending = false;
  Entry oldestPending;
};

class Ledger {
 public:
  // Works pollLater() holds before it polls on the caller's thread too.
  static constexpr size_t kMaxPolled = 4096;
  static constexpr size_t kMaxPolledFailures = 16;
  static constexpr size_t kMaxEvicted = 4096;

  explicit Ledger(size_t capacity);

  size_t capacity() const {
    return ring_.size();
  }

  // Appends an operation in state Scheduled and returns its record id. Fills
  // `*seq` with the collective seq (0 for p2p) and `*ordinal` with the p2p
  // ordinal (0 for collectives). `label`: the LabelTable id active on the
  // issuing thread (0: none).
  uint64_t record(Fingerprint&& fp, uint32_t callSite, uint64_t* seq, uint64_t* ordinal = nullptr,
                  uint64_t* rolling = nullptr, uint32_t label = 0);
  // Marks a record finished (the ring entry too, unless overwritten) and hands
  // back the future registered with track(), which the caller must complete.
  // Only the first completion of a record gets the future. `timed`: now is
  // when it completed (not when a poll noticed it), so its wait counts in
  // waitWindows(). `streamNs` (>= 0): how long the operation took on its
  // stream (Work::getDuration: NCCL's CUDA events, nccl_sim's stream), which
  // counts instead for a completion noticed by a poll.
  c10::intrusive_ptr<c10::ivalue::Future> complete(uint64_t id, bool ok, const std::string& error = std::string(),
                                                   bool timed = true, int64_t streamNs = -1);
  // The future a GuardWork hands out for record `id`, handed back by complete()
  // or failPending(). Returns false, keeping nothing, when the record has
  // finished already (the caller completes the future itself).
  bool track(uint64_t id, c10::intrusive_ptr<c10::ivalue::Future> future);
  // Keeps `work` to be polled with isCompleted() by the watchdog (for works that
  // offer no completion callback, e.g. CUDA work or gloo's send/recv).
  // `reportFailure`: a failure found by polling is kept for takePolledFailures()
  // (stream-ordered works: nobody waits on the host to see it). At most
  // kMaxPolled works are held: beyond that, finished ones are dropped at once.
  void pollLater(uint64_t id, c10::intrusive_ptr<c10d::Work> work, bool reportFailure = false);
  // Drops the reference pollLater() kept for record `id` (its waiter saw it
  // complete): the work and its tensors need not wait for the next poll.
  void forgetPolled(uint64_t id);
  // Polls the works registered with pollLater(); completes the finished ones.
  void pollCompletions();
  // Whether the stream has begun record `id`'s operation: known for a pending
  // work of a stream backend that says (StreamStartAware), else nullopt.
  std::optional<bool> streamStarted(uint64_t id) const;
  // A host thread blocks in the wait of record `id` (WaitScope) until it
  // completes: what makes a wait-for cycle a certain deadlock (WaitGraph).
  // The last thread to enter is remembered; one that leaves while another
  // entered since clears nothing, so blockedIn() may miss a blocked thread
  // (a cycle then stays unconfirmed) but never names a wait nobody is in.
  void enterWait(uint64_t id) {
    blockedIn_.store(id, std::memory_order_release);
  }
  // `raised`: the wait ended in an error (a verdict, abort_after, a peer gone).
  void leaveWait(uint64_t id, bool raised) {
    if (raised) raisedInWait_.store(id, std::memory_order_release);
    blockedIn_.compare_exchange_strong(id, 0, std::memory_order_acq_rel);
  }
  // The record a host thread blocks in now (0: none known).
  uint64_t blockedIn() const {
    return blockedIn_.load(std::memory_order_acquire);
  }
  // The last record whose blocking wait ended in an error: where a thread
  // stood blocked when the group failed, for the dumps written after (0: none).
  uint64_t raisedInWait() const {
    return raisedInWait_.load(std::memory_order_acquire);
  }
  // Failures of reportFailure works found by polling since the last call (the
  // first few), as (record id, error).
  std::vector<std::pair<uint64_t, std::string>> takePolledFailures();
  // On group failure: every pending record fails; returns their futures (to be
  // errored) and polled works (to be aborted).
  void failPending(const std::string& error, std::vector<c10::intrusive_ptr<c10::ivalue::Future>>* futures,
                   std::vector<c10::intrusive_ptr<c10d::Work>>* works);

  Progress progress();
  // Whether completions are timed into waitWindows() (on by default). Set
  // before the first operation.
  void setTimeWaits(bool on) {
    timeWaits_ = on;
  }
  // The closed wait windows of this rank (WaitWindows), `perLevel` per level:
  // the status record's few by default; dumps take WaitWindows::kHistory.
  std::vector<WaitWindow> waitWindows(size_t perLevel = WaitWindows::kKept) const;
  // Record `id`, if the ring still holds it (or kept it as the oldest pending).
  std::optional<Entry> byId(uint64_t id) const;
  // The record of collective `seq`, if the ring still holds it.
  std::optional<Entry> bySeq(uint64_t seq) const;
  // Rolling hash after collective `seq`, if the ring still holds it.
  std::optional<uint64_t> rollingAt(uint64_t seq) const;
  // The most recent `maxEntries` records, oldest first.
  std::vector<Entry> entries(size_t maxEntries) const;
  // Records with id > afterId (at most maxEntries, newest kept), oldest first;
  // preceded by the oldest pending record when the ring overwrote it.
  std::vector<Entry> entriesAfter(uint64_t afterId, size_t maxEntries) const;

 private:
  Entry* slot(uint64_t id);  // nullptr if overwritten; mu_ held
  // For a record about to be overwritten: false (and it is marked finished)
  // when its polled work has completed meanwhile. mu_ held.
  bool stillPending(Entry& e, int64_t now);

  mutable std::mutex mu_;
  std::atomic<uint64_t> blockedIn_{0};
  std::atomic<uint64_t> raisedInWait_{0};
  std::vector<Entry> ring_;
  std::vector<std::pair<uint64_t, uint64_t>> rollingRing_;  // (seq, rolling)
  uint64_t nextId_ = 1;
  uint64_t seq_ = 0;
  uint64_t rolling_ = 0;
  uint64_t lastCompletedSeq_ = 0;
  int64_t lastCompletedNs_ = 0;
  uint64_t minPendingId_ = 1;  // no record below this id is pending
  // (peer, tag, direction) -> ops issued so far; direction 0 send, 1 recv.
  std::map<std::tuple<int32_t, int32_t, int>, uint64_t> p2pCounts_;
  struct Polled {
    uint64_t id;
    c10::intrusive_ptr<c10d::Work> work;
    bool reportFailure;
  };
  std::vector<Polled> polled_;
  std::vector<std::pair<uint64_t, std::string>> polledFailures_;
  // Records the ring overwrote while they were still pending, by id: a host
  // that runs thousands of operations ahead of its stream (NCCL) must still
  // be able to say which one the stream is stuck in. At most kMaxEvicted
  // (the oldest are kept); each leaves when it completes.
  std::map<uint64_t, Entry> evicted_;
  std::unordered_map<uint64_t, c10::intrusive_ptr<c10::ivalue::Future>> futures_;
  WaitWindows waits_;
  bool timeWaits_ = true;
  // Stream-timed operations run one after another on their stream: each is
  // placed on the host clock ending at its poll, or right after the previous
  // one when several are noticed by one poll.
  int64_t streamCursorNs_ = 0;
};

}  // namespace torch_ext
