#include "guard/report/Incident.h"

#include <charconv>

namespace torch_ext {

namespace {

// A whole decimal number, nothing before or after it.
template <typename T>
std::optional<T> parseNumber(std::string_view text) {
  T value{};
  const auto* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

constexpr std::string_view kAny = "any";
constexpr std::string_view kP2PPrefix = "p2p-";

}  // namespace

std::string IncidentSubject::encode() const {
  switch (kind) {
    case Kind::Collective:
      return std::to_string(seq);
    case Kind::P2P:
      return std::string(kP2PPrefix) + std::to_string(groupRank) + "-" + std::to_string(recordId);
    case Kind::Any:
      break;
  }
  return std::string(kAny);
}

std::optional<IncidentSubject> IncidentSubject::parse(std::string_view text) {
  if (text == kAny) return any();
  if (text.substr(0, kP2PPrefix.size()) == kP2PPrefix) {
    const auto rest = text.substr(kP2PPrefix.size());
    const auto dash = rest.find('-');
    if (dash == std::string_view::npos) return std::nullopt;
    const auto rank = parseNumber<int>(rest.substr(0, dash));
    const auto record = parseNumber<uint64_t>(rest.substr(dash + 1));
    if (!rank || !record || *rank < 0) return std::nullopt;
    return p2p(*rank, *record);
  }
  const auto seq = parseNumber<uint64_t>(text);
  if (!seq) return std::nullopt;
  return collective(*seq);
}

std::optional<Incident> Incident::fromId(std::string_view id) {
  const auto colon = id.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  const auto kind = parseIncidentKind(id.substr(0, colon));
  const auto subject = IncidentSubject::parse(id.substr(colon + 1));
  if (!kind || !subject) return std::nullopt;
  Incident inc;
  inc.kind = *kind;
  inc.subject = *subject;
  return inc;
}

}  // namespace torch_ext
