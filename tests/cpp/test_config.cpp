// Config: every TORCH_EXT_* setting parsed in one place, with errors that name
// the variable, the bad value and the accepted values.
#include "guard/Config.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <variant>
#include <vector>

#include <cstdlib>

using torch_ext::CheckMode;
using torch_ext::Config;
using torch_ext::ConfigError;
using torch_ext::StreamGateMode;

namespace test_config {

namespace {

struct EnvGuard {
  explicit EnvGuard(const char* name, const char* value) : name_(name) {
    setenv(name, value, 1);
  }
  ~EnvGuard() {
    unsetenv(name_);
  }
  const char* name_;
};

std::string errorOf(const std::map<std::string, std::string>& overrides) {
  try {
    Config::resolve(overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Config, Defaults) {
  Config c = Config::resolve();
  EXPECT_EQ(c.inner.at("cpu"), "gloo");
  EXPECT_EQ(c.inner.at("cuda"), "nccl");
  EXPECT_EQ(c.check, CheckMode::Verify);  // the default since issue 23
  EXPECT_DOUBLE_EQ(c.warnAfterS, 10.0);   // the look that ends a certain deadlock (issue 38)
  EXPECT_TRUE(c.endDeadlocks);
  EXPECT_FALSE(c.abortAfterS.has_value());
  EXPECT_EQ(c.abortAfter(std::chrono::milliseconds(5000)).count(), 5000);
  EXPECT_EQ(c.ledgerSize, 1024);
}

TEST(Config, EndDeadlocksCanBeTurnedOff) {
  EnvGuard off("TORCH_EXT_END_DEADLOCKS", "0");
  EXPECT_FALSE(Config::resolve().endDeadlocks);
  EXPECT_TRUE(Config::resolve({{"end_deadlocks", "1"}}).endDeadlocks);  // GuardOptions wins
  EXPECT_THROW(Config::resolve({{"end_deadlocks", "maybe"}}), ConfigError);
}

TEST(Config, StreamGateModes) {
  EXPECT_EQ(Config::resolve().streamGate, StreamGateMode::Auto);  // CPU streams yes, CUDA not yet (issue 40)
  EnvGuard on("TORCH_EXT_STREAM_GATE", "on");
  EXPECT_EQ(Config::resolve().streamGate, StreamGateMode::On);
  EXPECT_EQ(Config::resolve({{"stream_gate", "0"}}).streamGate,
            StreamGateMode::Off);  // GuardOptions(stream_gate=False)
  EXPECT_EQ(Config::resolve({{"stream_gate", "1"}}).streamGate, StreamGateMode::On);
  EXPECT_THROW(Config::resolve({{"stream_gate", "cuda"}}), ConfigError);
}

TEST(Config, CallPathModes) {
  EXPECT_EQ(Config::resolve().callPaths, torch_ext::CallPathMode::Auto);  // strict compares them, verify does not
  EnvGuard on("TORCH_EXT_CALL_PATHS", "on");
  EXPECT_EQ(Config::resolve().callPaths, torch_ext::CallPathMode::On);
  EXPECT_EQ(Config::resolve({{"call_paths", "0"}}).callPaths, torch_ext::CallPathMode::Off);
  EXPECT_THROW(Config::resolve({{"call_paths", "sometimes"}}), ConfigError);
}

TEST(Config, EnvironmentAndOverrides) {
  EnvGuard inner("TORCH_EXT_INNER", "cuda:gloo");
  EnvGuard check("TORCH_EXT_CHECK", "STRICT");
  EnvGuard abort("TORCH_EXT_ABORT_AFTER", "2.5");
  Config c = Config::resolve();
  EXPECT_EQ(c.inner.at("cpu"), "gloo");  // partial spec keeps other defaults
  EXPECT_EQ(c.inner.at("cuda"), "gloo");
  EXPECT_EQ(c.check, CheckMode::Strict);
  EXPECT_EQ(c.abortAfter(std::chrono::milliseconds(1)).count(), 2500);
  EXPECT_EQ(c.source.at("check"), "TORCH_EXT_CHECK");
  // An option wins over the environment.
  Config o = Config::resolve({{"check", "off"}});
  EXPECT_EQ(o.check, CheckMode::Off);
  EXPECT_EQ(o.source.at("check"), "GuardOptions(check)");
}

TEST(Config, ErrorsNameVariableValueAndAcceptedValues) {
  {
    EnvGuard e("TORCH_EXT_CHECK", "sometimes");
    std::string msg = errorOf({});
    EXPECT_NE(msg.find("TORCH_EXT_CHECK"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'sometimes'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("off, async, verify, strict"), std::string::npos) << msg;
  }
  {
    EnvGuard e("TORCH_EXT_WARN_AFTER", "-3");
    std::string msg = errorOf({});
    EXPECT_NE(msg.find("TORCH_EXT_WARN_AFTER='-3'"), std::string::npos) << msg;
  }
  {
    EnvGuard e("TORCH_EXT_INNER", "cpu:guard");
    std::string msg = errorOf({});
    EXPECT_NE(msg.find("guard to wrap guard"), std::string::npos) << msg;
  }
  EXPECT_NE(errorOf({{"inner", "cpu-gloo"}}).find("device:backend"), std::string::npos);
  EXPECT_NE(errorOf({{"inner", "cpu:gloo,cpu:mpi"}}).find("twice"), std::string::npos);
  EXPECT_NE(errorOf({{"ledger_size", "3"}}).find("between 16"), std::string::npos);
  EXPECT_NE(errorOf({{"call_sites", "maybe"}}).find("GuardOptions(call_sites)"), std::string::npos);
  EXPECT_NE(errorOf({{"chek", "off"}}).find("no option 'chek'"), std::string::npos);
}

TEST(Config, LibraryPackages) {
  EXPECT_TRUE(torch_ext::Config::resolve({}).libraryPackages.empty());
  auto c = torch_ext::Config::resolve({{"library_packages", " mylab , mylab_utils.trainer,mylab "}});
  EXPECT_EQ(c.libraryPackages, (std::vector<std::string>{"mylab", "mylab_utils.trainer"}));
  EXPECT_NE(c.describe().find("library_packages=mylab,mylab_utils.trainer"), std::string::npos);
  for (const char* bad : {"my-lab", "1lab", "lab..x", "lab.", "a/b"}) {
    const std::string e = errorOf({{"library_packages", bad}});
    EXPECT_NE(e.find("GuardOptions(library_packages)"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("importable package names"), std::string::npos) << bad << ": " << e;
  }
}

TEST(Config, EveryDocumentedOptionParses) {
  for (const auto& d : torch_ext::settings()) {
    EXPECT_TRUE(std::string(d.env).rfind("TORCH_EXT_", 0) == 0) << d.env;
    EXPECT_GT(std::string(d.meaning).size(), 10u) << d.env;
  }
}

TEST(Config, StoreBudgetStretchesTheExchangeOfLargeGroupsOnly) {
  using torch_ext::exchangeIntervalS;
  const auto defaults = torch_ext::Config::resolve({});
  EXPECT_DOUBLE_EQ(defaults.storeBudget, 20000.0);
  // 3 ops per rank per exchange, plus the straggler analyst's read of every
  // status once per 8 exchanges above 64 ranks: 20,000 ops/s keep 1,280 ranks at 0.2 s.
  EXPECT_EQ(torch_ext::stragglerLookEvery(64), 1);
  EXPECT_EQ(torch_ext::stragglerLookEvery(65), 8);
  EXPECT_DOUBLE_EQ(exchangeIntervalS(0.2, 20000, 8), 0.2);
  EXPECT_DOUBLE_EQ(exchangeIntervalS(0.2, 20000, 1280), 0.2);
  EXPECT_GT(exchangeIntervalS(0.2, 20000, 1300), 0.2);
  EXPECT_NEAR(exchangeIntervalS(0.2, 20000, 4096), 0.64, 1e-9);
  EXPECT_NEAR(exchangeIntervalS(0.2, 20000, 16384), 2.56, 1e-9);
  // 0: no budget; a lone rank exchanges nothing to speak of.
  EXPECT_DOUBLE_EQ(exchangeIntervalS(0.2, 0, 16384), 0.2);
  EXPECT_DOUBLE_EQ(exchangeIntervalS(0.2, 20000, 1), 0.2);
  const auto cfg = torch_ext::Config::resolve({{"store_budget", "0"}});
  EXPECT_DOUBLE_EQ(cfg.storeBudget, 0.0);
  EXPECT_NE(cfg.describe().find("store_budget=0"), std::string::npos);
  EXPECT_THROW(torch_ext::Config::resolve({{"store_budget", "-5"}}), torch_ext::ConfigError);
  EXPECT_THROW(torch_ext::Config::resolve({{"store_budget", "lots"}}), torch_ext::ConfigError);
}

TEST(Config, TheSettingsTableDrivesDescriptionAndValues) {
  // Every setting is described and has a typed value, from the one table.
  const auto defaults = torch_ext::Config::resolve({});
  const std::string text = defaults.describe();
  for (const auto& s : torch_ext::settings()) {
    (void)s.get(defaults);
    const bool listed = text.find(std::string(s.option) + "=") != std::string::npos;
    // An empty package list says nothing; everything else is always shown.
    EXPECT_EQ(listed, std::string(s.option) != "library_packages") << s.option << " in: " << text;
  }
  // A given value reaches the typed value the Python dict shows.
  const auto cfg = torch_ext::Config::resolve({{"store_budget", "123"}, {"abort_after", "2.5"}});
  for (const auto& s : torch_ext::settings()) {
    const auto v = s.get(cfg);
    if (std::string(s.option) == "store_budget") EXPECT_EQ(std::get<int64_t>(v), 123);
    if (std::string(s.option) == "abort_after") EXPECT_DOUBLE_EQ(std::get<double>(v), 2.5);
    if (std::string(s.option) == "check") EXPECT_EQ(std::get<std::string>(v), "verify");
  }
  EXPECT_TRUE(std::holds_alternative<std::monostate>(
      std::find_if(torch_ext::settings().begin(), torch_ext::settings().end(), [](const auto& s) {
        return std::string(s.option) == "abort_after";
      })->get(defaults)));
}

TEST(Config, LiveSignalIsReadByNameAndOffTurnsItOff) {
  EXPECT_EQ(Config{}.liveSignal, SIGUSR2);  // on by default
  EXPECT_EQ(torch_ext::detail::parseSignal("SIGUSR2", "v"), SIGUSR2);
  EXPECT_EQ(torch_ext::detail::parseSignal(" usr1 ", "v"), SIGUSR1);
  EXPECT_EQ(torch_ext::detail::parseSignal("SIGRTMIN+3", "v"), SIGRTMIN + 3);
  EXPECT_EQ(torch_ext::detail::parseSignal("off", "v"), 0);
  EXPECT_EQ(torch_ext::detail::signalName(SIGRTMIN + 3), "SIGRTMIN+3");
  EXPECT_EQ(torch_ext::detail::signalName(0), "off");
  try {
    torch_ext::detail::parseSignal("SIGTERM", "TORCH_EXT_LIVE_SIGNAL");
    FAIL() << "SIGTERM accepted";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("TORCH_EXT_LIVE_SIGNAL"), std::string::npos) << msg;
    EXPECT_NE(msg.find("SIGUSR1, SIGUSR2, SIGRTMIN+N"), std::string::npos) << msg;
  }
  EXPECT_THROW(torch_ext::detail::parseSignal("SIGRTMIN+99", "v"), ConfigError);
}

}  // namespace test_config
