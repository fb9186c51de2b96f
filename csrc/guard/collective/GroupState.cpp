#include "guard/collective/GroupState.h"

#include "guard/Runtime.h"

#include <deque>
#include <string_view>

namespace torch_ext {

namespace {

// The process's recent failures, newest last, for failureOf.
struct RecentFailures {
  static constexpr size_t kKept = 64;
  std::mutex mu;
  std::deque<std::shared_ptr<const Failure>> failures;

  static RecentFailures& instance() {
    static auto* r = new RecentFailures();  // never destroyed: read at exit
    return *r;
  }
  void add(std::shared_ptr<const Failure> f) {
    std::lock_guard<std::mutex> lock(mu);
    failures.push_back(std::move(f));
    if (failures.size() > kKept) failures.pop_front();
  }
};

// throwFailure's note on an operation that ran into an earlier failure, and how it begins.
constexpr std::string_view kLaterNote = "\n(raised by ";
std::string raisedLaterNote(const std::string& op, int64_t globalRank, const std::string& label) {
  return std::string(kLaterNote) + op + " on rank " + std::to_string(globalRank) + ": group \"" + label +
         "\" failed earlier and stays failed; destroy and re-create it to go on)";
}

Verdict::Kind verdictKindOf(GuardErrorKind kind) {
  switch (kind) {
    case GuardErrorKind::Mismatch:
      return Verdict::Kind::Mismatch;
    case GuardErrorKind::Timeout:
    case GuardErrorKind::Deadlock:
      return Verdict::Kind::Hang;
    default:
      return Verdict::Kind::Failure;
  }
}

}  // namespace

std::shared_ptr<const Failure> GroupState::failureOf(const std::string& message) {
  auto& r = RecentFailures::instance();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto it = r.failures.rbegin(); it != r.failures.rend(); ++it) {
    const std::string& report = (*it)->report;
    if (message == report) return *it;
    // A later operation's error: the report, then throwFailure's note.
    if (message.size() > report.size() && message.compare(0, report.size(), report) == 0 &&
        message.compare(report.size(), kLaterNote.size(), kLaterNote) == 0) {
      return *it;
    }
  }
  return nullptr;
}

GroupState::GroupState(GroupIdentity id, Config cfg, std::shared_ptr<GroupStore> store,
                       std::chrono::milliseconds timeout)
    : id_(std::move(id)),
      cfg_(std::move(cfg)),
      store_(std::move(store)),
      timeout_(timeout),
      ledger_(static_cast<size_t>(cfg_.ledgerSize)) {
  // Alone in a group, or with the straggler report off, nobody compares waits.
  ledger_.setTimeWaits(cfg_.stragglerThreshold > 0 && id_.size > 1);
}

std::chrono::milliseconds GroupState::warnAfter() const {
  return std::chrono::milliseconds(static_cast<int64_t>(cfg_.warnAfterS * 1000.0));
}

std::chrono::milliseconds GroupState::abortAfter() const {
  return cfg_.abortAfter(timeout_);
}

std::chrono::milliseconds GroupState::busyCap() const {
  return cfg_.busyCap(timeout_);
}

std::string GroupState::label() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!desc_.empty() && desc_ != "undefined") return desc_;
  return id_.name;
}

void GroupState::setDesc(const std::string& desc) {
  std::lock_guard<std::mutex> lock(mu_);
  desc_ = desc;
}

bool GroupState::fail(GuardErrorKind kind, const std::string& report, Verdict facts) {
  std::function<void()> hook;
  std::map<int64_t, std::function<void()>> failureHooks;
  if (facts.kind == Verdict::Kind::None) facts.kind = verdictKindOf(kind);
  if (facts.group.empty()) facts.group = label();
  facts.text = report;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_) return false;
    failure_ = Failure{kind, report, std::make_shared<const Verdict>(std::move(facts))};
    RecentFailures::instance().add(std::make_shared<const Failure>(*failure_));
    failed_.store(true, std::memory_order_release);
    hook = abortHook_;
    failureHooks = failureHooks_;
  }
  cv_.notify_all();
  for (const auto& [id, failureHook] : failureHooks) {
    try {
      failureHook();
    } catch (const std::exception& e) {
      logMessage(LogLevel::Warning, "abort hook " + std::to_string(id) + " of group \"" + label() +
                                        "\" raised: " + e.what() + " (the group's other hooks still ran)");
    }
  }
  if (hook) {
    try {
      hook();
    } catch (const std::exception& e) {
      logMessage(LogLevel::Warning, std::string("aborting the inner backend failed: ") + e.what());
    }
  }
  return true;
}

std::optional<Failure> GroupState::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void GroupState::throwFailure(const std::string& op) const {
  auto f = failure();
  if (!f) throw std::logic_error("throwFailure() on a group that has not failed");
  std::string msg = f->report;
  if (!op.empty()) msg += raisedLaterNote(op, id_.globalRank(id_.rank), label());
  throwGuardError(f->kind, msg, failureSeen_);
}

std::exception_ptr GroupState::failureError(const std::string& op) const {
  try {
    throwFailure(op);
  } catch (...) {
    return std::current_exception();
  }
}

void GroupState::setAbortHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  abortHook_ = std::move(hook);
}

void GroupState::addFailureHook(int64_t id, std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(mu_);
  failureHooks_[id] = std::move(hook);
}

void GroupState::removeFailureHook(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  failureHooks_.erase(id);
}

void GroupState::notify() {
  // Taking the lock orders this notify after a waiter's predicate check.
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

bool GroupState::waitUntil(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  // Done already (a wait on a work that finished while the program computed, a
  // synchronous inner backend): no lock. The predicates read atomics and
  // futures, which synchronise themselves; the lock orders only the sleep.
  if (pred()) return true;
  std::unique_lock<std::mutex> lock(mu_);
  auto done = [&] { return failed() || pred(); };
  if (timeout.count() <= 0) {
    cv_.wait(lock, done);
    return true;
  }
  return cv_.wait_for(lock, timeout, done);
}

// --- the sink of a group no watchdog watches (IncidentSink.h) ---

namespace {

class DetachedSink final : public IncidentSink {
 public:
  void requestIncident(const std::shared_ptr<GroupState>&, const Incident&) override {}
  bool publishVerdict(const std::shared_ptr<GroupState>&, const Incident&, const Verdict&) override {
    return true;
  }
  std::string failureReport(const std::shared_ptr<GroupState>&, uint64_t, const std::string& error) override {
    return error;
  }
  std::string writeDump(const std::string&, const std::string&, const GroupState*) override {
    return std::string();
  }
  bool failGroup(GroupState& state, const GroupFailure& failure) override {
    if (!failure.difference) return state.fail(failure.kind, failure.report, failure.facts);
    Verdict facts = renderDifference(*failure.difference);
    const std::string report = facts.text;
    return state.fail(failure.kind, report, std::move(facts));
  }
};

}  // namespace

IncidentSink& detachedIncidentSink() {
  static DetachedSink sink;  // stateless; lives as long as the process
  return sink;
}

}  // namespace torch_ext
