#pragma once

// GroupState: everything the guard knows about one process group, shared by the
// backend (issuing side), its works (completion side) and the watchdog (checking
// side). Held by shared_ptr so the watchdog can keep working on a group while
// the backend is being destroyed.

#include "guard/Config.h"
#include "guard/Errors.h"
#include "guard/collective/IncidentSink.h"
#include "guard/collective/Ledger.h"
#include "guard/collective/Mode.h"
#include "guard/device/StreamGate.h"
#include "guard/store/StoreChannel.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace torch_ext {

struct GroupIdentity {
  std::string name;  // torch's group name ("0" for the default group)
  int rank = 0;      // this process's rank in the group
  int size = 1;
  std::vector<int64_t> globalRanks;  // group rank -> global rank; empty means identity
  int64_t globalRank(int groupRank) const {
    if (groupRank < 0 || static_cast<size_t>(groupRank) >= globalRanks.size()) return groupRank;
    return globalRanks[groupRank];
  }
};

struct Failure {
  GuardErrorKind kind;
  std::string report;
  // The report's facts (a Verdict whose text is `report`): what Python's
  // GuardError.report reads (factsOf), never parsed back from the text.
  std::shared_ptr<const Verdict> facts;
};

class GroupState {
 public:
  GroupState(GroupIdentity id, Config cfg, std::shared_ptr<GroupStore> store, std::chrono::milliseconds timeout);

  const GroupIdentity& id() const {
    return id_;
  }
  const Config& config() const {
    return cfg_;
  }
  // The group's check mode (Mode.h): what it checks, holds and drains. Until
  // one is set (modes/Modes.h, installMode), a mode that checks nothing.
  Mode& mode() const {
    return *mode_;
  }
  const std::shared_ptr<Mode>& modePtr() const {
    return mode_;
  }
  // Set once, before the first collective.
  void setMode(std::shared_ptr<Mode> mode) {
    mode_ = std::move(mode);
    gate_ = mode_->gate();
  }
  // What holds results until every rank is known to have issued the same
  // (the mode's gate; null: results are released when they complete).
  ReleaseGate* gate() const {
    return gate_;
  }
  // Seconds between two store exchanges of this rank (the interval, stretched
  // for large groups by the store budget); the waits of the cross-rank protocol
  // are counted in these. Local deadlines are checked every interval regardless.
  double exchangeIntervalS() const {
    return torch_ext::exchangeIntervalS(cfg_.intervalS, cfg_.storeBudget, id_.size);
  }
  Ledger& ledger() {
    return ledger_;
  }
  const Ledger& ledger() const {
    return ledger_;
  }
  // The guard's bounded view of the group's store (see StoreChannel.h).
  GroupStore& store() const {
    return *store_;
  }
  // The same store without the group's prefix, for the few job-wide keys
  // (StoreKeys.h: waits/<rank>); null when the group has none (tests).
  GroupStore* jobStore() const {
    return jobStore_.get();
  }
  void setJobStore(std::shared_ptr<GroupStore> store) {
    jobStore_ = std::move(store);
  }
  std::chrono::milliseconds timeout() const {
    return timeout_;
  }
  std::chrono::milliseconds warnAfter() const;
  std::chrono::milliseconds abortAfter() const;
  std::chrono::milliseconds busyCap() const;

  // "default_pg" (the description torch gives) or the group name.
  std::string label() const;
  void setDesc(const std::string& desc);

  // Failure: the first call wins; every pending and later operation of the group
  // fails with it. Runs the abort hook (inner backends) outside the lock.
  bool failed() const {
    return failed_.load(std::memory_order_acquire);
  }
  // Returns true if this call set the failure.
  // `facts`: the report's facts where the finder has them (kind None: the
  // failure's kind, group and text alone).
  bool fail(GuardErrorKind kind, const std::string& report, Verdict facts = Verdict());
  std::optional<Failure> failure() const;
  // The failure that an error's `message` (what throwFailure raised, in this
  // process, for any group, destroyed or not) reports; null for none. The
  // last 64 failures of the process are kept.
  static std::shared_ptr<const Failure> failureOf(const std::string& message);
  // Throws the group's failure. `op` names a later operation that ran into an
  // earlier failure ("" for the operation that caused it).
  [[noreturn]] void throwFailure(const std::string& op) const;
  // The group's failure as an exception (the group has failed).
  std::exception_ptr failureError(const std::string& op = std::string()) const;
  // Whether the failure was ever handed to the program (a wait, a future or a
  // call raised it: see GuardError::markSeen): an exit path reports a
  // mismatch nobody saw, so no process exits 0 over it, and never raises
  // again one the program saw and handled.
  bool failureRaised() const {
    return failureSeen_->load(std::memory_order_acquire);
  }
  void setAbortHook(std::function<void()> hook);
  // Callers' hooks, run once when the group fails, before the abort hook above
  // (torch 2.15's Backend::registerAbortHook, through GuardBackend: upstream
  // health checks and dumps learn of the guard's failures). By id: adding an id
  // again replaces its hook. A hook that throws is logged; the others still run.
  void addFailureHook(int64_t id, std::function<void()> hook);
  void removeFailureHook(int64_t id);

  // Where this group's checks, mode and works report what they find: the
  // watchdog once it watches the group (IncidentSink.h), a detached sink before.
  IncidentSink& incidents() const {
    return *incidents_.load(std::memory_order_acquire);
  }
  void attachIncidentSink(IncidentSink& sink) {
    incidents_.store(&sink, std::memory_order_release);
  }

  // A stream backend whose mode holds the waiting streams until the verdict
  // (verify's): the gate on the device (null otherwise). Set once, by the mode.
  void setStreamGate(std::shared_ptr<device::StreamGate> gate) {
    streamGate_ = std::move(gate);
  }
  device::StreamGate* streamGate() const {
    return streamGate_.get();
  }

  // Some inner backend completes its works on a stream (NCCL, nccl_sim): a
  // failed operation leaves its communicator unusable, so a failure verdict
  // fails the whole group. Set once, before the first collective.
  void setStreamOrdered(bool v) {
    streamOrdered_ = v;
  }
  bool streamOrdered() const {
    return streamOrdered_;
  }

  // Wakes threads blocked in waitUntil() (a work completed or the group failed).
  void notify();
  // Waits until pred() or failed(); returns false if `timeout` (> 0) passed first.
  // pred() runs once without this object's lock (a wait on a finished work
  // takes none), then with it held: it must be thread-safe and must not call
  // back into this object.
  bool waitUntil(const std::function<bool()>& pred, std::chrono::milliseconds timeout);

 private:
  GroupIdentity id_;
  Config cfg_;
  std::shared_ptr<GroupStore> store_;
  std::chrono::milliseconds timeout_;
  Ledger ledger_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string desc_;
  std::atomic<bool> failed_{false};
  SeenFlag failureSeen_ = std::make_shared<std::atomic<bool>>(false);
  std::optional<Failure> failure_;
  std::function<void()> abortHook_;
  std::map<int64_t, std::function<void()>> failureHooks_;
  std::shared_ptr<Mode> mode_ = std::make_shared<Mode>();
  ReleaseGate* gate_ = nullptr;
  std::shared_ptr<device::StreamGate> streamGate_;
  bool streamOrdered_ = false;
  // Last: the members above keep their offsets (the ledger's hot fields their cache lines).
  std::shared_ptr<GroupStore> jobStore_;
  std::atomic<IncidentSink*> incidents_{&detachedIncidentSink()};
};

}  // namespace torch_ext
