#pragma once

// StoreKeys: every key the guard uses in a group's store, in one place, with
// who writes, reads and deletes it. All live under "guard/" in the group's
// prefix (GroupStore adds it), so they never meet torch's own keys. Nothing
// else in csrc spells a key.
//
// Lifetime rule: a key lives until the last rank leaves the group, which
// deletes every key the group wrote (Watchdog::leaveGroup, through
// IncidentProtocol::incidentKeys for the incident keys), or until its one
// reader has read it (strict and p2p keys).

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace torch_ext::keys {

// Added by GroupStore to every key below; Watchdog::announce writes the first
// status before any GroupStore exists, so it adds it itself.
inline constexpr const char* kPrefix = "guard/";

// st/<rank>: the rank's StatusRecord. Written by that rank (its exchange, at
// announce, leave and exit), read by its ring neighbours each exchange and by
// an incident's analyst; deleted by the last rank to leave.
inline std::string status(int groupRank) {
  return "st/" + std::to_string(groupRank);
}

// join/<rank>: the rank's JoinRecord (store/JoinHandshake.h), written when the
// rank starts creating the group; read by group rank 0 (and, to name the
// ranks missing, by a rank whose join_timeout passed). join/verdict: the
// JoinVerdict, set once
// (compare_set) by whoever concludes first (rank 0 having read every record,
// or a rank whose join_timeout passed), read by every rank. All deleted by the
// last rank to leave; a group that failed to join leaves them (no rank
// leaves it), a few hundred bytes per rank.
inline std::string joinRecord(int groupRank) {
  return "join/" + std::to_string(groupRank);
}
// join/claim/<rank>: how many processes claimed group rank <rank> (add 1
// each). The first writes join/<rank>; a second one (processes that asked
// new_group for different lists and got one group name) writes its record
// under join/<rank>/<n> and fails the group, naming both, in the verdict and
// in the group's alerts (kJoinRefused). Deleted with the records.
inline std::string joinClaim(int groupRank) {
  return "join/claim/" + std::to_string(groupRank);
}
inline std::string joinRecord(int groupRank, int64_t claim) {
  return claim <= 1 ? joinRecord(groupRank) : joinRecord(groupRank) + "/" + std::to_string(claim);
}
inline constexpr const char* kJoinVerdict = "join/verdict";
// join/seen: how many processes read a failure of the group's creation (add
// 1 each: a failing verdict, a refusal, its alert). Group rank 0 (under plain
// env:// its process hosts the store) and a process that refused the group
// wait, a few seconds at most, until every process that claimed a rank has,
// so that their exit does not take the failure from the others.
inline constexpr const char* kJoinSeen = "join/seen";

// Not the guard's: what torch's ProcessGroupGloo writes at the store prefix a
// backend is given ("<context>/<rank>", context 0 first), read (never
// written) by the join handshake to tell a rank that created a plain gloo
// group where the others created the guard. Outside "guard/".
inline std::string glooRendezvous(int groupRank) {
  return "0/" + std::to_string(groupRank);
}

// leave: how many ranks have left the group (add 1 each). The rank that
// brings it to the group's size deletes every key, this one included.
inline constexpr const char* kLeave = "leave";

// alerts: the count of incidents raised on the group (add 1 each); read (add
// 0) by every rank each exchange to find new incidents; deleted at leave.
inline constexpr const char* kAlerts = "alerts";

// alert/<k>: the k-th incident, an AlertRecord. Written by its poster, read
// by every rank once; deleted at leave.
inline std::string alert(int64_t k) {
  return "alert/" + std::to_string(k);
}

// alert/<k>'s value, "<incident id>\n<poster>\n<body>": the body is the
// error of an incident raised with one (else ""), or a live request's ranks.
// The one encoder and decoder (the live asker in Python uses them through _C).
struct AlertRecord {
  std::string id;
  int64_t poster = -1;  // the posting rank; -1: a live asker outside the job
  std::string body;

  std::string encode() const {
    return id + "\n" + std::to_string(poster) + "\n" + body;
  }
  static std::optional<AlertRecord> decode(const std::string& value) {
    const auto nl1 = value.find('\n');
    const auto nl2 = nl1 == std::string::npos ? std::string::npos : value.find('\n', nl1 + 1);
    if (nl2 == std::string::npos) return std::nullopt;
    char* end = nullptr;
    const std::string poster = value.substr(nl1 + 1, nl2 - nl1 - 1);
    const long long p = std::strtoll(poster.c_str(), &end, 10);
    if (poster.empty() || *end != '\0') return std::nullopt;
    return AlertRecord{value.substr(0, nl1), static_cast<int64_t>(p), value.substr(nl2 + 1)};
  }
};

// An alert with this id ends the group on every rank that reads it with
// GroupJoinError, the body its text: the group's creation was refused after
// some ranks had concluded it (a second claim of a group rank, or a rank
// whose member list differs from the verdict's). No analyst, no verdict.
inline constexpr const char* kJoinRefused = "join-refused";

// once/<incident id>: compare-set by the rank that raises an incident or
// publishes a verdict first; the others see they lost. Deleted at leave.
inline std::string once(const std::string& incidentId) {
  return "once/" + incidentId;
}

// A live report (`torch-ext-diagnose live`, torch_ext.live_report()) rides on
// the alerts above, so a job nobody asks costs no store operation: the asker
// (any store client, the CLI's included) adds 1 to alerts and writes
// alert/<k> = "live:<token>\n-1\n<ranks>" (<ranks>: "" for every rank, or
// "0-7,12"). Every rank asked sees it at its next exchange and answers under
// snap/live:<token>/<rank> with its process-wide snapshot;
// no analyst, no verdict, no once/ key. The asker reads and deletes the
// snapshots; leave deletes what is left, like any incident's keys.
inline constexpr const char* kLiveRequestPrefix = "live:";
inline bool isLiveRequest(const std::string& id) {
  return id.rfind(kLiveRequestPrefix, 0) == 0;
}

// A live request's ranks: "" for every rank, else comma-separated global ranks
// and inclusive ranges ("0-3,7"). rankSpec writes it, specAsks reads it.
inline std::string rankSpec(std::vector<int64_t> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(ranks[i]) + (i == j ? "" : "-" + std::to_string(ranks[j]));
    i = j + 1;
  }
  return out;
}
inline bool specAsks(const std::string& spec, int64_t globalRank) {
  if (spec.find_first_not_of(" \n") == std::string::npos) return true;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    const std::string part = spec.substr(pos, comma - pos);
    const size_t dash = part.find('-');
    char* end = nullptr;
    const long long lo = std::strtoll(part.c_str(), &end, 10);
    const long long hi = dash == std::string::npos ? lo : std::strtoll(part.c_str() + dash + 1, nullptr, 10);
    if (end != part.c_str() && globalRank >= lo && globalRank <= hi) return true;
    pos = comma + 1;
  }
  return false;
}

