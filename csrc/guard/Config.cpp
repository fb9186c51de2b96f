#include "guard/Config.h"

#include <csignal>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace torch_ext {

namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

[[noreturn]] void bad(const std::string& what, const std::string& value, const std::string& accepted) {
  throw ConfigError(what + "=" + "'" + value + "' is invalid: expected " + accepted);
}

bool validName(const std::string& s) {
  if (s.empty()) return false;
  for (unsigned char c : s) {
    if (!(std::isalnum(c) || c == '_' || c == '-')) return false;
  }
  return true;
}

}  // namespace

namespace detail {

std::map<std::string, std::string> parseInner(const std::string& text, const std::string& what) {
  const std::string accepted =
      "comma-separated device:backend pairs such as 'cpu:gloo,cuda:nccl' (a backend "
      "registered with torch.distributed, not 'guard' itself)";
  std::map<std::string, std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    if (item.empty()) continue;
    auto colon = item.find(':');
    if (colon == std::string::npos) bad(what, text, accepted);
    std::string device = lower(trim(item.substr(0, colon)));
    std::string backend = lower(trim(item.substr(colon + 1)));
    if (!validName(device) || !validName(backend)) bad(what, text, accepted);
    if (backend == "guard") {
      throw ConfigError(what + "='" + text + "' asks guard to wrap guard for device '" + device +
                        "': name the real backend to wrap instead, e.g. '" + device +
                        (device == "cuda" ? ":nccl'" : ":gloo'"));
    }
    if (out.count(device)) {
      throw ConfigError(what + "='" + text + "' names device '" + device +
                        "' twice: give each device one inner backend");
    }
    out[device] = backend;
  }
  if (out.empty()) bad(what, text, accepted);
  return out;
}

double parseSeconds(const std::string& text, const std::string& what, double lo, double hi) {
  std::string t = trim(text);
  if (!t.empty() && (t.back() == 's' || t.back() == 'S')) t = trim(t.substr(0, t.size() - 1));  // "10s"
  std::ostringstream acc;
  acc << "a number of seconds between " << lo << " and " << hi;
  if (t.empty()) bad(what, text, acc.str());
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(t.c_str(), &end);
  if (errno != 0 || end != t.c_str() + t.size() || !std::isfinite(v) || v < lo || v > hi) {
    bad(what, text, acc.str());
  }
  return v;
}

double parseShare(const std::string& text, const std::string& what) {
  std::string t = lower(trim(text));
  const std::string accepted = "a share of the time such as 0.05 or 5% (below 1), or off";
  if (t == "off" || t == "none" || t == "false") return 0.0;
  double scale = 1.0;
  if (!t.empty() && t.back() == '%') {
    scale = 0.01;
    t = trim(t.substr(0, t.size() - 1));
  }
  if (t.empty()) bad(what, text, accepted);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(t.c_str(), &end) * scale;
  if (errno != 0 || end != t.c_str() + t.size() || !std::isfinite(v) || v < 0 || v >= 1) bad(what, text, accepted);
  return v;
}

int64_t parseInt(const std::string& text, const std::string& what, int64_t lo, int64_t hi) {
  std::string t = trim(text);
  std::ostringstream acc;
  acc << "an integer between " << lo << " and " << hi;
  if (t.empty()) bad(what, text, acc.str());
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(t.c_str(), &end, 10);
  if (errno != 0 || end != t.c_str() + t.size() || v < lo || v > hi) bad(what, text, acc.str());
  return static_cast<int64_t>(v);
}

bool parseBool(const std::string& text, const std::string& what) {
  std::string t = lower(trim(text));
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off") return false;
  bad(what, text, "one of 1, 0, true, false, yes, no, on, off");
}

int parseSignal(const std::string& text, const std::string& what) {
  std::string t = lower(trim(text));
  const std::string accepted =
      "SIGUSR1, SIGUSR2, SIGRTMIN+N (N from 0 to " + std::to_string(SIGRTMAX - SIGRTMIN) + ") or off (no handler)";
  if (t == "off" || t == "0" || t == "none" || t == "false" || t == "no") return 0;
  if (t.rfind("sig", 0) == 0) t = t.substr(3);
  if (t == "usr1") return SIGUSR1;
  if (t == "usr2") return SIGUSR2;
  if (t.rfind("rtmin", 0) == 0) {
    const std::string n = t.substr(5);
    if (n.empty()) return SIGRTMIN;
    if (n[0] == '+') {
      const int64_t k = parseInt(n.substr(1), what, 0, SIGRTMAX - SIGRTMIN);
      return SIGRTMIN + static_cast<int>(k);
    }
  }
  bad(what, text, accepted);
}

