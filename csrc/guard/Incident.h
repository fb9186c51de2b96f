#pragma once

// Incident: a typed cross-rank question about one group, raised by a rank's
// watchdog (a deadline passed, hashes differ, an inner op failed) and answered
// by every rank of the group (IncidentProtocol). Its id, "<kind>:<subject>",
// names its keys in the store, so every rank derives the same id.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace torch_ext {

enum class IncidentKind : uint8_t {
  Hang,      // an op waited past warn_after: report, training goes on
  Abort,     // an op waited past abort_after: report and fail the group
  Mismatch,  // rolling hashes (or all-to-all pairing sums) differ
  P2P,       // a send/recv waited long: check whether it can pair
  Failure,   // the inner backend failed an op (a peer died?)
};

const char* incidentKindName(IncidentKind k);
std::optional<IncidentKind> parseIncidentKind(std::string_view name);

struct Incident {
  IncidentKind kind = IncidentKind::Hang;
  std::string subject;  // collective seq ("57"), p2p record ("p2p-<group rank>-<record id>"), or "any"
  int64_t poster = -1;  // group rank that raised it
  std::string error;    // Failure: the inner backend's error

  std::string id() const {
    return std::string(incidentKindName(kind)) + ":" + subject;
  }
  // Parses an id back (kind and subject); nullopt if malformed.
  static std::optional<Incident> fromId(const std::string& id);

  // Subjects.
  static std::string collective(uint64_t seq) {
    return std::to_string(seq);
  }
  static std::string p2p(int groupRank, uint64_t recordId) {
    return "p2p-" + std::to_string(groupRank) + "-" + std::to_string(recordId);
  }
};

} // namespace torch_ext
