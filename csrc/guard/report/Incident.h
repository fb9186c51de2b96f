#pragma once

// Incident: a typed cross-rank question about one group, raised by a rank's
// watchdog (a deadline passed, hashes differ, an inner op failed) and answered
// by every rank of the group (IncidentProtocol). Its id, "<kind>:<subject>",
// names its keys in the store, so every rank derives the same id.

#include "guard/report/EnumNames.h"

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

template <>
struct EnumTable<IncidentKind> {
  static constexpr NamedValue<IncidentKind> kEntries[] = {
      {IncidentKind::Hang, "hang"}, {IncidentKind::Abort, "abort"},     {IncidentKind::Mismatch, "mismatch"},
      {IncidentKind::P2P, "p2p"},   {IncidentKind::Failure, "failure"},
  };
};

inline const char* incidentKindName(IncidentKind k) {
  return enumName(k);
}
inline std::optional<IncidentKind> parseIncidentKind(std::string_view name) {
  return enumFromName<IncidentKind>(name);
}

// An abort's body: how its collective had waited on past abort_after while
// the ranks it waited for were busy (watchdog/BusyWait.h), so every rank's
// error says it, not only the poster's.
enum class BusyWaitEnd : uint8_t {
  None,        // it did not wait on
  Stopped,     // a rank it waited for stopped progressing
  CapReached,  // busy to the end: busy_cap passed
};
template <>
struct EnumTable<BusyWaitEnd> {
  static constexpr NamedValue<BusyWaitEnd> kEntries[] = {
      {BusyWaitEnd::None, ""}, {BusyWaitEnd::Stopped, "busy-stopped"}, {BusyWaitEnd::CapReached, "busy-cap"}};
};

// What an incident is about: one collective (by seq), one point-to-point op
// (by the rank that posted it and its record id there), or the group as a
// whole ("any": a mismatch found by comparing histories).
struct IncidentSubject {
  enum class Kind : uint8_t { Any, Collective, P2P };
  Kind kind = Kind::Any;
  uint64_t seq = 0;       // Collective
  int groupRank = -1;     // P2P: the group rank that posted the op
  uint64_t recordId = 0;  // P2P: its record id in that rank's ledger

  static IncidentSubject any() {
    return {};
  }
  static IncidentSubject collective(uint64_t seq) {
    IncidentSubject s;
    s.kind = Kind::Collective;
    s.seq = seq;
    return s;
  }
  static IncidentSubject p2p(int groupRank, uint64_t recordId) {
    IncidentSubject s;
    s.kind = Kind::P2P;
    s.groupRank = groupRank;
    s.recordId = recordId;
    return s;
  }

  // "57", "p2p-<group rank>-<record id>", "any": the subject part of an id.
  std::string encode() const;
  // encode()'s output back; nullopt for anything else.
  static std::optional<IncidentSubject> parse(std::string_view text);
  bool operator==(const IncidentSubject& o) const = default;
};

struct Incident {
  IncidentKind kind = IncidentKind::Hang;
  IncidentSubject subject;
  int64_t poster = -1;  // group rank that raised it
  std::string error;    // Failure: the inner backend's error; Abort: a BusyWaitEnd's name

  std::string id() const {
    return std::string(incidentKindName(kind)) + ":" + subject.encode();
  }
  // Parses an id back (kind and subject); nullopt if malformed.
  static std::optional<Incident> fromId(std::string_view id);
};

}  // namespace torch_ext