std::string signalName(int sig) {
  if (sig == 0) return "off";
  if (sig == SIGUSR1) return "SIGUSR1";
  if (sig == SIGUSR2) return "SIGUSR2";
  if (sig >= SIGRTMIN && sig <= SIGRTMAX) return "SIGRTMIN+" + std::to_string(sig - SIGRTMIN);
  return std::to_string(sig);
}

CheckMode parseCheckMode(const std::string& text, const std::string& what) {
  std::string t = lower(trim(text));
  if (auto mode = enumFromName<CheckMode>(t)) return *mode;
  bad(what, text, "one of off, async, verify, strict");
}

namespace {

// auto, on, off (or 1, 0) into an enum of those three names.
template <typename Mode>
Mode parseAutoOnOff(const std::string& text, const std::string& what) {
  std::string t = lower(trim(text));
  if (t == "1") return Mode::On;
  if (t == "0") return Mode::Off;
  if (auto mode = enumFromName<Mode>(t)) return *mode;
  bad(what, text, "one of auto, on, off (or 1, 0)");
}

}  // namespace

StreamGateMode parseStreamGateMode(const std::string& text, const std::string& what) {
  return parseAutoOnOff<StreamGateMode>(text, what);
}

CallPathMode parseCallPathMode(const std::string& text, const std::string& what) {
  return parseAutoOnOff<CallPathMode>(text, what);
}

std::vector<std::string> parsePackageNames(const std::string& text, const std::string& what) {
  const std::string accepted = "comma-separated importable package names such as 'mylab,mylab_utils.trainer'";
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    if (item.empty()) continue;
    bool ok = true;
    bool atStart = true;
    for (unsigned char c : item) {
      if (c == '.') {
        ok &= !atStart;
        atStart = true;
      } else {
        ok &= (std::isalpha(c) || c == '_' || (!atStart && std::isdigit(c)));
        atStart = false;
      }
    }
    if (!ok || atStart) bad(what, text, accepted);
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
  return out;
}

}  // namespace detail

int stragglerLookEvery(int groupSize) {
  // Small groups are far below any budget: look at every exchange.
  return groupSize <= 64 ? 1 : 8;
}

double exchangeIntervalS(double intervalS, double storeBudget, int groupSize) {
  if (storeBudget <= 0 || groupSize <= 1) return intervalS;
  const double opsPerRank = kStoreOpsPerExchange + 1.0 / stragglerLookEvery(groupSize);
  return std::max(intervalS, opsPerRank * static_cast<double>(groupSize) / storeBudget);
}

namespace {

// The shortest text that reads back as exactly `v` ("0.2", "10", "1e-05").
std::string number(double v) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ",") + i;
  return out;
}

std::string innerText(const std::map<std::string, std::string>& inner) {
  std::string out;
  for (const auto& kv : inner) out += (out.empty() ? "" : ",") + kv.first + ":" + kv.second;
  return out;
}

}  // namespace

