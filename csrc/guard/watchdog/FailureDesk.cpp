#include "guard/watchdog/FailureDesk.h"

#include "guard/collective/GroupState.h"

namespace torch_ext {

namespace {

constexpr size_t kTextsKept = 1024;  // firstTelling's memory

}  // namespace

bool FailureDesk::file(GroupState& st, const GroupFailure& f) {
  if (!f.difference) return failAndTell(st, f, f.report, f.facts);
  // A difference is told as an incident's verdict is: one found here alone
  // published for every rank (they act on it even if this process exits
  // right after), the dumps while the ledgers still show the differing
  // collective, then the failure.
  Verdict facts = renderDifference(*f.difference);
  const std::string report = facts.text;
  if (f.difference->foundAlone() && publish_) publish_(st, facts);
  if (const uint64_t seq = f.difference->dumpAt(); seq != 0 && dump_) dump_(st, seq);
  return failAndTell(st, f, report, std::move(facts));
}

bool FailureDesk::failAndTell(GroupState& st, const GroupFailure& f, const std::string& report, Verdict facts) {
  if (!st.fail(f.kind, report, std::move(facts))) return false;
  const Telling& t = f.tell;
  const bool tells = t.who == Telling::Who::ThisRank || (t.who == Telling::Who::GroupRankZero && st.id().rank == 0);
  if (tells) tell(st, t.level, t.line.empty() ? report : t.line, true);
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
