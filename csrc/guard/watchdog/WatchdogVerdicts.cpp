#include "guard/watchdog/Watchdog.h"

// The watchdog's verdicts: carrying out what a verdict does to this rank's
// groups (decided by VerdictPolicy: fail them, end the other groups of a
// certain deadlock's cycle), verdicts a check reached alone, incidents raised
// from other threads, and the report of an operation the inner backend failed.

#include "guard/Runtime.h"
#include "guard/watchdog/VerdictPolicy.h"
#include "guard/report/Messages.h"
#include "guard/store/StoreKeys.h"

#include <sstream>

namespace torch_ext {

namespace {

std::string abortText(const GroupState& st, const std::string& body, BusyWaitEnd busy) {
  // The first line says "timeout" in so many words: retry logic (and torch's
  // own tests) grep for it in gloo's and NCCL's messages.
  const double abortS = std::chrono::duration<double>(st.abortAfter()).count();
  const std::string why = busy != BusyWaitEnd::None
                              ? messages::abortReason(abortS, messages::AbortScope::EveryLiveRank,
                                                      {std::chrono::duration<double>(st.busyCap()).count(),
                                                       busy == BusyWaitEnd::CapReached})
                              : messages::abortReason(abortS, messages::AbortScope::EveryLiveRank);
  const auto nl = body.find('\n');
  std::string first = body.substr(0, nl);
  const std::string rest = nl == std::string::npos ? "" : body.substr(nl);
  if (!first.empty() && first.back() == ':') {
    first.pop_back();
    return first + " (" + why + "):" + rest;
  }
  return first + ": " + why + rest;
}

// A certain deadlock's report as the error it ends its groups with: the first
// line says it can never complete and that it was ended for that (not for a
// deadline), and how to wait for abort_after instead.
std::string deadlockText(const std::string& body) {
  const std::string why =
      "it can never complete, so it fails now on every live rank of the groups on the cycle; "
      "TORCH_EXT_END_DEADLOCKS=0 would wait for abort_after";
  const auto nl = body.find('\n');
  std::string first = body.substr(0, nl);
  if (!first.empty() && first.back() == ':') first.pop_back();
  return first + "; " + why + ":" + (nl == std::string::npos ? "" : body.substr(nl));
}

}  // namespace

void Watchdog::post(GroupCtx& ctx, const Incident& inc) {
  if (ctx.protocol.post(inc)) ++incidents_;
}

// What a verdict does is decideVerdict's (VerdictPolicy.h); this gathers its
// facts and carries its actions out.
void Watchdog::applyVerdict(GroupCtx& ctx, const Incident& inc, const Verdict& v) {
  GroupState& st = *ctx.state;
  bool reporter = st.id().globalRank(st.id().rank) == v.reporter;
  std::string text = v.text;
  // The end of a collective that the warn_after verdict found deadlocked (its
  // abort, or a peer's exit after its own abort) says so, even when a rank of
  // the loop has left by then and this verdict no longer sees the loop. Only
  // the warn_after verdict counts: every rank of the loop was there to answer
  // it, while a later one may see part of the loop (a rank gone).
  if (inc.kind == IncidentKind::Hang && v.kind == Verdict::Kind::Hang && v.shape == WaitShape::Cycle &&
      !(ctx.deadlock && ctx.deadlock->first == inc.subject)) {
    ctx.deadlock.emplace(inc.subject, v.cycleGroups);
  }
  if ((v.kind == Verdict::Kind::Failure || (v.kind == Verdict::Kind::Hang && inc.kind == IncidentKind::Abort)) &&
      ctx.deadlock && ctx.deadlock->first == inc.subject) {
    // The loop as seen at warn_after, in place of any partial one seen since.
    if (v.shape == WaitShape::Cycle) text = text.substr(text.find(": ") + 2);
    text = deadlockHeadline(ctx.deadlock->second) + ": " + text;
  }
  VerdictFacts facts;
  facts.verdict = v.kind;
  facts.incident = inc.kind;
  facts.cycle = v.kind == Verdict::Kind::Hang && v.shape == WaitShape::Cycle;
  facts.certain = v.certain;
  facts.compares = st.mode().compares();
  facts.endDeadlocks = st.config().endDeadlocks;
  facts.rankGone = !v.gone.empty();
  facts.streamOrdered = st.streamOrdered();
  const VerdictActions act = decideVerdict(facts);
  if (act.remembersCycle) ctx.deadlock.emplace(inc.subject, v.cycleGroups);
  if (act.wording == VerdictWording::Abort) {
    const auto busy = inc.kind == IncidentKind::Abort ? enumFromName<BusyWaitEnd>(inc.error) : std::nullopt;
    text = abortText(st, text, busy.value_or(BusyWaitEnd::None));
  }
  if (act.wording == VerdictWording::Deadlock) text = deadlockText(text);
  bool logs = false;
  switch (act.logger) {
    case VerdictLogger::Nobody:
      break;
    case VerdictLogger::Reporter:
      logs = reporter;
      // One mismatch reaches here more than once (its incident, then each
      // failure it caused, whose analysis finds it first): logged once, by
      // what was found (the first wording wins).
      if (logs && v.kind == Verdict::Kind::Mismatch) logs = desk_.firstTelling(v.text);
      // Each collective in flight when a rank went fails with the same story: told once.
      if (logs && v.kind == Verdict::Kind::Failure && st.failed()) logs = false;
      break;
    case VerdictLogger::LowestOfLoop: {
      // Once, by the lowest rank of the loop, whichever group's verdict
      // reaches it first (endCycleGroups hands each one to every group on the
      // cycle, so the owner's may come second or not at all).
      int64_t lowest = -1;
      for (const auto& s : v.sites) {
        for (auto r : s.waiters) lowest = lowest < 0 ? r : std::min(lowest, r);
      }
      if (st.id().globalRank(st.id().rank) == lowest) {
        std::lock_guard<std::mutex> lock(mu_);
        logs = loggedDeadlocks_.insert(v.cycleGroups).second;
      }
      break;
    }
    case VerdictLogger::Everyone:
      logs = true;
      break;
  }
  if (logs) desk_.tell(st, act.level, text, act.fail.has_value());
  if (act.deadlineReported) {
    std::lock_guard<std::mutex> lock(ctx.localMu);
    ctx.deadlines.reported(inc.subject);
  }
  if (act.fail) failGroup(st, GroupFailure{*act.fail, text, std::nullopt, v});
  if (act.endCycle) endCycleGroups(st, v, text);
  {
    std::lock_guard<std::mutex> lock(mu_);
    results_[st.id().name + "/" + inc.id()] = text;
  }
  cv_.notify_all();
}

bool Watchdog::publishVerdict(const std::shared_ptr<GroupState>& state, const Incident& inc, const Verdict& verdict) {
  auto ctx = find(state.get());
  if (!ctx) return false;
  // On the I/O thread, where the group's incident state lives.
  auto r = state->store().channel().call<bool>("publish", [this, ctx, inc, verdict] {
    if (ctx->removed) return false;
    const bool ok = ctx->protocol.publishVerdict(inc, verdict);
    if (ok) ++incidents_;
    return ok;
  });
  return r.ok() && r.value;
}

void Watchdog::endCycleGroups(const GroupState& from, const Verdict& v, const std::string& text) {
  // Each group on the cycle finds it through its own incident, but at its own
  // pace: a rank that ends first and exits (taking the store with it under
  // plain env://) would leave the others a lost store or a gone peer to report
  // instead of the deadlock. So this process's other groups on the cycle end
  // now too, and their peers get the verdict through them at their next
  // exchange: published once per group (the first rank to publish wins), as a
  // hang incident about any operation of the group.
  std::vector<std::shared_ptr<GroupCtx>> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all = groups_;
  }
  for (const auto& ctx : all) {
    GroupState& st = *ctx->state;
    if (&st == &from || st.failed()) continue;
    const bool onCycle =
        std::any_of(v.sites.begin(), v.sites.end(), [&](const WaitSite& s) { return s.group == st.id().name; });
    if (!onCycle) continue;
    const Incident inc{IncidentKind::Hang, IncidentSubject::any(), st.id().rank, ""};
    // Posted, not called: this runs on a store channel's I/O thread, which
    // may be this group's too.
    st.store().channel().post([this, ctx, inc, v] {
      if (!ctx->removed && ctx->protocol.publishVerdict(inc, v)) ++incidents_;
    });
    failGroup(st, GroupFailure{GuardErrorKind::Deadlock, text, std::nullopt, v});
  }
}

