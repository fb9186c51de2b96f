#include "guard/report/Progress.h"

#include "guard/report/Messages.h"

#include <cstdio>

namespace torch_ext {

namespace {

// "1.2 GB", "340 MB", "12 kB": storage I/O as a report says it.
std::string bytesText(int64_t n) {
  char buf[32];
  if (n >= 1'000'000'000) {
    std::snprintf(buf, sizeof(buf), "%.1f GB", static_cast<double>(n) / 1e9);
  } else if (n >= 1'000'000) {
    std::snprintf(buf, sizeof(buf), "%.0f MB", static_cast<double>(n) / 1e6);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f kB", static_cast<double>(n) / 1e3);
  }
  return buf;
}

}  // namespace

std::string describeProgress(const ProgressFacts& p) {
  if (!p.known || p.windowNs <= 0) return "";
  const bool io = p.ioBytes > 0;
  if (p.busy) {
    std::string out = "busy, not hung: in the last " + messages::seconds(p.windowNs) + " its main thread ran " +
                      messages::seconds(p.cpuNs) + " of CPU";
    if (io) out += " and moved " + bytesText(p.ioBytes) + " to and from storage";
    return out;
  }
  return "not progressing for " + messages::seconds(p.quietNs) + ": its main thread idle" +
         (p.ioBytes < 0 ? std::string(" (storage I/O not known)") : std::string(", no storage I/O"));
}

}  // namespace torch_ext
