#include "guard/watchdog/LauncherStop.h"

#include "guard/Clock.h"
#include "guard/Runtime.h"
#include "guard/collective/GroupState.h"
#include "guard/report/Json.h"
#include "guard/report/LocalReport.h"
#include "guard/report/StatusRecord.h"
#include "guard/store/StoreKeys.h"
#include "guard/watchdog/Dumps.h"
#include "guard/watchdog/LastWords.h"
#include "guard/watchdog/TerminateHandler.h"
#include "guard/watchdog/Watchdog.h"

#include <semaphore.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

namespace torch_ext {
namespace {

// How long a stopped rank waits for the verdict on its pending collectives: a
// peer's end fails the inner backend's transport at once, and the ranks agree
// on what happened within about a second (measured 1.1-1.3 s after a SIGKILL,
// 3 ranks on gloo); torchrun sends SIGKILL 30 s after SIGTERM.
constexpr std::chrono::milliseconds kVerdictBound{5000};
// How long the log lines handed to the host's logging may take to come out.
constexpr std::chrono::milliseconds kFlushBound{500};
// How many of a group's last operations are looked at for one that failed.
constexpr size_t kFailedLookBack = 8;

std::atomic<bool> g_stopInstalled{false};
sem_t g_stop;
std::string* g_errorFile = nullptr;  // leaked: read by the stop thread at any time
pid_t g_installedBy = 0;             // the process whose thread waits on g_stop

void onStopSignal(int) {
  // A process forked from this one (a DataLoader worker) inherits the handler
  // but not the thread: there SIGTERM does what it always does.
  if (getpid() != g_installedBy) {
    ::signal(SIGTERM, SIG_DFL);
    ::raise(SIGTERM);
    return;
  }
  sem_post(&g_stop);  // async-signal-safe; the thread does the rest
}

// What this rank's groups are in: those with a pending operation, or whose
// last one failed in the inner backend (its verdict on the way), each with
// that operation; the first group that failed, if any.
struct Look {
  // With what the rank can say of each alone (its pending or failed op).
  std::vector<std::pair<std::shared_ptr<GroupState>, LocalFacts>> waiting;
  std::shared_ptr<GroupState> failed;
  // An operation failed in the inner backend (a peer's end closed the
  // transport) and the ranks are comparing what they saw: a verdict is on the
  // way. A rank merely in a collective (a healthy job stopped with Ctrl-C, or a
  // hang) waits for nothing: its state is the report.
  std::shared_ptr<GroupState> verdictComing;
};

Look look() {
  Look out;
  for (auto& st : Watchdog::instance().groupStates()) {
    if (st->failed()) {
      if (!out.failed) out.failed = st;
      continue;
    }
    LocalFacts facts = Watchdog::localFactsOf(*st, st->ledger().progress());
    if (facts.pending || facts.lastFailed) out.waiting.emplace_back(st, std::move(facts));
    for (const auto& e : st->ledger().entries(kFailedLookBack)) {
      if (e.state == EntryState::Failed && !out.verdictComing) out.verdictComing = st;
    }
  }
  return out;
}

// A verdict on what this rank waits in, where one is coming: bounded.
std::shared_ptr<GroupState> awaitVerdict() {
  const auto deadline = std::chrono::steady_clock::now() + kVerdictBound;
  for (;;) {
    Look now = look();
    if (now.failed) return now.failed;
    if (!now.verdictComing) return nullptr;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return nullptr;
    // Woken by a completion or by the failure (then the next look decides).
    now.verdictComing->waitUntil([] { return false; }, std::min(left, std::chrono::milliseconds(200)));
  }
}

// No verdict: where this rank stands in each group, with every peer's status
// as the store has it now.
std::string describeWaits(const Look& now) {
  std::string out;
  for (auto [st, facts] : now.waiting) {
    if (st->store().health() == StoreHealth::Healthy) {
      facts.everyPeerRead = true;
      facts.nowWallNs = wallNs();  // the peers' heartbeats are read now, after the look
      const int64_t readAt = steadyNs();
      for (int r = 0; r < st->id().size; ++r) {
        if (r == st->id().rank) continue;
        auto there = st->store().check({keys::status(r)});
        if (!there.ok() || !there.value) continue;
        auto v = st->store().get(keys::status(r));
        auto rec = v ? StatusRecord::decode(*v) : std::nullopt;
        if (rec) facts.peers[r] = PeerState{*rec, readAt};
      }
    }
    out += formatStandingAtStop(facts);
  }
  return out;
}

std::string thisRank() {
  for (const auto& st : Watchdog::instance().groupStates()) {
    return "rank " + std::to_string(st->id().globalRank(st->id().rank));
  }
  return "a rank";
}

// The stopped rank's report: the launcher's error message and its text.
struct StopReport {
  std::string message, details;
};

StopReport stopReport() {
  StopReport out;
  std::ostringstream head;
  head << thisRank() << " (pid " << getpid() << ") was stopped by its launcher (SIGTERM)";
  if (auto failed = awaitVerdict()) {
    const auto f = failed->failure();
    const std::string report = f ? f->report : std::string("its group failed");
    out.message = std::string(guardErrorClassName(f ? f->kind : GuardErrorKind::Failure)) + ": " + report;
    head << " after group \"" << failed->label() << "\" failed";
    out.details = head.str() + ":\n" + report;
    // Logged here: one line. Handed to the program is not shown yet: its
    // traceback comes as its exception unwinds, which this signal may cut short.
    const bool shown = Watchdog::instance().toldHere(*failed);
    Runtime::instance().flushLogs(kFlushBound);
    sayOnStderr("torch_ext: " + head.str() + (shown ? "; its report is above\n" : ":\n" + report + "\n"));
    return out;
  }
  const Look now = look();
  head << (now.waiting.empty() ? " outside any guarded collective" : " before a verdict, in:");
  out.details = head.str() + describeWaits(now);
  out.message = "stopped by the launcher: " + out.details;
  sayOnStderr("torch_ext: " + out.details + "\n");
  // The dump of the moment it was stopped (a verdict's dumps stay as they are).
  Watchdog::instance().writeDump(enumName(DumpCause::Terminated), std::string(), nullptr);
  return out;
}

void stopThread() {
  while (sem_wait(&g_stop) != 0 && errno == EINTR) {
  }
  // A process already on its way out (its exit settled the groups, or none is
  // left) has said what it had to; it ends as asked.
  if (!Watchdog::instance().exiting() && !Watchdog::instance().groupStates().empty()) {
    StopReport r;
    try {
      r = stopReport();
      for (auto& st : Watchdog::instance().groupStates()) {
        publishLastWords(*st, LastWordsWhy{LastWordsCause::Terminated, ""});
      }
    } catch (const std::exception& e) {
      r.details = std::string("stopped by the launcher (SIGTERM); its report failed: ") + e.what();
      sayOnStderr("torch_ext: " + r.details + "\n");
    }
    if (g_errorFile != nullptr)
      writeLauncherErrorFile(*g_errorFile, r.message.empty() ? r.details : r.message, r.details);
  }
  ::signal(SIGTERM, SIG_DFL);
  ::raise(SIGTERM);
}

}  // namespace

bool installLauncherStop(const std::string& errorFile) {
  if (g_stopInstalled.load()) return true;
  struct sigaction old {};
  if (sigaction(SIGTERM, nullptr, &old) != 0 || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO) != 0) {
    return false;  // someone else's handler: theirs to run
  }
  if (g_stopInstalled.exchange(true)) return true;
  g_errorFile = new std::string(errorFile);
  g_installedBy = getpid();
  sem_init(&g_stop, 0, 0);
  std::thread(stopThread).detach();
  struct sigaction sa {};
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  return true;
}

bool writeLauncherErrorFile(const std::string& path, const std::string& message, const std::string& details) {
  if (path.empty() || ::access(path.c_str(), F_OK) == 0) return false;
  Json extra = Json::object();
  extra.set("py_callstack", Json(details));
  extra.set("timestamp", Json(std::to_string(static_cast<int64_t>(std::time(nullptr)))));
  Json inner = Json::object();
  inner.set("message", Json(message));
  inner.set("extraInfo", std::move(extra));
  Json root = Json::object();
  root.set("message", std::move(inner));
  // Written aside, then linked into place: a file that appeared meanwhile (the
  // program's own @record, or the exit's) stays.
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << root.dump() << "\n";
    if (!out.good()) return false;
  }
  const bool ok = ::link(tmp.c_str(), path.c_str()) == 0;
  std::remove(tmp.c_str());
  return ok;
}

}  // namespace torch_ext
