#pragma once

// FailureDesk: where a group's failure is filed, and what this process tells.
//
// The one code that fails a group (GroupState::fail), and the one that
// renders a difference a check mode hands it as a value (report/Difference.h):
// it publishes a difference found by this rank alone for every rank, writes
// the dumps a difference needs (every rank, while its ledger still shows the
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
  // Publishes a verdict this rank reached alone for every rank of `st`'s group.
  using Publish = std::function<void(GroupState& st, const Verdict& verdict)>;
  FailureDesk(DifferenceDump dump, Publish publish) : dump_(std::move(dump)), publish_(std::move(publish)) {}

  // Renders a difference (publishing one found alone, dumping a collective's),
  // fails the group, tells it; false when the group had failed already (its
  // first failure stands, and is the one told).
  bool file(GroupState& st, const GroupFailure& f);
  // Logs `text` at `level`; `failsGroup`: it is the report of `st`'s failure.
  void tell(const GroupState& st, LogLevel level, const std::string& text, bool failsGroup);
  // True the first time `text` is asked about (a bounded memory of texts).
  bool firstTelling(const std::string& text);
  // Whether this process logged the report of `st`'s failure.
  bool toldHere(const GroupState& st) const;

 private:
  bool failAndTell(GroupState& st, const GroupFailure& f, const std::string& report, Verdict facts);

  DifferenceDump dump_;
  Publish publish_;
  mutable std::mutex mu_;
  std::set<std::string> texts_;             // firstTelling
  std::set<const GroupState*> toldGroups_;  // toldHere; never dereferenced
};

}  // namespace torch_ext
