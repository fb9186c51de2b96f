#pragma once

// JoinHandshake: what the ranks of a guard group agree on before the group
// exists (issue 57). Every rank's guard is created by torch for the same group
// (init_process_group, new_group, a DeviceMesh's dimensions); before the
// inner backends rendezvous (which wait up to the group's timeout for every
// rank: 30 min on gloo), each rank publishes a JoinRecord, and group rank 0
// concludes once it has every record:
//  - the job-wide settings (Config's SettingScope::Job) are rank 0's: a rank
//    whose own value differed adopts rank 0's and logs once which value it
//    runs with and where its own came from (a setting that reached one node
//    only, a per-node env file: before, check=strict against verify hung in
//    the first collective, off against verify too);
//  - ranks whose join protocols differ cannot work together: the group fails
//    at creation on every rank, naming each rank's versions;
//  - a rank that does not join within join_timeout fails the group on every
//    rank that did, naming it and what is known of it: it created a plain
//    gloo group there (read in gloo's own rendezvous key: at once, not at the
//    timeout), it announced a guard without the handshake (an older
//    torch_ext), or nothing (still starting, stuck before the group, dead);
//  - the members: every record carries the process's global rank and the
//    member list it asked for. torch names a group by a counter, so processes
//    that called new_group with different lists (each node creating a group of
//    its own ranks) get one name, one store prefix and the same group ranks:
//    two processes then claim one group rank (store.add on join/claim/<rank>),
//    and the second fails the group naming both lists, also for ranks that
//    concluded before it came (through the group's alerts, which their
//    watchdogs read: GroupJoinError within an exchange); lists that differ
//    without a double claim fail at rank 0's conclusion, and a rank whose own
//    list differs from the verdict's fails itself the same way.
// The verdict is set once (compare_set): by rank 0, or by a rank whose own
// join_timeout passed first, so that no rank proceeds into the inner
// rendezvous while another has given up.
//
// Cost: each rank writes its record, then asks whether the verdict key is
// there (store.check), pacing its asks at a tenth of the time waited so far
// (1 ms to 250 ms) (a store.wait that times out makes the TCPStore client log
// c10d warnings); rank 0 asks after every record the same way and reads them
// with one multi_get. O(1) store operations per rank for a join whose ranks
// start together, 4 a second while a late rank is awaited, and O(W) bytes on
// rank 0, beside the inner rendezvous's O(W) gets per rank
// (docs/performance.md, "Group creation").

#include "guard/Config.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torch_ext {

// Bumped whenever what ranks exchange about a group changes shape (records,
// check words, status records): ranks whose versions differ fail at creation.
// 3: between two ranks a 4-byte element is packed with its check (InBandCheck::packs).
// 4: records carry the rank's global rank and the members it asked for (claims).
inline constexpr int kJoinProtocol = 4;

// What one rank says when it joins: who it is, what it runs, and its job-wide
// settings (option -> Setting::show, exact and parseable) with their sources.
struct JoinRecord {
  int protocol = kJoinProtocol;
  std::string torchExt;  // torch_ext's version
  std::string torch;     // torch's version
  std::string host;
  int64_t pid = 0;
  int64_t globalRank = -1;       // this process's rank in the job
  std::vector<int64_t> members;  // the global ranks it asked the group to have, in group-rank order
  std::map<std::string, std::string> settings;
  std::map<std::string, std::string> sources;  // option -> "TORCH_EXT_CHECK", "GuardOptions(check)", "default"

  // This process's record for `cfg` (its job-wide settings and where each came from).
  static JoinRecord of(const Config& cfg, std::string torchExt, std::string torch, std::string host, int64_t pid);
  std::string encode() const;
  static std::optional<JoinRecord> decode(const std::string& text);
};

// What the ranks concluded: the group's job-wide settings (rank 0's), or why
// it cannot start (the GroupJoinError's text).
struct JoinVerdict {
  bool ok = false;
  std::string error;
  std::vector<int64_t> members;  // ok: the group's members (rank 0's list)
  std::map<std::string, std::string> settings;
  std::map<std::string, std::string> sources;