// Long: the one table of settings (name, env var, parse, value, words), one
// entry per setting; splitting it would scatter what the README table lists.
const std::vector<Setting>& settings() {
  static const std::vector<Setting> table = {
      {"inner", "TORCH_EXT_INNER", "cpu:gloo,cuda:nccl", SettingScope::Job,
       "Backend that guard wraps for each device type; any backend registered with torch.distributed.",
       [](Config& c, const std::string& v, const std::string& what) {
         // A partial spec (e.g. only "cuda:gloo") keeps the default for other devices.
         for (auto& kv : detail::parseInner(v, what)) c.inner[kv.first] = kv.second;
       },
       [](const Config& c) -> SettingValue { return c.inner; }, [](const Config& c) { return innerText(c.inner); }},
      {"check", "TORCH_EXT_CHECK", "verify", SettingScope::Job,
       "Mismatch detection: off; async (off the hot path, detected within ~1 s, a mismatched result can reach your "
       "code first); verify (results released only once all ranks agree, checked in batches next to the "
       "collectives); strict (checked before each collective: no data moves).",
       [](Config& c, const std::string& v, const std::string& what) { c.check = detail::parseCheckMode(v, what); },
       [](const Config& c) -> SettingValue { return std::string(checkModeName(c.check)); },
       [](const Config& c) { return std::string(checkModeName(c.check)); }},
      {"warn_after", "TORCH_EXT_WARN_AFTER", "10", SettingScope::Job,
       "Seconds a collective may wait before the ranks look at who waits for whom: a certain deadlock ends at once "
       "(end_deadlocks); any other wait is named in a hang report (dumps are written, training goes on), once per "
       "call site until a wait there outlasts the longest that site has already shown.",
       [](Config& c, const std::string& v, const std::string& what) {
         c.warnAfterS = detail::parseSeconds(v, what, 0.01, 1e7);
       },
       [](const Config& c) -> SettingValue { return c.warnAfterS; },
       [](const Config& c) { return number(c.warnAfterS) + "s"; }},
      {"abort_after", "TORCH_EXT_ABORT_AFTER", "the group's timeout", SettingScope::Job,
       "Seconds after which a stuck collective fails on every live rank with CollectiveTimeoutError.",
       [](Config& c, const std::string& v, const std::string& what) {
         if (lower(trim(v)) == "timeout") {
           c.abortAfterS.reset();  // the group's timeout, as when unset
         } else {
           c.abortAfterS = detail::parseSeconds(v, what, 0.01, 1e7);
         }
       },
       [](const Config& c) -> SettingValue { return c.abortAfterS ? SettingValue(*c.abortAfterS) : SettingValue(); },
       [](const Config& c) { return c.abortAfterS ? number(*c.abortAfterS) + "s" : std::string("timeout"); }},
      {"busy_cap", "TORCH_EXT_BUSY_CAP", "auto", SettingScope::Job,
       "Seconds a collective may wait while every rank it waits for is busy (its main thread runs or its process "
       "moves storage bytes: a checkpoint write, a cold torch.compile): past abort_after the wait goes on until "
       "such a rank stops progressing or this cap passes, then fails as at abort_after. auto: 4 x abort_after; "
       "0: no wait past abort_after. The inner backends' own timeouts are set beyond it.",
       [](Config& c, const std::string& v, const std::string& what) {
         if (lower(trim(v)) == "auto") {
           c.busyCapS.reset();
         } else {
           c.busyCapS = detail::parseSeconds(v, what, 0.0, 1e7);
         }
       },
       [](const Config& c) -> SettingValue { return c.busyCapS ? SettingValue(*c.busyCapS) : SettingValue(); },
       [](const Config& c) { return c.busyCapS ? number(*c.busyCapS) + "s" : std::string("auto"); }},
      {"end_deadlocks", "TORCH_EXT_END_DEADLOCKS", "1", SettingScope::Job,
       "End a certain deadlock when warn_after's look finds it: a wait-for cycle across groups or send/recv whose "
       "ranks all block in their waits fails every live rank of its groups with DeadlockError (0: wait for "
       "abort_after, as for any other hang).",
       [](Config& c, const std::string& v, const std::string& what) { c.endDeadlocks = detail::parseBool(v, what); },
       [](const Config& c) -> SettingValue { return c.endDeadlocks; },
       [](const Config& c) { return std::string(c.endDeadlocks ? "1" : "0"); }},
      {"stream_gate", "TORCH_EXT_STREAM_GATE", "auto", SettingScope::Job,
       "check=verify on a stream backend: the stream that waits for a collective also waits, on the device, until "
       "every rank is known to have issued the same collectives, and a difference fills the result with NaN "
       "(integers: their minimum) instead of releasing it. auto: on nccl_sim's CPU streams, not yet on CUDA; on: "
       "CUDA too (NCCL); off: results are not held on a stream backend, as in async.",
       [](Config& c, const std::string& v, const std::string& what) {
         c.streamGate = detail::parseStreamGateMode(v, what);
       },
       [](const Config& c) -> SettingValue { return std::string(enumName(c.streamGate)); },
       [](const Config& c) { return std::string(enumName(c.streamGate)); }},
      {"epoch_check", "TORCH_EXT_EPOCH_CHECK", "1", SettingScope::Job,
       "Compare the ranks' batch counts at the end of each epoch of a DataLoader, and warn once per loop when they "
       "differ and the next epoch begins at different collectives (uneven data: from there on the ranks pair "
       "collectives of different steps); a warning, never an abort (0: off).",
       [](Config& c, const std::string& v, const std::string& what) { c.epochCheck = detail::parseBool(v, what); },
       [](const Config& c) -> SettingValue { return c.epochCheck; },
       [](const Config& c) { return std::string(c.epochCheck ? "1" : "0"); }},
      {"dump_dir", "TORCH_EXT_DUMP_DIR", "(unset: no dumps)", SettingScope::Rank,
       "Folder for per-rank JSON dumps written on every report; read them with python -m torch_ext.diagnose.",
       [](Config& c, const std::string& v, const std::string&) { c.dumpDir = v; },
       [](const Config& c) -> SettingValue { return c.dumpDir; },
       [](const Config& c) { return c.dumpDir.empty() ? std::string("(none)") : c.dumpDir; }},
      {"ledger_size", "TORCH_EXT_LEDGER_SIZE", "1024", SettingScope::Rank,
       "Collectives remembered per group (a fixed ring, the flight recorder).",
       [](Config& c, const std::string& v, const std::string& what) {
         c.ledgerSize = detail::parseInt(v, what, 16, 1 << 20);
       },
       [](const Config& c) -> SettingValue { return c.ledgerSize; },
       [](const Config& c) { return std::to_string(c.ledgerSize); }},
      {"interval", "TORCH_EXT_INTERVAL", "0.2", SettingScope::Job,
       "Watchdog tick in seconds: heartbeats, cross-rank hash checks and deadline checks.",
       [](Config& c, const std::string& v, const std::string& what) {
         c.intervalS = detail::parseSeconds(v, what, 0.01, 10.0);
       },
       [](const Config& c) -> SettingValue { return c.intervalS; },
       [](const Config& c) { return number(c.intervalS) + "s"; }},
      {"call_sites", "TORCH_EXT_CALL_SITES", "1", SettingScope::Rank,
       "Record the user's Python call site (file:line, function) of each collective.",
       [](Config& c, const std::string& v, const std::string& what) { c.callSites = detail::parseBool(v, what); },
       [](const Config& c) -> SettingValue { return c.callSites; },
       [](const Config& c) { return std::string(c.callSites ? "1" : "0"); }},
      {"call_paths", "TORCH_EXT_CALL_PATHS", "auto", SettingScope::Job,
       "Compare each collective's call path (its line and the lines that called it) across ranks, with its op and "
       "shapes: look-alike collectives from different lines (one rank skipped a module) then fail before their data "
       "is released. auto: in strict only; on: in verify and async too; off: never. A legal rank-dependent branch "
       "(if rank == 0: broadcast(x) else: broadcast(y)) then fails as well.",
       [](Config& c, const std::string& v, const std::string& what) {
         c.callPaths = detail::parseCallPathMode(v, what);
       },
       [](const Config& c) -> SettingValue { return std::string(enumName(c.callPaths)); },
       [](const Config& c) { return std::string(enumName(c.callPaths)); }},
      {"store_budget", "TORCH_EXT_STORE_BUDGET", "20000", SettingScope::Job,
       "Store operations per second the guard's watchdogs may spend across the whole job (0: no budget). Groups "
       "larger than budget * interval / 3.125 ranks (1,280 with the defaults) exchange statuses less often, and their "
       "reports and checks take proportionally longer.",
       [](Config& c, const std::string& v, const std::string& what) {
         c.storeBudget = static_cast<double>(detail::parseInt(v, what, 0, 1'000'000'000));
       },
       [](const Config& c) -> SettingValue { return static_cast<int64_t>(c.storeBudget); },
       [](const Config& c) { return std::to_string(static_cast<int64_t>(c.storeBudget)); }},
      {"store_timeout", "TORCH_EXT_STORE_TIMEOUT", "12", SettingScope::Rank,
       "Seconds a store call of the guard may go unanswered before the store (torchrun's agent, or rank 0's process "
       "under plain env://) is declared lost and every guarded group fails with StoreLostError. Above 10 s: torch's "
       "store server looks up the name of every peer that connects, and stops answering while the resolver waits "
       "(5 s per try, two tries).",
       [](Config& c, const std::string& v, const std::string& what) {
         c.storeTimeoutS = detail::parseSeconds(v, what, 0.05, 3600.0);
       },
       [](const Config& c) -> SettingValue { return c.storeTimeoutS; },
       [](const Config& c) { return number(c.storeTimeoutS) + "s"; }},
      {"join_timeout", "TORCH_EXT_JOIN_TIMEOUT", "300", SettingScope::Rank,
       "Seconds the creation of a guard group (init_process_group, new_group, a DeviceMesh) waits for every rank to "
       "join it before it fails on every rank that joined with GroupJoinError, naming the ranks that did not and what "
       "is known of them; a rank known to have created another backend there fails it at once.",
       [](Config& c, const std::string& v, const std::string& what) {
         c.joinTimeoutS = detail::parseSeconds(v, what, 0.1, 1e7);
       },
       [](const Config& c) -> SettingValue { return c.joinTimeoutS; },
       [](const Config& c) { return number(c.joinTimeoutS) + "s"; }},
      {"library_packages", "TORCH_EXT_LIBRARY_PACKAGES", "(none)", SettingScope::Rank,
       "Comma-separated Python packages whose frames count as library code in call sites and stacks, like installed "
       "packages (e.g. your own training framework installed in editable mode).",
       [](Config& c, const std::string& v, const std::string& what) {
         c.libraryPackages = detail::parsePackageNames(v, what);
       },
       [](const Config& c) -> SettingValue { return c.libraryPackages; },
       [](const Config& c) { return joined(c.libraryPackages); }},
      {"live_signal", "TORCH_EXT_LIVE_SIGNAL", "SIGUSR2", SettingScope::Rank,
       "Signal that makes the rank receiving it log the live report of the whole job (every rank's state and stack, "
       "who waits for whom; what torch-ext-diagnose live prints); off: no handler. Process-wide, from the first "
       "guard group; never replaces a handler already installed for that signal.",
       [](Config& c, const std::string& v, const std::string& what) { c.liveSignal = detail::parseSignal(v, what); },
       [](const Config& c) -> SettingValue { return detail::signalName(c.liveSignal); },
       [](const Config& c) { return detail::signalName(c.liveSignal); }},
      {"straggler", "TORCH_EXT_STRAGGLER", "0.05", SettingScope::Job,
       "Straggler report: a rank is named when, over several windows of collectives, the other ranks waited for it at "
       "least this share of their time (0.05, or 5%); off or 0: no analysis, no warning. Group rank 0 analyses what "
       "every rank publishes and logs a rate-limited warning; torch_ext.stragglers() returns the figures.",
       [](Config& c, const std::string& v, const std::string& what) {
         c.stragglerThreshold = detail::parseShare(v, what);
       },
       [](const Config& c) -> SettingValue { return c.stragglerThreshold; },
       [](const Config& c) { return c.stragglerThreshold > 0 ? number(c.stragglerThreshold) : std::string("off"); }},
  };
  return table;
}

Config Config::resolve(const std::map<std::string, std::string>& overrides) {
  Config cfg;
  // Validate override names first: a typo in GuardOptions must not pass silently.
  for (const auto& kv : overrides) {
    bool known = false;
    for (const auto& d : settings()) known |= (kv.first == d.option);
    if (!known) {
      std::string names;
      for (const auto& d : settings()) names += std::string(names.empty() ? "" : ", ") + d.option;
      throw ConfigError("GuardOptions has no option '" + kv.first + "': expected one of " + names);
    }
  }
  for (const auto& d : settings()) {
    std::string value, what;
    auto it = overrides.find(d.option);
    if (it != overrides.end()) {
      value = it->second;
      what = std::string("GuardOptions(") + d.option + ")";
    } else if (const char* env = std::getenv(d.env); env != nullptr && *env != '\0') {
      value = env;
      what = d.env;
    } else {
      continue;
    }
    cfg.source[d.option] = what;
    cfg.raw[d.option] = value;
    d.apply(cfg, value, what);
  }
  return cfg;
}

void Config::adopt(const std::map<std::string, std::string>& values, const std::string& whose) {
  for (const auto& [option, value] : values) {
    const auto& table = settings();
    auto s = std::find_if(table.begin(), table.end(), [&](const Setting& d) { return option == d.option; });
    if (s == table.end()) throw ConfigError("no setting '" + option + "' to take from " + whose + " settings");
    const std::string what = whose + " " + option;
    s->apply(*this, value, what);
    source[option] = what;
    raw[option] = value;
  }
}

std::chrono::milliseconds Config::abortAfter(std::chrono::milliseconds pgTimeout) const {
  if (abortAfterS) {
    return std::chrono::milliseconds(static_cast<int64_t>(*abortAfterS * 1000.0));
  }
  return pgTimeout;
}

std::chrono::milliseconds Config::busyCap(std::chrono::milliseconds pgTimeout) const {
  const auto abort = abortAfter(pgTimeout);
  if (busyCapS) return std::max(abort, std::chrono::milliseconds(static_cast<int64_t>(*busyCapS * 1000.0)));
  return abort * kBusyCapTimes;
}

std::chrono::milliseconds Config::innerTimeout(std::chrono::milliseconds pgTimeout) const {
  const auto last = std::max({pgTimeout, abortAfter(pgTimeout), busyCap(pgTimeout)});
  return last + std::max<std::chrono::milliseconds>(kInnerGrace, last / 10);
}

std::string Config::describe() const {
  std::string out;
  for (const auto& d : settings()) {
    const std::string text = d.show(*this);
    if (text.empty()) continue;  // an empty list says nothing
    out += (out.empty() ? "" : " ") + std::string(d.option) + "=" + text;
  }
  return out;
}

}  // namespace torch_ext
