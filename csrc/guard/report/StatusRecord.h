#pragma once

// StatusRecord: what each rank publishes about itself under guard/st/<rank>
// (its heartbeat and progress on the group), and the encoding of that record.
//
// The phase says how a rank stopped publishing, so a report can use the right
// words: a rank that called destroy_process_group() "left", a rank whose
// process ended without it (an uncaught exception, sys.exit, the end of the
// script) "exited", and a rank with neither is "gone or frozen" once its
// heartbeat is old.

#include "guard/report/EnumNames.h"

#include <cstdint>
#include <optional>
#include <string>

namespace torch_ext {

enum class RankPhase : uint8_t {
  Running,  // publishing heartbeats
  Left,     // destroy_process_group() on this group
  Exited,   // the process ended without destroying the group
};
template <>
struct EnumTable<RankPhase> {
  static constexpr NamedValue<RankPhase> kEntries[] = {
      {RankPhase::Running, "running"},
      {RankPhase::Left, "left"},
      {RankPhase::Exited, "exited"},
  };
};
inline const char* rankPhaseName(RankPhase p) {
  return enumName(p);
}

// How far a rank has got on a group: the part of its progress that its status
// record carries (the ledger's Progress extends it).
struct SeqProgress {
  uint64_t lastSeq = 0;  // last issued collective seq
  uint64_t rolling = 0;  // rolling hash at lastSeq
  uint64_t lastCompletedSeq = 0;
};

struct StatusRecord {
  RankPhase phase = RankPhase::Running;
  int64_t heartbeatNs = 0;  // wall clock when published
  uint64_t lastSeq = 0;     // last collective issued
  uint64_t rolling = 0;     // rolling hash at lastSeq
  uint64_t lastCompletedSeq = 0;
  // Milliseconds since the rank's process last showed progress (its main
  // thread ran or it moved storage bytes: report/Progress.h); 0 while it
  // does, -1 when not known. What a collective waiting for it past
  // abort_after reads (watchdog/BusyWait.h).
  int64_t quietMs = -1;
  // The rank's collective waits (RankWaits::encode), for the straggler
  // analysis; empty when it has none to say.
  std::string waits;

  static StatusRecord of(RankPhase phase, int64_t nowNs, const SeqProgress& p);
  // "v2 run <heartbeat ns> <last seq> <rolling hex> <last completed seq>", then
  // " q <quiet ms>" when known, then " w <waits>" when it has waits.
  std::string encode() const;
  // nullopt for anything that is not a v2 record.
  static std::optional<StatusRecord> decode(const std::string& text);
  // Equal but for the heartbeat: nothing new to publish but the heartbeat.
  bool sameProgress(const StatusRecord& o) const {
    return phase == o.phase && lastSeq == o.lastSeq && rolling == o.rolling && lastCompletedSeq == o.lastCompletedSeq;
  }
};

// What this rank last read of a peer's status, and when (steady clock).
struct PeerState {
  StatusRecord status;
  int64_t readAtSteadyNs = 0;
};

}  // namespace torch_ext
