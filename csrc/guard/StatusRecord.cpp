#include "guard/StatusRecord.h"

#include "guard/Snapshot.h"  // hex64, parseHex64

#include <sstream>

namespace torch_ext {

namespace {

const char* tag(RankPhase p) {
  switch (p) {
    case RankPhase::Running:
      return "run";
    case RankPhase::Left:
      return "left";
    case RankPhase::Exited:
      return "exit";
  }
  return "?";
}

} // namespace

const char* rankPhaseName(RankPhase p) {
  switch (p) {
    case RankPhase::Running:
      return "running";
    case RankPhase::Left:
      return "left";
    case RankPhase::Exited:
      return "exited";
  }
  return "?";
}

StatusRecord StatusRecord::of(RankPhase phase, int64_t nowNs, const Progress& p) {
  StatusRecord s;
  s.phase = phase;
  s.heartbeatNs = nowNs;
  s.lastSeq = p.lastSeq;
  s.rolling = p.rolling;
  s.lastCompletedSeq = p.lastCompletedSeq;
  return s;
}

std::string StatusRecord::encode() const {
  std::ostringstream os;
  os << "v2 " << tag(phase) << " " << heartbeatNs << " " << lastSeq << " " << hex64(rolling) << " "
     << lastCompletedSeq;
  return os.str();
}

std::optional<StatusRecord> StatusRecord::decode(const std::string& text) {
  std::istringstream is(text);
  std::string version, phase, rolling;
  StatusRecord s;
  is >> version >> phase >> s.heartbeatNs >> s.lastSeq >> rolling >> s.lastCompletedSeq;
  if (!is || version != "v2") return std::nullopt;
  std::string rest;
  if (is >> rest) return std::nullopt;  // trailing garbage
  if (phase == "run") {
    s.phase = RankPhase::Running;
  } else if (phase == "left") {
    s.phase = RankPhase::Left;
  } else if (phase == "exit") {
    s.phase = RankPhase::Exited;
  } else {
    return std::nullopt;
  }
  try {
    s.rolling = parseHex64(rolling, "status rolling hash");
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return s;
}

} // namespace torch_ext
