#pragma once

// WaitGraph: waits across process groups. Each rank knows, for each of its
// groups, how far it got (the last collective it issued) and what it waits in
// (the oldest pending operation). Put together, those positions say who waits
// for whom across groups: a rank waiting in collective #s of group G waits for
// every member of G that has not issued #s. When those edges close a cycle the
// ranks are deadlocked (torchrec#4149: two groups over the same ranks, issued
// in a different order on different ranks); otherwise following them from a
// stuck collective ends at the rank everything waits for.
//
// Python-free and store-free: the positions come from the snapshots ranks
// exchange during an incident (RankSnapshot::waits) or from dump files.

#include "guard/report/EnumNames.h"
#include "guard/report/Json.h"

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torch_ext {

// One rank's position in one of its groups.
struct GroupWait {
  std::string group;           // group name (the key)
  std::string label;           // what reports call it (its group_desc, else its name)
  std::vector<int64_t> ranks;  // global ranks of the group, in group-rank order
  uint64_t lastSeq = 0;        // the last collective this rank issued on it
  // The oldest pending operation, if any; else a last collective that failed
  // (where the rank stood, for the dumps written after a failure).
  bool pending = false;
  uint64_t seq = 0;     // its collective seq (0: a send/recv)
  std::string op;       // "all_reduce(float32[4], SUM)"
  std::string where;    // call site
  int64_t startNs = 0;  // wall clock when it was issued
  // A pending send/recv (seq 0): its peer (global rank; -1: any source or
  // unknown), its direction and tag. A recv waits for its peer's send, a send
  // for its peer's recv, unless the peer waits in that counterpart already.
  int64_t peer = -1;
  bool recv = false;
  int32_t tag = 0;
  // A host thread of the rank blocks in this very operation (no deadline),
  // which cannot finish before the ranks it waits for have issued it (not a
  // send, a broadcast's root, ...: Fingerprint::mayFinishAlone). Such a rank
  // issues nothing more until they do: a cycle of such waits is certain.
  bool blocked = false;

  bool waitsInCollective() const {
    return pending && seq > 0;
  }
  bool waitsInP2P() const {
    return pending && seq == 0 && peer >= 0;
  }
  // Waits in an operation another rank must join (a collective or a send/recv).
  bool waits() const {
    return waitsInCollective() || waitsInP2P();
  }
};

Json toJson(const GroupWait& w);
GroupWait groupWaitFromJson(const Json& j);

// A rank's positions in all its groups as it published them job-wide (when it
// answered an incident), so that an analyst of another group can follow a
// wait out of its own group live. `timeNs`: when they were published.
struct PublishedWaits {
  int64_t timeNs = 0;
  std::vector<GroupWait> waits;
};
std::string encodePublishedWaits(const PublishedWaits& p);
// nullopt for text that is not such a record.
std::optional<PublishedWaits> decodePublishedWaits(const std::string& text);

// What the edges from a stuck collective form.
enum class WaitShape : uint8_t {
  None,   // no rank it waits for waits in another guarded collective
  Chain,  // it waits for a rank that waits in another group's collective, ... ending at a rank that waits in none
  Cycle,  // the waits close a loop: a deadlock across groups
};

template <>
struct EnumTable<WaitShape> {
  static constexpr NamedValue<WaitShape> kEntries[] = {
      {WaitShape::None, "none"},
      {WaitShape::Chain, "chain"},
      {WaitShape::Cycle, "cycle"},
  };
};

// Where ranks wait: one collective of one group, the ranks waiting in it and
// the ranks it waits for (members that have not issued it); or one rank's
// send/recv (seq 0), waiting for its peer.
struct WaitSite {
  std::string group;
  std::string label;
  uint64_t seq = 0;   // 0: a send/recv
  int64_t peer = -1;  // send/recv: the peer (global rank)
  bool recv = false;  // send/recv: a receive
  std::string op;
  std::string where;
  int64_t startNs = 0;            // the earliest issue among its waiters
  std::vector<int64_t> waiters;   // sorted
  std::vector<int64_t> waitsFor;  // sorted: members not known to have issued it
  std::vector<int64_t> members;   // the group's ranks

  bool p2p() const {
    return seq == 0;
  }
  // "collective #3 all_reduce(float32[4], SUM)" or "recv(float32[3], src=0, tag=0) from rank 2".
  std::string what() const;
};

// "deadlock across groups dp and mp" for the labels of the groups on a cycle.
std::string deadlockHeadline(const std::vector<std::string>& groups);

Json toJson(const WaitSite& s);
WaitSite waitSiteFromJson(const Json& j);

struct WaitFinding {
  WaitShape shape = WaitShape::None;
  // Cycle: the sites on the loop, each waiting for ranks waiting in the next
  // (the last in the first). Chain: the sites from the stuck collective on.
  std::vector<WaitSite> sites;
  // Chain: the ranks at its end (waiting in no guarded collective, or not
  // known to this view). Empty for a cycle.
  std::vector<int64_t> end;
  // ... of which these are not known to this view (no snapshot or dump of them).
  std::vector<int64_t> endUnknown;
  // Cycle: the labels of the groups on it, sorted and distinct.
  std::vector<std::string> groups;
  // Cycle: the ranks that wait for each other (a strongly connected part of
  // the waits: every one of them waits, directly or not, for every other).
  std::vector<int64_t> loop;
  // Cycle: every rank of the loop blocks in its wait there (GroupWait::blocked),
  // so none of them can issue what another waits for: the deadlock is certain
  // and waiting longer cannot resolve it. Otherwise a rank of the loop only has
  // the operation pending (async_op=True, DDP's buckets, a stream) and may
  // still issue what the others wait for.
  bool certain = false;
  // Cycle, not certain: the ranks of the loop not known to block in their wait.
  std::vector<int64_t> unblocked;
  // Cycle: the group (name) whose report logs it: the lowest-named group on
  // it that holds every rank of the loop, so its analyst saw them all and
  // finds the same loop; when no group holds them all, the lowest-named group
  // on it (its analyst follows the waits through published positions).
  std::string owner;

  // "dp and mp", "dp, mp and pp".
  std::string groupList() const;
  // The first-line phrase: "deadlock across groups dp and mp" (cycle only).
  std::string headline() const;
  // One line per site ("  ranks 1,2 wait in collective #1 ... for rank 0, ...")
  // and, for a chain, the rank everything waits for. `nowNs` times the waits.
  std::string describe(int64_t nowNs) const;
};

class WaitGraph {
 public:
  // A rank whose positions are known (it answered, or its dump was read).
  void addRank(int64_t rank, std::vector<GroupWait> waits);
  // The same without a copy: `waits` must outlive the graph (an analysis
  // over many groups shares each rank's list).
  void addRankRef(int64_t rank, const std::vector<GroupWait>& waits);
  bool knows(int64_t rank) const {
    return ranks_.count(rank) > 0;
  }
  // Where `rank` waits: the newest of its pending collectives and send/recvs
  // (the one its main thread issued last, so most likely blocks in); null when
  // it waits in none, or is not known.
  const GroupWait* waitOf(int64_t rank) const;
  // Whether `rank` is known to have issued collective `seq` of `group`.
  bool issued(int64_t rank, const std::string& group, uint64_t seq) const;
  // The site of `rank`'s wait: the collective and who waits in it, for whom.
  std::optional<WaitSite> siteOf(int64_t rank) const;
  // Follows the waits from collective `seq` of `group`, whose missing ranks
  // are `missing`: a loop reachable from them (the one with the lowest rank
  // when several are), else a chain of two sites or more, else None.
  WaitFinding follow(const std::string& group, uint64_t seq, const std::vector<int64_t>& missing) const;
  // The same from a site already known (a rank's send/recv: siteOf(rank)).
  WaitFinding followFrom(WaitSite start, const std::vector<int64_t>& missing) const;
  // A cycle anywhere in the graph (post-mortem: no stuck collective given).
  WaitFinding anyCycle() const;
  // Those of `ranks` not known to block in their wait (GroupWait::blocked).
  std::vector<int64_t> notBlocked(const std::vector<int64_t>& ranks) const;

 private:
  std::map<int64_t, const std::vector<GroupWait>*> ranks_;
  std::deque<std::vector<GroupWait>> owned_;  // what addRank copied
};

}  // namespace torch_ext
