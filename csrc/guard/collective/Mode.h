#pragma once

// Mode: one check mode (off, async, strict, verify) as an object (issue 67).
//
// A group's mode owns everything it decides: which route an operation takes
// to the inner backend, what runs before and after the inner call, what holds
// a result until it is released (its ReleaseGate), the drain at shutdown and
// exit, and whether the watchdog compares the ranks' rolling fingerprints in
// its status ring. The pipeline (CollectiveChecks) calls these hooks in order
// for every operation; the watchdog, the dumps, the exit path and the
// terminate handler read its answers. Nothing outside a mode's own folder
// (csrc/guard/modes/<mode>/) asks which mode a group has: adding a mode is
// its folder, Config's name for it and one line of the registry
// (modes/Modes.cpp). tests/python/test_layout.py holds it.
//
// The defaults are a mode that checks nothing: each hook does nothing, a
// result is released when its inner work completes.

#include "guard/collective/InBandRequest.h"
#include "guard/collective/Operation.h"
#include "guard/collective/ReleaseGate.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace torch_ext {

class Mode {
 public:
  // What a mode answers once and for all, set by its constructor.
  struct Answers {
    // The ranks' collectives are compared: a difference fails the group (a
    // mode that compares nothing only warns of a verdict); a send or receive
    // left unmatched is looked into; gloo's transport thread is parked, not
    // let terminate the process, when it finds two ranks' byte counts differ.
    bool compares = false;
    // A collective's result reaches the program only once every rank is
    // known to have issued the same collective.
    bool resultsWaitForTheCheck = false;
    // Each collective's call path is part of what the ranks compare
    // (Config.h, CallPathMode).
    bool comparesCallPaths = false;
  };
  Mode() = default;
  explicit Mode(Answers answers) : answers_(answers) {}
  virtual ~Mode() = default;

  // --- What the rest of the guard asks ---------------------------------------
  bool compares() const {
    return answers_.compares;
  }
  bool resultsWaitForTheCheck() const {
    return answers_.resultsWaitForTheCheck;
  }
  bool comparesCallPaths() const {
    return answers_.comparesCallPaths;
  }
  // The watchdog compares the rolling fingerprints each rank's status carries
  // with its ring neighbours' now (Watchdog::exchange).
  virtual bool comparesInStatusRing() const {
    return false;
  }

  // --- The pipeline, in the order CollectiveChecks calls it -----------------
  // Whether `op`'s fingerprint is kept past its ledger record (Operation::kept)
  // for a later step of this mode.
  virtual bool keepsFingerprint(const Operation& /*op*/) const {
    return false;
  }
  // `op` is recorded (its seq and rolling hash are known): the mode picks its
  // route. `inBand`: the collective could carry its check (null if not).
  virtual void recorded(Operation& /*op*/, const c10d::Backend& /*inner*/, const InBandRequest* /*inBand*/,
                        bool /*coalescing*/) {}
  // Before the inner call; may throw the group's failure (no data moves) or
  // change the route.
  virtual void beforeInner(Operation& /*op*/) {}
  // Route::InBand: the collective, carrying this rank's check.
  virtual c10::intrusive_ptr<c10d::Work> carry(const Operation& op, c10d::Backend& inner, const InBandRequest& inBand);
  // Route::Deferred: queues the receive, `post` posts it later; returns the
  // work that stands for it.
  virtual c10::intrusive_ptr<c10d::Work> deferReceive(std::function<c10::intrusive_ptr<c10d::Work>()> post,
                                                      const Operation& op);
  // After the inner call (`issued`: it returned a work). Never throws.
  virtual void afterInner(const Operation& /*op*/, bool /*issued*/) {}
  // The work the program gets, from the guard's own work around the inner one.
  virtual c10::intrusive_ptr<c10d::Work> release(const Operation& /*op*/, c10::intrusive_ptr<c10d::Work> work) {
    return work;
  }

  // --- Around the collectives ------------------------------------------------
  // What holds results until they are released (null: none is held).
  virtual ReleaseGate* gate() {
    return nullptr;
  }
  // No clean exit over a pending verdict: waits, at most about `bound`, until
  // what this rank issued is checked (a difference found meanwhile fails the
  // group). The group has not failed.
  virtual void drain(std::chrono::milliseconds /*bound*/) {}
  // destroy_process_group(): drains (unless the group failed) and checks no more.
  virtual void shutdown(std::chrono::milliseconds /*bound*/) {}
  // The group was shut down cleanly (after shutdown): the mode lets go of the
  // helper backend and of what it kept for operations in flight.
  virtual void dropBackends() {}
  // The group failed (its abort hook): whatever the mode holds gets `err`.
  virtual void groupFailed(std::exception_ptr /*err*/) {}
  // The mode's counters, by name, for Python's introspection (empty: none).
  virtual std::vector<std::pair<std::string, uint64_t>> counters() const {
    return {};
  }

 private:
  const Answers answers_;
};

}  // namespace torch_ext
