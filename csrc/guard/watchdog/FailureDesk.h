#pragma once

// FailureDesk: where a group's failure is filed, and what this process tells.
//
// The one code that fails a group (GroupState::fail): it writes the dumps a
// difference needs first (every rank, while its ledger still shows the
// collective), sets the failure (the first wins), and tells it as the failure
// says (GroupFailure::tell: nobody, the group's rank 0, or this rank at a
// level). The watchdog's verdicts are logged through it too (tell), so it
// knows which group's report this process logged (toldHere: a rank stopped by
// its launcher then points to it instead of repeating it), and which
// mismatch texts it has logged (firstTelling: one mismatch reaches the log
// once, whichever path found it first).

#include "guard/Runtime.h"
#include "guard/collective/IncidentSink.h"

#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>

namespace torch_ext {

class GroupState;

class FailureDesk {
 public:
  // Writes this process's dump for a difference at collective `seq` of `st`'s group.
  using DifferenceDump = std::function<void(GroupState& st, uint64_t seq)>;
  explicit FailureDesk(DifferenceDump dump) : dump_(std::move(dump)) {}

  // Dumps (a difference), fails the group, tells it; false when the group had
  // failed already (its first failure stands, and is the one told).
  bool file(GroupState& st, const GroupFailure& f);
  // Logs `text` at `level`; `failsGroup`: it is the report of `st`'s failure.
  void tell(const GroupState& st, LogLevel level, const std::string& text, bool failsGroup);
  // True the first time `text` is asked about (a bounded memory of texts).
  bool firstTelling(const std::string& text);
  // Whether this process logged the report of `st`'s failure.
  bool toldHere(const GroupState& st) const;

 private:
  DifferenceDump dump_;
  mutable std::mutex mu_;
  std::set<std::string> texts_;             // firstTelling
  std::set<const GroupState*> toldGroups_;  // toldHere; never dereferenced
};

}  // namespace torch_ext
