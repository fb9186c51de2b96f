#include "guard/report/StatusRecord.h"

#include "guard/report/Snapshot.h"  // hex64, parseHex64

#include <sstream>

namespace torch_ext {

namespace {

// The record's own short spelling of each phase ("v2 run ...").
constexpr NamedValue<RankPhase> kPhaseTags[] = {
    {RankPhase::Running, "run"},
    {RankPhase::Left, "left"},
    {RankPhase::Exited, "exit"},
};

}  // namespace

StatusRecord StatusRecord::of(RankPhase phase, int64_t nowNs, const SeqProgress& p) {
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
  os << "v2 " << nameIn(kPhaseTags, phase) << " " << heartbeatNs << " " << lastSeq << " " << hex64(rolling) << " "
     << lastCompletedSeq;
  if (quietMs >= 0) os << " q " << quietMs;
  if (!waits.empty()) os << " w " << waits;
  return os.str();
}

std::optional<StatusRecord> StatusRecord::decode(const std::string& text) {
  std::istringstream is(text);
  std::string version, phase, rolling;
  StatusRecord s;
  is >> version >> phase >> s.heartbeatNs >> s.lastSeq >> rolling >> s.lastCompletedSeq;
  if (!is || version != "v2") return std::nullopt;
  std::string rest;
  if (is >> rest && rest == "q") {
    if (!(is >> s.quietMs) || s.quietMs < 0) return std::nullopt;
    if (!(is >> rest)) rest.clear();
  }
  if (!rest.empty()) {
    if (rest != "w") return std::nullopt;  // trailing garbage
    std::getline(is >> std::ws, s.waits);
    if (s.waits.empty()) return std::nullopt;
  }
  const auto parsedPhase = valueIn(kPhaseTags, phase);
  if (!parsedPhase) return std::nullopt;
  s.phase = *parsedPhase;
  try {
    s.rolling = parseHex64(rolling, "status rolling hash");
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return s;
}

}  // namespace torch_ext