  std::string encode() const;
  static std::optional<JoinVerdict> decode(const std::string& text);
};

// What joining means for this rank: the job-wide settings it adopts from rank
// 0 (option -> value, to re-resolve its Config with), and one line to log per
// setting it adopted.
struct JoinResult {
  std::map<std::string, std::string> adopt;
  std::vector<std::string> notes;
};

struct JoinContext {
  std::string group;  // the group's name, for messages
  int rank = 0;       // group rank
  int size = 1;
  std::chrono::milliseconds warnAfter{10000};  // when a wait for ranks is logged
  std::chrono::milliseconds timeout{300000};   // join_timeout
};

class JoinHandshake {
 public:
  // Joins the group on `store` (the group's backend store, torch's prefix):
  // blocks until the verdict, at most ctx.timeout (and a few seconds, so that
  // rank 0's verdict normally comes first). Throws GroupJoinError when the
  // group cannot start; the store's own errors (gone, refused) become one too.
  static JoinResult join(c10d::Store& store, const JoinContext& ctx, const JoinRecord& mine);

  // Pure, for tests: rank 0's verdict from every rank's record (in rank order;
  // none missing), and what a rank with record `mine` makes of a verdict.
  static JoinVerdict conclude(const JoinContext& ctx, const std::vector<JoinRecord>& records);
  static JoinResult apply(const JoinContext& ctx, const JoinRecord& mine, const JoinVerdict& verdict);
  // Why the group cannot start without `missing` ranks: one line each from
  // what is known of them ("gloo": a plain gloo group; "guard": a guard
  // without the handshake; "": nothing).
  struct Missing {
    int rank;
    std::string known;
  };
  static std::string missingText(const JoinContext& ctx, const std::vector<Missing>& missing, double waitedS);
  // The ranks of a group being created (`size` ranks, `store` at its prefix)
  // that created a plain gloo group there instead of joining: their gloo
  // rendezvous key is present, their join record is not (issue 68: the guard
  // ranks that refuse the group complete that rendezvous, so such a rank ends
  // at its first collective instead of waiting out gloo's timeout).
  static std::vector<int> plainGlooRanks(c10d::Store& store, int size);
  // Why the group cannot start when its processes asked for different member
  // lists: one line per list with the processes that asked for it. `claimed`:
  // the group rank two processes claimed (-1: none known).
  static std::string membersText(const JoinContext& ctx, const std::vector<JoinRecord>& records, int claimed);

  // How long group rank 0 waits for the joined ranks to have read a verdict
  // that fails the group before it raises (holdUntilSeen).
  static constexpr std::chrono::milliseconds kSeenWithin{5000};

 private:
  // The group failed: this process says it read it (join/seen); with `hold`
  // (group rank 0, whose process hosts the store under plain env://, and a
  // process that refused the group) it waits, at most kSeenWithin, for every
  // process that claimed a rank to say so, so that its exit does not leave
  // them with "the store failed" instead of the verdict.
  static void holdUntilSeen(c10d::Store& store, const JoinContext& ctx, bool hold);
  // Why this process cannot be in the group it asked for (membersText), or
  // "": it claimed a group rank another process holds (claim > 1), or its
  // member list differs from the concluded verdict's.
  static std::string refusal(c10d::Store& store, const JoinContext& ctx, const JoinRecord& mine, int64_t claim,
                             const JoinVerdict& verdict);
  // Ends the group on the ranks that concluded it (the group's alerts), waits
  // for the others to have read it (holdUntilSeen) and throws GroupJoinError.
  [[noreturn]] static void refuseAndThrow(c10d::Store& store, const JoinContext& ctx, const std::string& why);
  // Waits for the group's verdict: rank 0 concludes from every record, the
  // others read it; a rank missing (found, or past join_timeout) fails it.
  static JoinVerdict awaitVerdict(c10d::Store& store, const JoinContext& ctx);
};

}  // namespace torch_ext
