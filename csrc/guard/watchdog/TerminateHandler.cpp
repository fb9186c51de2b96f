#include "guard/watchdog/TerminateHandler.h"

#include "guard/Runtime.h"
#include "guard/report/Json.h"
#include "guard/report/Snapshot.h"
#include "guard/watchdog/Dumps.h"
#include "guard/watchdog/LastWords.h"
#include "guard/store/StoreKeys.h"
#include "guard/watchdog/Watchdog.h"

#include <execinfo.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

namespace torch_ext {
namespace {

std::terminate_handler g_previous = nullptr;
std::atomic<bool> g_installed{false};
std::atomic<bool> g_terminating{false};

constexpr auto kReportBound = std::chrono::milliseconds(1000);
constexpr auto kHostBound = std::chrono::milliseconds(15000);
// How long a transport thread stopped for a byte-count difference waits for a
// guarded group to fail before the process is terminated after all.
constexpr auto kParkBound = std::chrono::milliseconds(60000);

// gloo's words for a byte-count difference ("[enforce fail at .../pair.cc:456]
// op.preamble.length <= op.nbytes. 12 vs 8. Received data size doesn't match
// expected size").
bool looksLikeSizeMismatch(const std::string& what) {
  return what.find("doesn't match expected size") != std::string::npos || what.find("nbytes") != std::string::npos ||
         what.find("Is there a distributed collective mismatch") != std::string::npos;
}

// gloo's transport thread ("[enforce fail at .../tcp/pair.cc] op.preamble.length
// <= op.nbytes ... Received data size doesn't match expected size"): thrown
// only by a device loop, for one group's pair, while it reads a message.
bool isGlooLengthEnforce(const std::string& what) {
  return what.find("op.preamble.length <= op.nbytes") != std::string::npos ||
         what.find("Received data size doesn't match expected size") != std::string::npos;
}

// gloo's words for a pair whose peer went away ("[.../gloo/transport/tcp/pair.cc:553] Connection
// closed by peer [...]", a reset, a broken pipe).
bool isGlooPeerLoss(const std::string& what) {
  if (what.find("gloo/transport/tcp") == std::string::npos) return false;
  return what.find("Connection closed by peer") != std::string::npos ||
         what.find("Connection reset by peer") != std::string::npos || what.find("Broken pipe") != std::string::npos;
}

// The entry `st`'s transport was in: the oldest pending one, else the last one
// issued (its inner work may have completed while the transport still
// receives for it).
std::optional<Entry> entryInFlight(GroupState& st) {
  const Progress p = st.ledger().progress();
  if (p.hasPending) return p.oldestPending;
  if (auto last = st.ledger().entries(1); !last.empty()) return last.back();
  return std::nullopt;
}

bool hostsStore(GroupState& st) {
  return st.id().size > 1 && st.store().health() == StoreHealth::Healthy &&
         st.store().channel().address().hostRank == st.id().globalRank(st.id().rank);
}

// Under plain env:// this process may host the store. Ending at once would
// take the store with it, and the peers would learn only that it is gone
// (StoreLostError), never that the ranks' collectives differed. So for each
// group whose store it hosts it raises the failure itself (the peers answer
// with their snapshots while this rank's threads still run: the verdict
// describes every rank's call) and stays until the peers have left, bounded by
// the watchdog's own waits (a few seconds each).
void settleHostedGroups(const std::string& what) {
  const std::string why = "this rank's process is being terminated (" + what.substr(0, what.find('\n')) + ")";
  for (const auto& st : Watchdog::instance().groupStates()) {
    if (!hostsStore(*st)) continue;
    if (auto e = entryInFlight(*st)) Watchdog::instance().failureReport(st, e->id, why);
    Watchdog::instance().holdStoreForPeers(st);
  }
}

// This process's pending collectives, one line per group. Runs on the helper
// thread.
std::string describePending() {
  std::ostringstream os;
  for (const auto& st : Watchdog::instance().groupStates()) {
    const bool pending = st->ledger().progress().hasPending;
    if (auto pick = entryInFlight(*st)) {
      const EntryView e = entryView(*pick);
      os << "\n  group \"" << st->label() << "\" (rank " << st->id().rank << " of " << st->id().size << "): ";
      if (e.seq > 0) os << "collective #" << e.seq << " ";
      os << e.text << " at " << e.where() << " (" << (pending ? "pending" : "its last, completed here") << ")";
    }
  }
  return os.str();
}

// std::terminate with no exception in flight: a std::thread destroyed while still joinable, or a
// direct call. Nothing else says where, so the terminating thread's name and native stack do
// (library and offset per frame: the extension's own symbols are hidden, addr2line names them).
std::string noExceptionStack() {
  std::ostringstream os;
  char name[32] = "?";
  pthread_getname_np(pthread_self(), name, sizeof(name));
  os << "\n  std::terminate was called with no exception in flight (a std::thread destroyed while still "
        "joinable, or a direct call), on thread \""
     << name << "\"; its native stack (addr2line -f -C -e LIBRARY +OFFSET names a frame):";
  void* frames[48];
  const int n = backtrace(frames, 48);
  char** symbols = backtrace_symbols(frames, n);
  for (int i = 0; i < n; ++i) os << "\n    " << (symbols != nullptr ? symbols[i] : "?");
  free(symbols);  // NOLINT: backtrace_symbols' one malloc'd block
  return os.str();
}

// Each returns only where the process is to end as before.
void parkTransportThread(const std::string& what);
void parkAfterFailure();

// Long: the whole of a dying process's last second (words to stderr, stores,
// lingering for peers), each step bounded; it runs once and must be read as one.
[[noreturn]] void onTerminate() {
  std::string what;
  const bool hadException = std::current_exception() != nullptr;
  if (auto e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      what = ex.what();
    } catch (...) {
    }
  }
  if (isGlooLengthEnforce(what) && !g_terminating.load()) parkTransportThread(what);
  if (isGlooPeerLoss(what) && !g_terminating.load()) parkAfterFailure();
  if (!g_terminating.exchange(true)) {
    struct Box {
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;       // `pending` is read
      bool published = false;  // the last words are in the stores (or could not be)
      bool settled = false;    // the peers of the groups whose store is hosted here have left
      bool hosts = false;      // this process hosts a group's store
      std::string pending;
    };
    auto box = std::make_shared<Box>();
    try {
      // The lines first, then the stores: a slow store must not hide them.
      std::thread([box, what] {
        std::string text;
        bool hosts = false;
        try {
          for (const auto& st : Watchdog::instance().groupStates()) hosts = hosts || hostsStore(*st);
          text = describePending();
        } catch (const std::exception& e) {
          text = std::string("\n  (reading them failed: ") + e.what() + ")";
        } catch (...) {
          text = "\n  (reading them failed)";
        }
        {
          std::lock_guard<std::mutex> lock(box->mu);
          box->pending = std::move(text);
          box->hosts = hosts;
          box->done = true;
        }
        box->cv.notify_all();
        try {
          for (const auto& st : Watchdog::instance().groupStates())
            publishLastWords(*st, LastWordsWhy{LastWordsCause::Terminated, ""});
        } catch (...) {
        }
        {
          std::lock_guard<std::mutex> lock(box->mu);
          box->published = true;
        }
        box->cv.notify_all();
        if (hosts) {
          try {
            settleHostedGroups(what);
          } catch (...) {
          }
        }
        {
          std::lock_guard<std::mutex> lock(box->mu);
          box->settled = true;
        }
        box->cv.notify_all();
      }).detach();
      std::unique_lock<std::mutex> lock(box->mu);
      box->cv.wait_for(lock, kReportBound, [&] { return box->done; });
      std::ostringstream os;
      os << "torch_ext: this process (pid " << getpid() << ") is being terminated by an exception nobody caught";
      if (looksLikeSizeMismatch(what)) {
        os << ": the inner backend (gloo) received a different number of bytes than this rank's collective "
              "expects, so the ranks issued different collectives (a collective mismatch). The other ranks "
              "raise CollectiveMismatchError describing every rank's call (TORCH_EXT_CHECK=strict compares "
              "before any data moves, so that no process dies)";
      }
      os << ".";
      if (!hadException) os << noExceptionStack();
      if (!box->done) {
        os << "\n  (its pending collectives could not be read within 1 s)";
      } else if (!box->pending.empty()) {
        os << " Pending here:" << box->pending;
      }
      os << "\n";
      sayOnStderr(os.str());
      // The writes are bounded by kLastWordsStoreBound each; past that the process ends anyway.
      box->cv.wait_for(lock, kLastWordsStoreBound, [&] { return box->published; });
      if (box->hosts) {
        // The verdict's round and the peers' leaving: bounded by their own
        // waits; this bound only keeps a stuck watchdog from holding the end.
        box->cv.wait_for(lock, kHostBound, [&] { return box->settled; });
      }
    } catch (...) {
    }
  }
  if (g_previous != nullptr) g_previous();
  std::abort();
}

// gloo's transport thread found a message longer than the receive posted for
// it: the ranks are in different collectives. Ending the process here would
// take this rank (and, under plain env://, the store it may host) with it
// before any check could report. Instead this thread stays here: only its
// device's pairs stop (each gloo group has its own device and loop thread),
// while the helper group's rounds (verify) or the status ring (async) find
// the difference and fail the group on every rank. Once a guarded group has
// failed, the thread stays for good: the failed group's inner backend is never
// destroyed, so nothing joins it, and the process ends when its program does.
// The check may also have failed the group first, and the longer message come
// after (gloo's ring still passing a differing rank's block): the report is
// out, so the thread stays for good at once. If no group fails within
// kParkBound (the thread was a plain gloo group's, or the check missed it),
// the process is terminated as before.
bool someGroupChecks() {
  for (const auto& st : Watchdog::instance().groupStates()) {
    if (st->id().size > 1 && st->mode().compares()) return true;
  }
  return false;
}

// This thread, for good: nothing joins it (its group's inner backend is never destroyed).
[[noreturn]] void parkForGood() {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

size_t failedGroups() {
  size_t n = 0;
  for (const auto& st : Watchdog::instance().groupStates()) n += st->failed() ? 1 : 0;
  return n;
}

void parkTransportThread(const std::string& what) {
  size_t before = 0;
  try {
    if (!someGroupChecks()) return;
    before = failedGroups();
  } catch (...) {
    return;
  }
  std::ostringstream os;
  os << "torch_ext: gloo's transport thread in this process (pid " << getpid()
     << ") received more bytes than this rank's collective expects, so the ranks issued different collectives "
        "(a collective mismatch: "
     << what.substr(0, what.find('\n'))
     << "). The thread is stopped instead of the process, and the check reports the mismatch "
        "(CollectiveMismatchError).\n";
  sayOnStderr(os.str());
  if (before > 0) parkForGood();  // a guarded group has failed already: its report is out
  const auto deadline = std::chrono::steady_clock::now() + kParkBound;
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    bool failed = false;
    try {
      failed = failedGroups() > before;
    } catch (...) {
    }
    if (failed) parkForGood();
  }
  sayOnStderr("torch_ext: no guarded group failed within " + std::to_string(kParkBound.count() / 1000) +
              " s of gloo's transport thread stopping; ending the process.\n");
}

// A guarded group failed (its report is out) and a peer that ended with the error closed its
// connections: gloo may throw that from a device loop thread, where nothing catches it (seen once in
// CI: a rank that had caught CollectiveMismatchError was SIGABRTed on its way out, exit -6 instead
// of its own 1). That thread stops, silently, instead of the process: the failed group's inner
// backend is never destroyed, so nothing joins the thread, and the process ends with the program's
// own status. Never the main thread (it runs the program), and not before a guarded group failed
// (then gloo's error is the only report there is).
void parkAfterFailure() {
  if (static_cast<pid_t>(::syscall(SYS_gettid)) == ::getpid()) return;
  try {
    if (failedGroups() == 0) return;
  } catch (...) {
    return;
  }
  parkForGood();
}

}  // namespace

void sayOnStderr(const std::string& text) {
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + off, text.size() - off);
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

void installTerminateHandler() {
  if (g_installed.exchange(true)) return;
  g_previous = std::set_terminate(&onTerminate);
}

}  // namespace torch_ext
