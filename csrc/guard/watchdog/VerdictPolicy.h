#pragma once

// VerdictPolicy: what a verdict does to this rank's group, as a pure function
// of the facts (facts -> actions). Watchdog::applyVerdict gathers the facts,
// asks decideVerdict, and carries the actions out (logs, fails the group, ends
// the other groups of a deadlock's cycle); the decision table itself is here,
// and tested on its own (tests/cpp/test_verdict_policy.cpp).

#include "guard/Errors.h"
#include "guard/Runtime.h"
#include "guard/report/Incident.h"
#include "guard/report/Verdict.h"

#include <optional>

namespace torch_ext {

struct VerdictFacts {
  Verdict::Kind verdict = Verdict::Kind::None;
  IncidentKind incident = IncidentKind::Hang;  // what raised it: warn_after (Hang), abort_after (Abort), ...
  bool cycle = false;                          // a hang verdict that found a wait-for cycle
  bool certain = false;                        // ... that waiting cannot resolve (WaitFinding::certain)
  bool compares = true;                        // the group's check mode compares (Mode::compares)
  bool endDeadlocks = true;                    // TORCH_EXT_END_DEADLOCKS
  bool rankGone = false;                       // a failure verdict that names a rank gone
  bool streamOrdered = false;                  // the group's inner backend completes on streams (NCCL)
};

// Who logs the verdict's text: no one, the rank the verdict names as its
// reporter, the lowest rank of a deadlock's loop (once per process and
// cycle), or every rank (at debug level).
enum class VerdictLogger : uint8_t { Nobody, Reporter, LowestOfLoop, Everyone };
// How the error's text is worded: the verdict's own, as a deadline's abort,
// or as a deadlock ended early.
enum class VerdictWording : uint8_t { AsFound, Abort, Deadlock };

struct VerdictActions {
  VerdictLogger logger = VerdictLogger::Nobody;
  LogLevel level = LogLevel::Debug;
  VerdictWording wording = VerdictWording::AsFound;
  std::optional<GuardErrorKind> fail;  // the group fails with this kind
  bool endCycle = false;               // end this process's other groups on the cycle
  bool deadlineReported = false;       // warn_after's report is out: the deadline does not fire it again
  bool remembersCycle = false;         // the loop, for the abort of the same collective later
};

VerdictActions decideVerdict(const VerdictFacts& facts);

}  // namespace torch_ext
