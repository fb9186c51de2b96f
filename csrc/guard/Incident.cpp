#include "guard/Incident.h"

namespace torch_ext {

const char* incidentKindName(IncidentKind k) {
  switch (k) {
    case IncidentKind::Hang:
      return "hang";
    case IncidentKind::Abort:
      return "abort";
    case IncidentKind::Mismatch:
      return "mismatch";
    case IncidentKind::P2P:
      return "p2p";
    case IncidentKind::Failure:
      return "failure";
  }
  return "?";
}

std::optional<IncidentKind> parseIncidentKind(std::string_view name) {
  for (auto k : {IncidentKind::Hang, IncidentKind::Abort, IncidentKind::Mismatch, IncidentKind::P2P,
                 IncidentKind::Failure}) {
    if (name == incidentKindName(k)) return k;
  }
  return std::nullopt;
}

std::optional<Incident> Incident::fromId(const std::string& id) {
  const auto colon = id.find(':');
  if (colon == std::string::npos) return std::nullopt;
  auto kind = parseIncidentKind(std::string_view(id).substr(0, colon));
  if (!kind) return std::nullopt;
  Incident inc;
  inc.kind = *kind;
  inc.subject = id.substr(colon + 1);
  return inc;
}

} // namespace torch_ext
