#include "guard/report/Report.h"

#include "guard/report/History.h"
#include "guard/report/Messages.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

namespace torch_ext {

namespace {

using messages::seconds;
using messages::secondsBetween;

std::string padRight(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

std::string stackText(const MainThreadStack& st) {
  std::string text = describeStack(st.frames);
  if (!st.note.empty()) text += " [" + st.note + "]";
  return text;
}

// --- metric syncs per rank (Lightning#19106) ----------------------------------
//
// Labels with a "metric" field (ddp_guard's epoch-end syncs, torchmetrics, a
// user's torch_ext.label(..., metric=...)) name what each collective synced. When
// ranks sync different sets of metrics (self.log_dict with keys that differ
// across ranks), the op they wait in says only where the first difference
// surfaced; the run of metric syncs around it says which metrics each rank
// synced and which are missing where.

const std::string* metricOf(const EntryView* e) {
  return e == nullptr ? nullptr : e->label.metric();
}

std::vector<std::string> runAround(const GroupView& g, uint64_t seq, uint64_t upTo) {
  return metricRunAround(seq, g.lastSeq, upTo, [&g](uint64_t s) -> std::optional<std::string> {
    const std::string* m = metricOf(g.bySeq(s));
    return m ? std::optional<std::string>(*m) : std::nullopt;
  });
}

// The lines for the op at `seq`, from the ranks' windows; "" when it is no
// metric sync on any rank.
std::string metricSyncLines(const std::vector<RankInput>& ranks, uint64_t seq) {
  bool subjectIsMetric = false;
  for (const auto& r : ranks) {
    const GroupView* g = r.group();
    if (g && metricOf(g->bySeq(seq)) != nullptr) subjectIsMetric = true;
  }
  if (!subjectIsMetric) return "";
  std::vector<RankMetrics> runs(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    runs[i].globalRank = ranks[i].globalRank;
    if (const GroupView* g = ranks[i].group()) {
      runs[i].known = true;
      runs[i].names = runAround(*g, seq, UINT64_MAX);
    }
  }
  // A rank without a window (ended, gone) that issued collectives up to lastSeq
  // issued the same ones as the ranks with windows (or a mismatch would have
  // been found): read its metric syncs from theirs, up to where it stopped.
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (runs[i].known || !ranks[i].statusKnown || ranks[i].lastSeq >= seq) continue;
    for (const auto& r : ranks) {
      const GroupView* g = r.group();
      if (g == nullptr || g->bySeq(ranks[i].lastSeq) == nullptr) continue;
      runs[i].known = true;
      runs[i].names = runAround(*g, ranks[i].lastSeq, ranks[i].lastSeq);
      runs[i].readFrom = r.globalRank;
      break;
    }
  }
  return formatMetricSyncs(runs);
}

}  // namespace

namespace {

struct Found {
  uint64_t seq = 0;
  std::vector<RankOp> ops;
  std::string note;
};

// Long: the scan, the comparison and the "not reached" notes work on one
// seq-ordered index; kept together so the rule reads as one.
// First collective seq at which responding ranks disagree, within the windows
// they sent. Ranks that have not reached it are listed as such.
std::optional<Found> findCollectiveMismatch(const std::vector<RankInput>& ranks) {
  // Only the seqs some window holds, in order: a dump (edited, or hostile) may
  // hold seqs far apart (up to 2^64 - 1), and walking every seq between the
  // lowest and the highest would never end. Each window indexed by seq once
  // (its first entry of a seq, as GroupView::bySeq).
  std::vector<std::pair<const RankInput*, std::map<uint64_t, const EntryView*>>> windows;
  std::set<uint64_t> seqs;
  for (const auto& r : ranks) {
    const GroupView* g = r.group();
    if (!g) continue;
    std::map<uint64_t, const EntryView*> bySeq;
    for (const auto& e : g->entries) {
      if (e.isP2P) continue;
      bySeq.emplace(e.seq, &e);
      seqs.insert(e.seq);
    }
    windows.emplace_back(&r, std::move(bySeq));
  }
  int groupSize = static_cast<int>(ranks.size());
  for (const uint64_t s : seqs) {
    std::vector<std::pair<const RankInput*, const EntryView*>> seen;
    for (const auto& [r, bySeq] : windows) {
      if (auto it = bySeq.find(s); it != bySeq.end()) seen.emplace_back(r, it->second);
    }
    if (seen.empty() || (seen.size() < 2 && groupSize > 1)) continue;
    std::set<uint64_t> hashes, rollings;
    for (auto& p : seen) {
      hashes.insert(p.second->hash);
      rollings.insert(p.second->rolling);
    }
    std::string note;
    bool bad = hashes.size() > 1;
    const Op op = seen.front().second->op;
    if (!bad && rollings.size() > 1) {
      // Same op at s, different histories: the first difference is older than
      // the windows the ranks sent (only possible at the start of the windows).
      bad = true;
      note = "the ranks' histories already differ before #" + std::to_string(s) +
             ": the first differing collective is no longer in the ledger (raise TORCH_EXT_LEDGER_SIZE)";
    }
    if (!bad && isAllToAll(op) && static_cast<int>(seen.size()) == groupSize) {
      uint64_t send = 0, recv = 0;
      for (auto& p : seen) {
        send += p.second->splitSend;
        recv += p.second->splitRecv;
      }
      if (send != recv) {
        bad = true;
        note = messages::kSplitsDoNotPair;
      }
    }
    if (!bad) continue;
    Found f;
    f.seq = s;
    f.note = note;
    for (const auto& r : ranks) {
      RankOp op;
      op.globalRank = r.globalRank;
      const GroupView* g = r.group();
      const EntryView* e = g ? g->bySeq(s) : nullptr;
      if (e) {
        op.text = e->text;
        op.where = e->where();
        op.caller = describeCaller(e->frames);
        if (r.lastWords) op.where += " (" + lastWordsNote(r) + ": from its last words)";
        op.hint = e->label.hint;
        op.hash = e->hash;
        op.facts = opFacts(*e);
      } else {
        op.issued = false;
        if (r.notAsked) {
          op.text = "not asked (outside the live report's ranks)";
        } else if (!r.responded) {
          op.text = "did not answer (process gone or frozen)";
        } else if (g && g->lastSeq < s) {
          op.text = "has not issued #" + std::to_string(s) + " yet (last #" + std::to_string(g->lastSeq) + ")";
        } else {
          op.text = "#" + std::to_string(s) + " is no longer in its ledger (raise TORCH_EXT_LEDGER_SIZE)";
        }
      }
      f.ops.push_back(std::move(op));
    }
    return f;
  }
  return std::nullopt;
}

enum class Pair : uint8_t { Found, NotPosted, Unknown };

// How each rank got to collective `seq` (History.h), from the windows it sent.
std::string historyLines(const std::vector<RankInput>& ranks, uint64_t seq, bool lookAlike) {
  std::vector<RankHistory> histories;
  for (const auto& r : ranks) {
    RankHistory h;
    h.globalRank = r.globalRank;
    if (const GroupView* g = r.group()) {
      std::vector<HistoryItem> items;
      for (const auto& e : g->entries) {
        if (!e.isP2P && e.seq <= seq && (items.empty() || e.seq > items.back().seq)) {
          items.push_back(HistoryItem{e.seq, opName(e.op), describeCallPath(e.frames)});
        }
      }
      h.known = !items.empty();
      h.runs = historyRuns(items, kHistoryRuns);
    }
    histories.push_back(std::move(h));
  }
  return formatHistories(histories, seq, lookAlike);
}

// The peer's op that pairs with `e` (same tag and ordinal, opposite direction,
// pointing back at us). NotPosted only when the peer's window proves it has
// not issued it: ordinals only grow and the window holds the newest records.
Pair findCounterpart(const GroupView& peerView, const EntryView& e, int myGroupRank, const EntryView** out) {
  const Op want = p2pCounterpart(e.op);
  uint64_t maxOrdinal = 0;
  for (const auto& f : peerView.entries) {
    if (!f.isP2P || f.tag != e.tag || f.op != want || f.peer != myGroupRank) continue;
    if (f.p2pOrdinal == e.p2pOrdinal) {
      *out = &f;
      return Pair::Found;
    }
    maxOrdinal = std::max(maxOrdinal, f.p2pOrdinal);
  }
  *out = nullptr;
  if (maxOrdinal > 0) return maxOrdinal < e.p2pOrdinal ? Pair::NotPosted : Pair::Unknown;
  const bool wholeHistory = peerView.entries.empty() || peerView.entries.front().id == 1;
  return wholeHistory ? Pair::NotPosted : Pair::Unknown;
}

std::string p2pLine(const RankInput& r, const EntryView& e) {
  std::ostringstream os;
  os << "rank " << r.globalRank << ": " << e.text << " (#" << e.p2pOrdinal << ") at " << e.where();
  return os.str();
}

// Send/receive pairs that cannot complete: a counterpart with another dtype or
// size, or every rank blocked in a p2p op whose counterpart nobody posted.
std::optional<std::string> findP2PMismatch(const std::string& label, const std::vector<RankInput>& ranks) {
  std::vector<std::string> wrong;
  std::vector<std::string> unmatched;
  bool allBlockedUnmatched = true;
  bool anyP2P = false;
  for (const auto& r : ranks) {
    const GroupView* g = r.group();
    if (!g) {
      allBlockedUnmatched = false;
      continue;
    }
    bool blockedUnmatched = false;
    bool blockedOther = false;
    for (const auto& e : g->entries) {
      // Pending ops, and failed ones (the inner backend or a strict check
      // refused them): both still await a counterpart that may not pair.
      if (e.state == EntryState::Completed) continue;
      if (!e.isP2P) {
        if (e.state == EntryState::Scheduled) blockedOther = true;
        continue;
      }
      anyP2P = true;
      if (e.op == Op::RecvAnySource || e.peer < 0 || e.peer >= static_cast<int>(ranks.size())) {
        blockedOther = true;
        continue;
      }
      const RankInput& peer = ranks[e.peer];
      const GroupView* pg = peer.group();
      if (!pg) {
        blockedOther = true;
        continue;
      }
      const EntryView* f = nullptr;
      const Pair pair = findCounterpart(*pg, e, r.groupRank, &f);
      if (pair == Pair::Unknown) {
        blockedOther = true;  // the peer's window cannot tell: no verdict
        continue;
      }
      if (pair == Pair::NotPosted) {
        blockedUnmatched = true;
        unmatched.push_back(p2pLine(r, e) + "; rank " + std::to_string(peer.globalRank) + " has posted no matching " +
                            opName(p2pCounterpart(e.op)));
      } else if (f->pairHash != e.pairHash) {
        wrong.push_back(messages::p2pUnpaired({r.globalRank, e.text, e.p2pOrdinal, e.where()},
                                              {peer.globalRank, f->text, f->p2pOrdinal, f->where()}));
      } else {
        blockedOther = true;  // matched: waiting on the transport, not a mismatch
      }
    }
    if (!blockedUnmatched || blockedOther) allBlockedUnmatched = false;
  }
  std::ostringstream os;
  if (!wrong.empty()) {
    os << messages::p2pDoNotPair(label);
    for (const auto& w : wrong) os << "\n  " << w;
    return os.str();
  }
  if (anyP2P && allBlockedUnmatched && !unmatched.empty()) {
    os << "send/recv on group \"" << label << "\" do not pair: every rank waits in a point-to-point op "
       << "whose counterpart no peer has posted:";
    for (const auto& u : unmatched) os << "\n  " << u;
    return os.str();
  }
  return std::nullopt;
}

// Every rank inside collective `seq`, one stream stalled (FlagScale's "all
// ranks stuck"): the ranks whose stream never began it are the ones the
// others wait for. Known where the stream backend says (StreamStartAware).
std::string streamStartLines(const std::vector<RankInput>& ranks, uint64_t seq) {
  std::vector<int64_t> notStarted, started;
  for (const auto& r : ranks) {
    const GroupView* g = r.responded ? r.group() : nullptr;
    const EntryView* e = g ? g->bySeq(seq) : nullptr;
    if (e == nullptr || e->state != EntryState::Scheduled || !e->streamStarted) continue;
    (*e->streamStarted ? started : notStarted).push_back(r.globalRank);
  }
  if (notStarted.empty()) return "";
  std::ostringstream os;
  const bool one = notStarted.size() == 1;
  os << "\n  " << formatRanks(notStarted) << ": issued #" << seq << ", but " << (one ? "its" : "their")
     << " stream has not begun it (held up at it or before it: a slow or hung kernel, or a collective of "
        "another group on the same stream)";
  if (!started.empty()) {
    os << "; " << formatRanks(started) << (started.size() == 1 ? " is" : " are") << " in #" << seq << ", waiting for "
       << (one ? "it" : "them");
  }
  return os.str();
}

void notArrivedLines(std::ostringstream& os, const RankInput& r, int64_t nowNs, const std::string& what) {
  const GroupView* g = r.group();
  os << "\n  rank " << r.globalRank << " has not arrived" << (what.empty() ? "" : " " + what) << ": ";
  // It may be waiting in a collective of another of its groups: say so first
  // (its main thread's stack below shows the same wait from Python's side).
  const GroupWait* elsewhere = nullptr;
  for (const auto& w : r.waits()) {
    if (w.group != r.groupName && w.waits() && (elsewhere == nullptr || w.startNs > elsewhere->startNs)) {
      elsewhere = &w;
    }
  }
  if (elsewhere != nullptr) {
    os << "it waits in ";
    if (elsewhere->seq) {
      os << "collective #" << elsewhere->seq << " " << elsewhere->op;
    } else {
      os << elsewhere->op << (elsewhere->recv ? " from rank " : " to rank ") << elsewhere->peer;
    }
    os << " on group \"" << elsewhere->label << "\" (at " << elsewhere->where << ", "
       << (elsewhere->startNs ? secondsBetween(elsewhere->startNs, nowNs) : seconds(0)) << "); ";
  }
  if (g && g->lastCompletedSeq > 0) {
    os << "last completed #" << g->lastCompletedSeq;
    if (g->lastCompletedNs > 0) os << " " << secondsBetween(g->lastCompletedNs, nowNs) << " ago";
  } else {
    os << "no collective completed on this group yet";
  }
  if (g) {
    if (const EntryView* p = g->oldestPending()) {
      os << "; waiting in " << p->text;
      if (p->seq) os << " #" << p->seq;
      os << " at " << p->where();
    }
  }
  if (const std::string busy = describeProgress(r.snapshot.progress); !busy.empty()) os << "; " << busy;  // issue 68
  os << "; main thread now at\n    " << stackText(r.snapshot.main);
}

// Ranks that ended (destroy_process_group, or their process ended) while others
// went on: names the collectives the others issued after the ended ranks' last
// one, with their call sites. When every one of those call sites had already run
// on all ranks before (the same loop), the ended ranks stopped while the others
// were still in it: if they also left on purpose (destroy_process_group), that
// is the case where "ran out of data?" is the likely story. A call site the others reach only now (rank-0-only logging
// or validation, a collective after an early `break`) is not.
void endedEarlyLines(std::ostringstream& os, const std::vector<RankInput>& ranks,
                     const std::vector<const RankInput*>& gone, std::vector<OpFacts>& shownOps) {
  std::vector<int64_t> ended;
  uint64_t lastOfEnded = UINT64_MAX;
  // "Ran out of data" is a rank that finished its loop and left the group on
  // purpose; a process that just ended (an exception, the end of a script
  // that never destroys the group) is not told that story.
  bool allLeft = true;
  for (const RankInput* r : gone) {
    if (r->statusKnown && (r->phase == RankPhase::Left || r->phase == RankPhase::Exited)) {
      ended.push_back(r->globalRank);
      lastOfEnded = std::min(lastOfEnded, r->lastSeq);
      allLeft &= r->phase == RankPhase::Left;
    }
  }
  if (ended.empty()) return;
  // (seq, what, where) -> the ranks that issued it, in rank order, and what it is.
  std::map<std::tuple<uint64_t, std::string, std::string>, std::pair<std::vector<int64_t>, OpFacts>> extras;
  std::set<int64_t> issuers;
  bool allRanBefore = true;
  for (const auto& r : ranks) {
    const GroupView* g = r.responded ? r.group() : nullptr;
    if (g == nullptr) continue;
    for (const auto& e : g->entries) {
      if (e.isP2P || e.seq <= lastOfEnded) continue;
      auto& extra = extras[{e.seq, e.text, e.where()}];
      extra.first.push_back(r.globalRank);
      extra.second = opFacts(e);
      issuers.insert(r.globalRank);
      bool ranBefore = false;
      for (const auto& f : g->entries) {
        if (!f.isP2P && f.seq <= lastOfEnded && f.text == e.text && !f.frames.empty() && f.where() == e.where()) {
          ranBefore = true;
          break;
        }
      }
      allRanBefore &= ranBefore;
    }
  }
  if (extras.empty()) return;
  std::sort(ended.begin(), ended.end());
  const std::vector<int64_t> by(issuers.begin(), issuers.end());
  os << "\n  " << formatRanks(by) << " issued collectives that " << formatRanks(ended)
     << " never issued before ending:";
  constexpr size_t kShown = 4;
  size_t shown = 0;
  for (const auto& kv : extras) {
    if (shown == kShown) {
      os << "\n    ... and " << (extras.size() - kShown) << " more (up to #" << std::get<0>(extras.rbegin()->first)
         << ")";
      break;
    }
    os << "\n    #" << std::get<0>(kv.first) << " " << std::get<1>(kv.first) << " at " << std::get<2>(kv.first);
    if (kv.second.first.size() != by.size()) os << " (" << formatRanks(kv.second.first) << ")";
    addShown(shownOps, kv.second.second);
    ++shown;
  }
  if (allRanBefore && allLeft) {
    os << "\n  every rank had issued these from the same lines before: " << formatRanks(ended)
       << " stopped while the others were still in the loop (ran out of data?)";
  }
}

}  // namespace

std::string lastWordsNote(const RankInput& r) {
  const auto why = LastWordsWhy::decode(r.snapshot.incident);
  if (!why || why->cause == LastWordsCause::Terminated) return "then its process was terminated";
  if (why->cause == LastWordsCause::Raised) return "then its process exited, raising " + why->exception;
  return "then its process exited";
}

std::string describeAbsent(const RankInput& r, int64_t nowNs) {
  std::ostringstream os;
  const std::string ago = r.heartbeatNs > 0 ? " " + secondsBetween(r.heartbeatNs, nowNs) + " ago" : "";
  const auto why = r.lastWords ? LastWordsWhy::decode(r.snapshot.incident) : std::nullopt;
  if (r.statusKnown && r.phase == RankPhase::Left) {
    os << "left the group (destroy_process_group)" << ago << " after issuing #" << r.lastSeq;
  } else if (r.statusKnown && r.phase == RankPhase::Exited && why && why->cause == LastWordsCause::Raised) {
    // Its last words say what ended it: no need to guess.
    os << "exited" << ago << " after issuing #" << r.lastSeq << ", raising " << why->exception;
  } else if (r.statusKnown && r.phase == RankPhase::Exited) {
    os << "exited" << ago << " after issuing #" << r.lastSeq
       << ": its process ended without destroy_process_group (an uncaught exception, sys.exit or the end of its "
          "script)";
  } else if (r.heartbeatNs > 0) {
    os << "no heartbeat for " << secondsBetween(r.heartbeatNs, nowNs) << " (process gone or frozen)";
  } else {
    os << "no heartbeat (process gone or frozen)";
  }
  if (!r.storeLost.empty()) os << "; the store its process hosts was lost: " << r.storeLost;
  return os.str();
}

std::string formatMismatch(const std::string& groupLabel, int groupSize, uint64_t seq, const std::vector<RankOp>& ops,
                           const std::string& note, const std::string& more) {
  // Group ranks by what they issued (fingerprint hash, not just its text: the
  // text shows only the first few tensors of a coalesced op) and where, in order
  // of first appearance.
  struct Line {
    uint64_t hash;
    bool issued;
    std::string text, where, caller;
    std::vector<int64_t> ranks;
  };
  std::vector<Line> lines;
  for (const auto& op : ops) {
    auto it = std::find_if(lines.begin(), lines.end(), [&](const Line& l) {
      return l.issued == op.issued && l.hash == op.hash && l.text == op.text && l.where == op.where;
    });
    if (it == lines.end()) {
      lines.push_back(Line{op.hash, op.issued, op.text, op.issued ? op.where : "", op.caller, {op.globalRank}});
    } else {
      it->ranks.push_back(op.globalRank);
    }
  }
  // One signature from one site reached from different lines (call paths compared): the callers tell them apart.
  bool pathOnly = lines.size() > 1;
  for (size_t i = 0; i < lines.size() && pathOnly; ++i) {
    pathOnly = lines[i].issued && lines[i].text == lines[0].text && lines[i].where == lines[0].where;
    for (size_t j = 0; j < i && pathOnly; ++j) pathOnly = lines[i].caller != lines[j].caller;
  }
  for (auto& l : lines) l.where += pathOnly && !l.caller.empty() ? " from " + l.caller : "";
  // Rows alike in op and place but not in fingerprint (a coalesced op's 5th tensor) show it; places tell others apart.
  auto alike = [&](const Line& l) {
    return !pathOnly && l.issued && std::any_of(lines.begin(), lines.end(), [&](const Line& m) {
      return m.issued && m.text == l.text && m.where == l.where && m.hash != l.hash;
    });
  };
  std::vector<bool> marked;
  for (const auto& l : lines) marked.push_back(alike(l));  // decided before any text is marked
  for (size_t i = 0; i < lines.size(); ++i)
    lines[i].text += marked[i] ? " [fingerprint " + hex64(lines[i].hash).substr(0, 8) + "]" : "";
  size_t rankWidth = 0, textWidth = 0;
  for (const auto& l : lines) {
    rankWidth = std::max(rankWidth, formatRanks(l.ranks).size() + 1);
    textWidth = std::max(textWidth, l.text.size());
  }
  std::ostringstream os;
  os << "collective #" << seq << " on group \"" << groupLabel << "\" (" << groupSize << " ranks) differs across ranks:";
  for (const auto& l : lines) {
    os << "\n  " << padRight(formatRanks(l.ranks) + ":", rankWidth + 1);
    if (l.where.empty()) {
      os << l.text;
    } else {
      os << padRight(l.text, textWidth) << "  at " << l.where;
    }
  }
  if (pathOnly) {
    os << "\n  the same collective from different lines: the ranks compare call paths (call_paths), and these part "
          "here (a module, a micro-batch or a step skipped on some ranks, or a branch taken)";
  }
  if (!note.empty()) os << "\n  " << note;
  os << more;
  std::vector<std::string> hints;
  for (const auto& op : ops) {
    if (op.issued && !op.hint.empty() && std::find(hints.begin(), hints.end(), op.hint) == hints.end()) {
      hints.push_back(op.hint);
    }
  }
  for (const auto& h : hints) os << "\n  hint: " << h;
  return os.str();
}

Verdict differenceVerdict(const std::string& groupLabel, int groupSize, uint64_t seq, std::vector<RankOp> ops,
                          const std::string& note, const std::string& more) {
  Verdict v;
  v.kind = Verdict::Kind::Mismatch;
  v.seq = seq;
  v.group = groupLabel;
  v.text = formatMismatch(groupLabel, groupSize, seq, ops, note, more);
  for (const auto& op : ops) {
    if (op.issued) addShown(v.shown, op.facts);
  }
  v.ops = std::move(ops);
  return v;
}

const GroupView* RankInput::group() const {
  return (responded || lastWords) ? snapshot.group(groupName) : nullptr;
}

namespace {

// A difference in the ranks' windows: the collective (or send/recv) they
// issued differently. The lowest rank that answered reports it.
std::optional<Verdict> mismatchVerdict(const std::string& label, const std::vector<RankInput>& ranks) {
  const int size = static_cast<int>(ranks.size());
  if (auto m = findCollectiveMismatch(ranks)) {
    const bool lookAlike =
        std::all_of(m->ops.begin(), m->ops.end(), [&](const RankOp& o) { return o.text == m->ops[0].text; });
    Verdict v = differenceVerdict(label, size, m->seq, m->ops, m->note,
                                  metricSyncLines(ranks, m->seq) + historyLines(ranks, m->seq, lookAlike));
    int64_t lowest = -1;
    for (const auto& r : ranks) {
      if (r.responded && (lowest < 0 || r.globalRank < lowest)) lowest = r.globalRank;
    }
    v.reporter = lowest;
    return v;
  }
  if (auto p = findP2PMismatch(label, ranks)) {
    Verdict v;
    v.kind = Verdict::Kind::Mismatch;
    v.text = *p;
    for (const auto& r : ranks) {
      if (r.responded) {
        v.reporter = r.globalRank;
        break;
      }
    }
    return v;
  }
  return std::nullopt;
}

// Where each rank stands in the op an incident is about.
struct Positions {
  std::vector<int64_t> waiting, completed;
  std::map<std::string, std::vector<int64_t>> waitingWhere;  // call site -> the ranks waiting there
  std::vector<const RankInput*> notArrived, gone;
  std::vector<int64_t> notAsked;
  int64_t earliestStart = 0;  // the earliest issue among the waiting ranks
  std::string opText;
  OpFacts opFacts;   // the op's, from the first rank that issued it
  std::string head;  // "collective #7 all_reduce(...) on group "g" " / "send(...) on group "g" "
};

// A collective: every rank's entry at the incident's seq.
Positions collectivePositions(const std::string& label, const std::vector<RankInput>& ranks, uint64_t seq) {
  Positions p;
  for (const auto& r : ranks) {
    const GroupView* g = r.group();
    if (r.notAsked) {
      p.notAsked.push_back(r.globalRank);
      continue;
    }
    if (!r.responded) {
      p.gone.push_back(&r);
      continue;
    }
    const EntryView* e = g ? g->bySeq(seq) : nullptr;
    if (e == nullptr) {
      p.notArrived.push_back(&r);
      continue;
    }
    if (p.opText.empty()) {
      p.opText = e->text;
      p.opFacts = opFacts(*e);
    }
    if (e->state == EntryState::Scheduled || e->state == EntryState::Failed) {
      p.waiting.push_back(r.globalRank);
      p.waitingWhere[e->where()].push_back(r.globalRank);
      if (p.earliestStart == 0 || e->startNs < p.earliestStart) p.earliestStart = e->startNs;
    } else {
      p.completed.push_back(r.globalRank);
    }
  }
  std::ostringstream os;
  os << "collective #" << seq << " " << (p.opText.empty() ? "(unknown op)" : p.opText) << " on group \"" << label
     << "\" ";
  p.head = os.str();
  return p;
}

// A send/recv: the poster's record, and its peer's counterpart.
Positions p2pPositions(const std::string& label, const std::vector<RankInput>& ranks, const IncidentSubject& subj,
                       const RankInput* poster, int posterGroupRank) {
  Positions p;
  const int size = static_cast<int>(ranks.size());
  const GroupView* pg = poster ? poster->group() : nullptr;
  const EntryView* e = nullptr;
  if (pg) {
    for (const auto& x : pg->entries) {
      if (x.id == subj.recordId) e = &x;
    }
  }
  p.opText = e ? e->text : "(point-to-point op)";
  if (e) p.opFacts = opFacts(*e);
  p.earliestStart = e ? e->startNs : 0;
  if (poster) {
    p.waiting.push_back(poster->globalRank);
    p.waitingWhere[e ? e->where() : "(unknown call site)"].push_back(poster->globalRank);
  }
  p.head = p.opText + " on group \"" + label + "\" ";
  if (e && e->peer >= 0 && e->peer < size) {
    const RankInput& peer = ranks[e->peer];
    if (peer.notAsked) {
      p.notAsked.push_back(peer.globalRank);
    } else if (!peer.responded) {
      p.gone.push_back(&peer);
    } else {
      const GroupView* peerView = peer.group();
      const EntryView* f = nullptr;
      if (peerView) findCounterpart(*peerView, *e, posterGroupRank, &f);
      if (f && f->state == EntryState::Scheduled) {
        p.waiting.push_back(peer.globalRank);
        p.waitingWhere[f->where()].push_back(peer.globalRank);
      } else if (!f) {
        p.notArrived.push_back(&peer);
      }
    }
  }
  return p;
}

// Waits across groups: follows the ranks the op waits for into the groups
// where they wait (their snapshots carry every group's position). Built only
// when a rank is missing: a group whose ranks all wait in it needs no graph
// (and the post-mortem of many groups stays linear).
WaitFinding followAcross(const std::vector<RankInput>& ranks, const IncidentSubject& subj, const Positions& p,
                         const RankInput* poster, const OtherWaits* others) {
  WaitFinding across;
  if (p.notArrived.empty() && p.gone.empty()) return across;
  WaitGraph graph;
  if (others != nullptr) {
    for (const auto& [rank, waits] : *others) graph.addRankRef(rank, *waits);
  }
  for (const auto& r : ranks) {
    if (r.responded) graph.addRankRef(r.globalRank, r.waits());
  }
  std::vector<int64_t> missing;
  for (const RankInput* r : p.notArrived) missing.push_back(r->globalRank);
  for (const RankInput* r : p.gone) missing.push_back(r->globalRank);
  const std::string groupName = ranks.empty() ? std::string() : ranks.front().groupName;
  if (subj.kind != IncidentSubject::Kind::P2P) {
    across = graph.follow(groupName, subj.seq, missing);
  } else if (poster != nullptr) {
    // From the poster's send/recv (a pipeline stage waiting for its peer).
    auto site = graph.siteOf(poster->globalRank);
    if (site && site->p2p() && site->group == groupName) across = graph.followFrom(std::move(*site), missing);
  }
  return across;
}

// The report's lines after its first: who waits where, who never arrived
// (and where they are instead), who is gone, metric syncs and hints.
void positionLines(std::ostringstream& os, const std::vector<RankInput>& ranks, const IncidentSubject& subj,
                   const Positions& p, int64_t nowNs, std::vector<OpFacts>& shownOps) {
  const bool collective = subj.kind != IncidentSubject::Kind::P2P;
  for (const auto& kv : p.waitingWhere) os << "\n  waiting: " << formatRanks(kv.second) << " at " << kv.first;
  if (collective) os << streamStartLines(ranks, subj.seq);
  if (!p.completed.empty()) os << "\n  completed it: " << formatRanks(p.completed);
  for (const RankInput* r : p.notArrived) notArrivedLines(os, *r, nowNs, "");
  for (const RankInput* r : p.gone) os << "\n  rank " << r->globalRank << ": " << describeAbsent(*r, nowNs);
  endedEarlyLines(os, ranks, p.gone, shownOps);
  if (collective) os << metricSyncLines(ranks, subj.seq);
  if (!p.notAsked.empty()) os << "\n  not asked (outside the live report's ranks): " << formatRanks(p.notAsked);
  std::vector<std::string> hints;  // of the labels of the op waited in, each once
  for (const auto& r : ranks) {
    const GroupView* g = r.group();
    const EntryView* e = (g && collective) ? g->bySeq(subj.seq) : nullptr;
    if (e && !e->label.hint.empty() && std::find(hints.begin(), hints.end(), e->label.hint) == hints.end()) {
      hints.push_back(e->label.hint);
    }
  }
  for (const auto& h : hints) os << "\n  hint: " << h;
}

}  // namespace

Verdict analyze(const std::string& label, const std::vector<RankInput>& ranks, const Incident& incident, int64_t nowNs,
                const OtherWaits* others) {
  if (auto m = mismatchVerdict(label, ranks)) {
    m->group = label;
    m->incident = incident.id();
    return *m;
  }
  Verdict v;
  v.group = label;
  v.incident = incident.id();
  if (incident.kind == IncidentKind::Mismatch || incident.kind == IncidentKind::P2P) {
    // Nothing definite in the windows: no verdict (the hang path still watches).
    v.kind = Verdict::Kind::None;
    v.text = "no mismatch found in the ledger windows of group \"" + label + "\" for incident " + incident.id();
    return v;
  }

  // A hang or a failure: where every rank stands in the op.
  const IncidentSubject& subj = incident.subject;
  const int size = static_cast<int>(ranks.size());
  const int posterGroupRank =
      subj.kind == IncidentSubject::Kind::P2P ? subj.groupRank : static_cast<int>(incident.poster);
  const RankInput* poster = (posterGroupRank >= 0 && posterGroupRank < size) ? &ranks[posterGroupRank] : nullptr;
  const Positions p = subj.kind != IncidentSubject::Kind::P2P
                          ? collectivePositions(label, ranks, subj.seq)
                          : p2pPositions(label, ranks, subj, poster, posterGroupRank);
  std::ostringstream os;
  os << p.head;
  if (incident.kind == IncidentKind::Failure) {
    v.kind = Verdict::Kind::Failure;
    os << "failed in the inner backend (rank " << (poster ? poster->globalRank : incident.poster)
       << " saw: " << incident.error << ")";
  } else {
    v.kind = Verdict::Kind::Hang;
    os << "has waited " << (p.earliestStart ? secondsBetween(p.earliestStart, nowNs) : seconds(0));
  }
  v.seq = subj.seq;
  const WaitFinding across = followAcross(ranks, subj, p, poster, others);
  std::string head = os.str();
  os.str("");
  if (across.shape == WaitShape::Cycle) head = across.headline() + ": " + head;
  os << head << across.describe(nowNs);
  addShown(v.shown, p.opFacts);
  positionLines(os, ranks, subj, p, nowNs, v.shown);
  v.text = os.str();

  std::vector<int64_t> sortedWaiting = p.waiting;
  std::sort(sortedWaiting.begin(), sortedWaiting.end());
  v.reporter = !sortedWaiting.empty() ? sortedWaiting.front() : (poster ? poster->globalRank : 0);
  v.shape = across.shape;
  v.sites = across.sites;
  if (across.shape == WaitShape::Cycle) {
    v.cycleGroups = across.groups;
    v.certain = across.certain;
    // Every group on the cycle finds it; the report of one of them is logged.
    if (!ranks.empty() && !across.owner.empty() && across.owner != ranks.front().groupName) v.reporter = -1;
  } else if (across.shape == WaitShape::Chain) {
    v.waitsFor = across.end;
  }
  v.waiting = sortedWaiting;
  for (const RankInput* r : p.notArrived) v.notArrived.push_back(r->globalRank);
  for (const RankInput* r : p.gone) v.gone.push_back(r->globalRank);
  v.completed = p.completed;
  v.op = p.opText;
  return v;
}

}  // namespace torch_ext
