#include "nccl_sim/NcclSimSettings.h"

#include "guard/Config.h"

#include <cstdlib>
#include <string>

namespace torch_ext {

namespace {

NcclSimSettings::Fault parseSimFault(const char* var, const char* unit, int64_t lo) {
  NcclSimSettings::Fault f;
  const char* env = std::getenv(var);
  if (env == nullptr || *env == '\0') return f;
  const std::string text(env);
  const auto colon = text.find(':');
  const std::string what = std::string(var) + "='" + text + "'";
  if (colon == std::string::npos) {
    throw ConfigError(what + " must be RANK:" + unit + " (e.g. " + var + "=1:5)");
  }
  f.rank = detail::parseInt(text.substr(0, colon), what + " (rank)", 0, 1 << 24);
  f.value = detail::parseInt(text.substr(colon + 1), what + " (" + unit + ")", lo, int64_t(1) << 40);
  return f;
}

}  // namespace

NcclSimSettings NcclSimSettings::fromEnv() {
  NcclSimSettings s;
  s.stall = parseSimFault("TORCH_EXT_NCCL_SIM_STALL", "N", 1);
  s.fail = parseSimFault("TORCH_EXT_NCCL_SIM_FAIL", "N", 1);
  s.slow = parseSimFault("TORCH_EXT_NCCL_SIM_SLOW", "MS", 0);
  if (const char* env = std::getenv("TORCH_EXT_NCCL_SIM_QUEUE"); env != nullptr && *env != '\0') {
    s.queueDepth = detail::parseInt(env, std::string("TORCH_EXT_NCCL_SIM_QUEUE='") + env + "'", 1, 1 << 20);
  }
  if (const char* env = std::getenv("TORCH_EXT_NCCL_SIM_WAIT"); env != nullptr && *env != '\0') {
    const std::string v = env;
    if (v != "stream" && v != "data") {
      throw ConfigError("TORCH_EXT_NCCL_SIM_WAIT='" + v +
                        "': expected 'stream' (wait() returns at once, as on NCCL) "
                        "or 'data' (wait() blocks until the result is there)");
    }
    s.waitForData = v == "data";
  }
  return s;
}

}  // namespace torch_ext
