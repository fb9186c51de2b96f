#include "guard/watchdog/VerdictPolicy.h"

namespace torch_ext {

VerdictActions decideVerdict(const VerdictFacts& f) {
  VerdictActions a;
  const bool abort = f.incident == IncidentKind::Abort;
  switch (f.verdict) {
    case Verdict::Kind::Mismatch:
      a.logger = VerdictLogger::Reporter;
      if (f.compares) {
        a.level = LogLevel::Error;
        a.fail = GuardErrorKind::Mismatch;
      } else if (abort) {
        // Checks are off, but the deadline is not: abort, saying what differs.
        a.level = LogLevel::Error;
        a.wording = VerdictWording::Abort;
        a.fail = GuardErrorKind::Timeout;
      } else {
        a.level = LogLevel::Warning;  // checks are off: say what is wrong, fail nothing
      }
      break;
    case Verdict::Kind::Hang:
      a.remembersCycle = f.cycle;
      if (f.cycle && f.certain && f.endDeadlocks && !abort) {
        // Waiting longer cannot resolve it: end it now, on every group of the loop.
        a.logger = VerdictLogger::LowestOfLoop;
        a.level = LogLevel::Error;
        a.wording = VerdictWording::Deadlock;
        a.fail = GuardErrorKind::Deadlock;
        a.endCycle = true;
      } else if (abort) {
        a.logger = VerdictLogger::Reporter;
        a.level = LogLevel::Error;
        a.wording = VerdictWording::Abort;
        a.fail = GuardErrorKind::Timeout;
      } else {
        a.logger = VerdictLogger::Reporter;
        a.level = LogLevel::Warning;
        a.deadlineReported = true;
      }
      break;
    case Verdict::Kind::Failure:
      a.logger = VerdictLogger::Reporter;
      a.level = LogLevel::Error;
      // With a rank gone the group cannot recover: fail it on every rank, so
      // ranks that have not reached the collective yet fail fast too. Nor can
      // a stream-ordered communicator after one of its operations failed.
      if (f.rankGone || f.streamOrdered) a.fail = GuardErrorKind::Failure;
      break;
    case Verdict::Kind::None:
      a.logger = VerdictLogger::Everyone;
      a.level = LogLevel::Debug;
      break;
  }
  return a;
}

}  // namespace torch_ext
