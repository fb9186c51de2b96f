#pragma once

// ReleaseGate: what holds a collective's result until every rank is known to
// have issued the same collectives up to it. A mode that gates releases
// (verify: modes/verify/Verifier.h) hands one to the group (Mode::gate); the
// works (GuardWork) ask it before they let a result out, and never ask which
// mode made it. A group whose mode has none releases each result when its
// inner work completes.

#include <cstdint>
#include <exception>
#include <functional>

namespace torch_ext {

class ReleaseGate {
 public:
  virtual ~ReleaseGate() = default;

  // Collective #seq may be released: every rank issued the same up to it.
  virtual bool verified(uint64_t seq) const = 0;
  // #seq will never be released: a difference was found, or the check could
  // not run (a peer is gone); the group's failure follows.
  virtual bool blocked(uint64_t seq) const = 0;
  // Someone needs #seq's verdict now (wait(), is_completed(), the exit drain).
  virtual void want(uint64_t seq) = 0;
  // A collective completed on this rank (the inner backend's callback).
  virtual void kick() = 0;
  // Runs `release` once #seq is verified (at once if it is); if the check is
  // blocked instead, `onFailure` gets the group's failure.
  virtual void whenVerified(uint64_t seq, std::function<void()> release,
                            std::function<void(std::exception_ptr)> onFailure) = 0;
};

}  // namespace torch_ext