// torch_ext/live (outside every prefix, in the base store: the one at
// MASTER_ADDR:MASTER_PORT or torchrun's endpoint): where a live asker finds
// the default group, as JSON {"version", "prefix" (the full key prefix of the
// group's guard/ keys), "size", "group"}. Written once by the default group's
// rank 0 when the group is created (a later job on the same store overwrites
// it); never deleted (a few bytes; a store outlives no job).
inline constexpr const char* kLiveDirectory = "torch_ext/live";

// report/<incident id>: the verdict (Verdict JSON). Written by the analyst (or
// a rank that knew it first), read by every rank; deleted at leave.
inline std::string report(const std::string& incidentId) {
  return "report/" + incidentId;
}

// snap/<incident id>/<rank>: a rank's snapshot for an incident (RankSnapshot
// JSON). Written by every rank that answers, read by the analyst; deleted at
// leave.
inline std::string snapshot(const std::string& incidentId, int groupRank) {
  return "snap/" + incidentId + "/" + std::to_string(groupRank);
}

// last/<rank>: a rank's last words (RankSnapshot JSON of this group), written
// by that rank while something terminates its process (TerminateHandler: gloo's
// abort on a byte-count difference), read by an analyst for a rank that did
// not answer; deleted by the last rank to leave.
inline std::string lastWords(int groupRank) {
  return "last/" + std::to_string(groupRank);
}
// strict/<seq>/<rank>: a rank's fingerprint for strict check #seq, when the
// check found a difference. Written by every rank, read by every rank;
// strict/<seq>/done counts the readers, and the last one deletes them all.
inline std::string strictPrint(uint64_t seq, int groupRank) {
  return "strict/" + std::to_string(seq) + "/" + std::to_string(groupRank);
}
inline std::string strictDone(uint64_t seq) {
  return "strict/" + std::to_string(seq) + "/done";
}

// p2p/<src>/<dst>/<tag>/<ordinal>: the sender's print of its ordinal-th send
// to dst with this tag, in strict mode. Written by the sender, read and
// deleted by the receiver.
inline std::string p2pPrint(int src, int dst, int tag, uint64_t ordinal) {
  return "p2p/" + std::to_string(src) + "/" + std::to_string(dst) + "/" + std::to_string(tag) + "/" +
         std::to_string(ordinal);
}

// epochs/<loop>/<epoch>/<rank>: a rank's record of one epoch of a DataLoader
// loop ("<batches> <last collective>"; torch_ext/epochs.py, uneven data), the
// loop named by its call site's CRC-32 in 8 hex digits. Written by that rank
// (the default group's) when the loop begins its next epoch. The rank that
// finds every rank's record and brings epochs/<loop>/<epoch>/claim to 1 (add
// 1) reads and compares them, then deletes them and the previous epoch's
// claim (every rank's records of this epoch mean every rank is past that one).
// epochs/<loop>/warned: add 1 by the rank that warns; the first warns. Python
// spells them through _C (bindings.cpp), with kPrefix. Outside the lifetime
// rule above: a loop's last claim and its warned key outlive the group (two
// keys per loop; a store outlives no job).
inline std::string epochRecord(const std::string& loop, int64_t epoch, int groupRank) {
  return "epochs/" + loop + "/" + std::to_string(epoch) + "/" + std::to_string(groupRank);
}
inline std::string epochClaim(const std::string& loop, int64_t epoch) {
  return "epochs/" + loop + "/" + std::to_string(epoch) + "/claim";
}
inline std::string epochWarned(const std::string& loop) {
  return "epochs/" + loop + "/warned";
}

// stragglers: the straggler analysis of the group (JSON, what
// torch_ext.stragglers() returns). Written by group rank 0, the analyst, when
// whom it names changes and at most every 10 s otherwise; read on demand by
// any rank that asks; deleted at leave.
inline constexpr const char* kStragglers = "stragglers";

// waits/<global rank>: JOB-WIDE (in the store under every group's prefix, so
// the one key of this file outside the lifetime rule above): the rank's
// positions in all its groups (PublishedWaits), written by that rank each time
// it answers an incident on any group; read by the analyst of another group
// that follows a wait out of its own (a deadlock over pairwise groups, a mesh,
// pipeline stages). One per rank, overwritten, never deleted: a reader ignores
// a record older than the incident it analyses.
inline std::string waits(int64_t globalRank) {
  return "waits/" + std::to_string(globalRank);
}

}  // namespace torch_ext::keys