void Watchdog::requestIncident(const std::shared_ptr<GroupState>& state, const Incident& inc) {
  auto ctx = find(state.get());
  if (!ctx) return;
  std::lock_guard<std::mutex> lock(mu_);
  ctx->requests.push_back(inc);
  wake_ = true;
  cv_.notify_all();
}

std::string Watchdog::failureReport(const std::shared_ptr<GroupState>& state, uint64_t entryId,
                                    const std::string& error) {
  auto ctx = find(state.get());
  std::optional<IncidentSubject> subject;
  std::string opText = "operation";
  if (auto e = state->ledger().byId(entryId)) {
    subject = e->seq ? IncidentSubject::collective(e->seq) : IncidentSubject::p2p(state->id().rank, e->id);
    opText = e->seq ? "collective #" + std::to_string(e->seq) + " " + e->fp.describe() : e->fp.describe();
  }
  // Inner errors carry a C++ backtrace after this marker: keep the message only.
  std::string shortError = error.substr(0, error.find("\nException raised from"));
  std::string fallback = opText + " on group \"" + state->label() + "\" failed in the inner backend (rank " +
                         std::to_string(state->id().globalRank(state->id().rank)) + " saw: " + shortError + ")";
  if (!ctx || !subject) return fallback + "\n  (no cross-rank report: the group is not watched)";
  Incident inc{IncidentKind::Failure, *subject, state->id().rank, shortError};
  const std::string resultKey = state->id().name + "/" + inc.id();
  const auto budget =
      std::chrono::milliseconds(std::max<int64_t>(5000, static_cast<int64_t>(25 * state->exchangeIntervalS() * 1000)));
  std::unique_lock<std::mutex> lock(mu_);
  if (!results_.count(resultKey)) {
    ctx->requests.push_back(inc);
    wake_ = true;
    cv_.notify_all();
    // Another incident (e.g. a mismatch verdict) or a lost store may fail the
    // group first: its report explains this failure better than a lost
    // connection does.
    cv_.wait_for(lock, budget, [&] { return results_.count(resultKey) > 0 || !thread_.joinable() || state->failed(); });
  }
  auto it = results_.find(resultKey);
  if (it == results_.end()) {
    if (state->failed()) return fallback;  // the group's own failure wins; this text is unused
    return fallback + "\n  (no cross-rank report within the time limit)";
  }
  // The verdict's first line speaks for the rank that raised the incident; put
  // this rank's own op and error first, then the cross-rank lines.
  const std::string& verdict = it->second;
  auto nl = verdict.find('\n');
  return nl == std::string::npos ? fallback : fallback + verdict.substr(nl);
}

}  // namespace torch_ext
