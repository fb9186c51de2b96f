#pragma once

// Config: the one place where torch_ext's settings are parsed and validated.
//
// Every TORCH_EXT_* environment variable is read here and nowhere else. A value
// may also come from GuardOptions (Python) as a string override; an override wins
// over the environment. Errors name the variable (or option), the bad value and
// the accepted values, because they surface at init_process_group where a user
// can still fix them.

#include "guard/report/EnumNames.h"

#include <chrono>
#include <csignal>
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace torch_ext {

enum class CheckMode : uint8_t { Off, Async, Verify, Strict };

template <>
struct EnumTable<CheckMode> {
  static constexpr NamedValue<CheckMode> kEntries[] = {
      {CheckMode::Off, "off"},
      {CheckMode::Async, "async"},
      {CheckMode::Verify, "verify"},
      {CheckMode::Strict, "strict"},
  };
};
inline const char* checkModeName(CheckMode mode) {
  return enumName(mode);
}

// Where check="verify" holds a stream backend's results on their stream
// (device/StreamGate.h): nowhere; on CPU streams (nccl_sim) but not CUDA's,
// until the CUDA gate's tests have passed on a GPU; on every stream.
enum class StreamGateMode : uint8_t { Off, Auto, On };

template <>
struct EnumTable<StreamGateMode> {
  static constexpr NamedValue<StreamGateMode> kEntries[] = {
      {StreamGateMode::Off, "off"},
      {StreamGateMode::Auto, "auto"},
      {StreamGateMode::On, "on"},
  };
};

// Whether the ranks compare each collective's call path (its line and the
// user frames that called it) as part of what must agree (issue 67): auto is
// strict only; on adds verify and async; off: never. A path difference then
// fails the collective before its data is released, as a shape would; legal
// rank-dependent branches (`if rank == 0: broadcast(x) else: broadcast(y)`)
// fail too, which is why the default leaves it to strict.
enum class CallPathMode : uint8_t { Off, Auto, On };

template <>
struct EnumTable<CallPathMode> {
  static constexpr NamedValue<CallPathMode> kEntries[] = {
      {CallPathMode::Off, "off"},
      {CallPathMode::Auto, "auto"},
      {CallPathMode::On, "on"},
  };
};

// The watchdog's store operations per rank per exchange (status set, the ring
// neighbours' multi_get, the alert counter), which the store budget divides.
constexpr int kStoreOpsPerExchange = 3;

// Exchanges between two looks of the straggler analyst (group rank 0) at
// every rank's status: each look reads the group's `size` records, so it adds
// 1 / every read per rank and exchange (counted in exchangeIntervalS).
int stragglerLookEvery(int groupSize);

// Seconds between two store exchanges of a rank in a group of `groupSize`:
// the configured interval, stretched so that the group's ranks together stay
// within the store budget (interval at 1,280 ranks and below with the defaults;
// the straggler analyst's reads count as 1/8 operation per rank above 64 ranks).
double exchangeIntervalS(double intervalS, double storeBudget, int groupSize);

// Raised for a malformed setting; the message names the source and the fix.
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct Config {
  // device type ("cpu", "cuda", ...) -> inner backend name ("gloo", "nccl", ...)
  std::map<std::string, std::string> inner{{"cpu", "gloo"}, {"cuda", "nccl"}};
  CheckMode check = CheckMode::Verify;
  double warnAfterS = 10.0;
  // Unset means "the process group's timeout".
  std::optional<double> abortAfterS;
  // How long a collective may wait while every rank it waits for is busy
  // (issue 68: busy is not hung). Unset: kBusyCapTimes x abort_after; at or
  // below abort_after: no wait past abort_after.
  std::optional<double> busyCapS;
  static constexpr int kBusyCapTimes = 4;
  // A certain deadlock (a wait-for cycle whose ranks all block in it) fails
  // its groups when found, not at abort_after.
  bool endDeadlocks = true;
  // check="verify" on a stream backend holds the waiting stream until the
  // verdict (device/StreamGate.h).
  StreamGateMode streamGate = StreamGateMode::Auto;
  // torch_ext/epochs.py: the ranks' batch counts per epoch compared, a difference warned about.
  bool epochCheck = true;
  std::string dumpDir;  // empty: no dump files
  int64_t ledgerSize = 1024;
  double intervalS = 0.2;
  bool callSites = true;
  CallPathMode callPaths = CallPathMode::Auto;
  // The longest a store call of the guard may go unanswered before the store
  // is declared lost (its own client; never the group's timeout). Above the
  // pause of a healthy store whose server waits on a name lookup (2 x 5 s).
  double storeTimeoutS = 12.0;
  // Store operations per second that the watchdogs of the whole job may spend
  // (0: no budget). Large groups exchange less often to stay within it.
  double storeBudget = 20000.0;
  // How long creating a guard group waits for every rank to join it (the join
  // handshake, store/JoinHandshake.h) before it fails with GroupJoinError.
  double joinTimeoutS = 300.0;
  // Python packages (importable names, e.g. "mylab.trainer") whose frames are
  // library code for call sites and stacks, like installed packages.
  std::vector<std::string> libraryPackages;
  // Signal that makes this rank log the live report of the whole job (0: none).
  int liveSignal = SIGUSR2;  // parsed by name (detail::parseSignal)
  // A rank is a straggler in a window of collectives when the other ranks'
  // median wait exceeds its own by this share of the window's time (0: off).
  double stragglerThreshold = 0.05;

  // Where each setting came from, for error messages: "TORCH_EXT_INNER" or
  // "GuardOptions(inner=...)". Only settings that were given are present.
  std::map<std::string, std::string> source;
  // The value as given there (for messages that quote it).
  std::map<std::string, std::string> raw;

  // Reads the environment, then applies `overrides` (option name -> string
  // value, as given by GuardOptions). Throws ConfigError on any bad value.
  static Config resolve(const std::map<std::string, std::string>& overrides = {});

  // Takes `values` (option name -> value as Setting::show writes it) from
  // `whose` settings ("rank 0's": the join handshake's job-wide values), each
  // with its source "<whose> <option>". Throws ConfigError on a bad value.
  void adopt(const std::map<std::string, std::string>& values, const std::string& whose);

  // The abort deadline for a group whose timeout is `pgTimeout`.
  std::chrono::milliseconds abortAfter(std::chrono::milliseconds pgTimeout) const;

  // The longest a collective waits while the ranks it waits for are busy.
  std::chrono::milliseconds busyCap(std::chrono::milliseconds pgTimeout) const;
  // The inner backends' own timeout: beyond every deadline of the guard's (the
  // group's timeout, abort_after, busy_cap) by a tenth, at least kInnerGrace,
  // so the guard's report always comes first.
  std::chrono::milliseconds innerTimeout(std::chrono::milliseconds pgTimeout) const;
  static constexpr std::chrono::milliseconds kInnerGrace{10'000};

  // One line per setting, for logs and `repr(GuardOptions)`.
  std::string describe() const;
};

// A setting's resolved value, typed as GuardOptions.resolved() gives it to
// Python (monostate: None).
using SettingValue = std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<std::string>,
                                  std::map<std::string, std::string>>;

// Whether the ranks of a group must share a setting (issue 57). A job-wide
// setting changes what goes over the wire or when a rank waits or fails: the
// ranks agree on it when a group is created (store/JoinHandshake.h), and rank
// 0's value is the group's (a rank whose own value differed logs the value it
// runs with). A per-rank setting (where dumps go, what this process
// remembers, its signals) may differ from rank to rank, and nothing is said.
enum class SettingScope : uint8_t { Job, Rank };

template <>
struct EnumTable<SettingScope> {
  static constexpr NamedValue<SettingScope> kEntries[] = {
      {SettingScope::Job, "job"},
      {SettingScope::Rank, "rank"},
  };
};

// One row of the settings table: the ONE list of settings, which drives
// resolution (Config::resolve), description (Config::describe), the Python
// dict (GuardOptions.resolved()), the join handshake and the README's
// configuration table.
struct Setting {
  const char* option;  // GuardOptions field
  const char* env;     // TORCH_EXT_* variable
  const char* defaultValue;
  SettingScope scope;
  const char* meaning;
  // Parses `value` into `cfg`; `what` names the source in errors.
  void (*apply)(Config& cfg, const std::string& value, const std::string& what);
  SettingValue (*get)(const Config& cfg);
  // For describe(): "60s", "timeout", "(none)"; empty to leave it out. For a
  // job-wide setting, exact and parsed back by `apply` to the same value (the
  // join handshake sends it to the other ranks).
  std::string (*show)(const Config& cfg);
};
const std::vector<Setting>& settings();

namespace detail {
// Parses "cpu:gloo,cuda:nccl"; `what` names the source in errors.
std::map<std::string, std::string> parseInner(const std::string& text, const std::string& what);
double parseSeconds(const std::string& text, const std::string& what, double lo, double hi);
int64_t parseInt(const std::string& text, const std::string& what, int64_t lo, int64_t hi);
bool parseBool(const std::string& text, const std::string& what);
CheckMode parseCheckMode(const std::string& text, const std::string& what);
StreamGateMode parseStreamGateMode(const std::string& text, const std::string& what);
CallPathMode parseCallPathMode(const std::string& text, const std::string& what);
// "SIGUSR2", "usr1", "SIGRTMIN+3", "off" -> the signal number (0: off).
int parseSignal(const std::string& text, const std::string& what);
// The name parseSignal reads back: "SIGUSR2", "SIGRTMIN+3", "off".
std::string signalName(int sig);
// "0.05", "5%", "off" -> a share in [0, 1) (0: off).
double parseShare(const std::string& text, const std::string& what);
// Parses "mylab,mylab_utils.trainer" (comma-separated importable package names).
std::vector<std::string> parsePackageNames(const std::string& text, const std::string& what);
}  // namespace detail

}  // namespace torch_ext
