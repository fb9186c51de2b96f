#include "guard/watchdog/FailureDesk.h"

#include "guard/collective/GroupState.h"

namespace torch_ext {

namespace {

constexpr size_t kTextsKept = 1024;  // firstTelling's memory

}  // namespace

bool FailureDesk::file(GroupState& st, const GroupFailure& f) {
  // A difference is told as an incident's verdict is: the dumps first, while
  // the ledgers still show the differing collective, then the failure.
  if (f.differenceAt && dump_) dump_(st, *f.differenceAt);
  if (!st.fail(f.kind, f.report, f.facts)) return false;
  const Telling& t = f.tell;
  const bool tells = t.who == Telling::Who::ThisRank || (t.who == Telling::Who::GroupRankZero && st.id().rank == 0);
  if (tells) tell(st, t.level, t.line.empty() ? f.report : t.line, true);
  return true;
}

void FailureDesk::tell(const GroupState& st, LogLevel level, const std::string& text, bool failsGroup) {
  logMessage(level, text);
  if (!failsGroup) return;
  std::lock_guard<std::mutex> lock(mu_);
  toldGroups_.insert(&st);
}

bool FailureDesk::firstTelling(const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  return texts_.size() < kTextsKept ? texts_.insert(text).second : !texts_.count(text);
}

bool FailureDesk::toldHere(const GroupState& st) const {
  std::lock_guard<std::mutex> lock(mu_);
  return toldGroups_.count(&st) > 0;
}

}  // namespace torch_ext
