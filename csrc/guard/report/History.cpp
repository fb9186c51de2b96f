#include "guard/report/History.h"

#include "guard/report/Frame.h"
#include "guard/report/RankList.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace torch_ext {

namespace {

std::string clean(std::string s) {
  for (char& c : s) {
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

std::string seqs(const HistoryRun& r) {
  return r.count == 1 ? "#" + std::to_string(r.firstSeq)
                      : "#" + std::to_string(r.firstSeq) + "-#" + std::to_string(r.lastSeq);
}

// `runs` from `start` on: older runs dropped, a run that began earlier cut.
std::vector<HistoryRun> from(const std::vector<HistoryRun>& runs, uint64_t start) {
  std::vector<HistoryRun> out;
  for (auto r : runs) {
    if (r.lastSeq < start) continue;
    if (r.firstSeq < start) {
      r.count -= start - r.firstSeq;
      r.firstSeq = start;
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::string ordinal(uint64_t n) {
  const uint64_t tens = n % 100;
  const char* suffix = (tens >= 11 && tens <= 13) ? "th"
                       : n % 10 == 1              ? "st"
                       : n % 10 == 2              ? "nd"
                       : n % 10 == 3              ? "rd"
                                                  : "th";
  return std::to_string(n) + suffix;
}

std::string at(const HistoryRun& r) {
  return r.where.empty() ? "" : " at " + r.where;
}

// Collectives from `site`'s call site among `runs`, up to `seq`: runs of one
// loop that other collectives interrupted count together (DDP's first step, its
// bucket-rebuild broadcasts, then the other steps' all_reduces).
uint64_t countAt(const std::vector<HistoryRun>& runs, const HistoryRun& site, uint64_t seq) {
  uint64_t n = 0;
  for (const auto& r : runs) {
    if (r.sameSite(site) && r.firstSeq <= seq) n += std::min(r.lastSeq, seq) - r.firstSeq + 1;
  }
  return n;
}

// The reading when `early` ended a run (`run`, then `next` at seq) where `late`
// is still in it: `earlyCount` collectives at that site against the late side's
// `lateCount` (at seq). Two stories fit: fewer iterations (uneven data) or a
// branch; rank 0 alone is the classic rank-0-only block, so that story comes
// first there.
std::string earlyEndReading(const std::vector<int64_t>& early, const std::vector<int64_t>& late, const HistoryRun& run,
                            const HistoryRun& next, uint64_t earlyCount, uint64_t lateCount) {
  const std::string who = formatRanks(early);
  const std::string fewer = who + " left that loop earlier (fewer batches than " + formatRanks(late) +
                            ": uneven data per rank, such as a sampler or shard split that gives ranks different "
                            "batch counts)";
  std::ostringstream os;
  os << "\n  reading: " << who << " issued " << next.op << at(next) << " after " << earlyCount << " x " << run.op
     << at(run) << ", where " << formatRanks(late) << " issued a " << ordinal(lateCount) << " " << run.op << " there: ";
  if (early.size() == 1 && early[0] == 0 && late.size() > 1) {
    os << "rank 0 took a branch the others did not (a collective inside `if rank == 0:`: logging, validation, a "
          "metric's compute()) or "
       << fewer;
  } else {
    os << fewer << " or took a branch the others did not (a collective under `if rank == ...`)";
  }
  return os.str();
}

// The run of `runs` that covers `seq`, or null.
const HistoryRun* runAt(const std::vector<HistoryRun>& runs, uint64_t seq) {
  for (const auto& r : runs) {
    if (r.firstSeq <= seq && seq <= r.lastSeq) return &r;
  }
  return nullptr;
}

std::string seqRange(uint64_t first, uint64_t last) {
  return first == last ? "#" + std::to_string(first) : "#" + std::to_string(first) + "-#" + std::to_string(last);
}

// Where two histories part before `seq` (issue 67): the first collective both
// issued as the same op from different call paths. A look-alike (same
// signature, another line) passes every check that compares signatures, so the
// difference found at `seq` is its consequence, not its cause. When one side's
// next collective is what the other issued there, that side skipped the other's
// line (a branch: a module skipped on a batch without it). "" when the
// histories do not part that way before `seq`.
std::string partingReading(const std::vector<HistoryRun>& a, const std::vector<int64_t>& aRanks,
                           const std::vector<HistoryRun>& b, const std::vector<int64_t>& bRanks, uint64_t start,
                           uint64_t seq, bool lookAlike) {
  for (uint64_t s = start; s < seq + (lookAlike ? 1 : 0); ++s) {
    const HistoryRun* x = runAt(a, s);
    const HistoryRun* y = runAt(b, s);
    if (x == nullptr || y == nullptr || x->op != y->op) return "";
    if (x->sameSite(*y)) continue;
    const HistoryRun* xNext = runAt(a, s + 1);
    const HistoryRun* yNext = runAt(b, s + 1);
    std::ostringstream os;
    os << "\n  reading: the histories part at #" << s << ": " << formatRanks(aRanks) << " issued " << x->op << at(*x)
       << ", " << formatRanks(bRanks) << " issued it" << at(*y) << "; ";
    bool skipped = false;
    if (xNext != nullptr && xNext->sameSite(*y)) {
      os << formatRanks(bRanks) << " skipped " << formatRanks(aRanks) << "'s (a branch taken on some ranks only: a "
         << "module, a micro-batch or a step skipped), so ";
      skipped = true;
    } else if (yNext != nullptr && yNext->sameSite(*x)) {
      os << formatRanks(aRanks) << " skipped " << formatRanks(bRanks) << "'s (a branch taken on some ranks only: a "
         << "module, a micro-batch or a step skipped), so ";
      skipped = true;
    }
    if (s == seq) {
      os << "a collective issued on some ranks only (a hook that did not run, a module or a step skipped) shifts "
            "every one after it";
    } else {
      os << seqRange(s, seq - 1) << " paired look-alikes (one signature, two lines): what "
         << (s + 1 == seq ? "it" : "they") << " returned on these ranks is the other line's data";
    }
    // A branch decided from each rank's own data: one value every rank holds keeps them together.
    if (skipped)
      os << ". Decide such a branch together: `if torch_ext.agree(flag, \"any\"):` is true on every rank or on none";
    return os.str();
  }
  return "";
}

// A run's where is "<site> from <the line that called it>" (describeCallPath).
// The caller tells apart collectives issued through one helper; where every
// collective of a site came from one line it is noise, and left out.
std::string siteOf(const std::string& where) {
  const auto at = where.rfind(" from ");
  return at == std::string::npos ? where : where.substr(0, at);
}

// Each run as shown: its caller kept only where `paths` has more than one for its site.
std::vector<HistoryRun> shownRuns(std::vector<HistoryRun> runs,
                                  const std::map<std::string, std::set<std::string>>& paths) {
  for (auto& r : runs) {
    auto it = paths.find(siteOf(r.where));
    if (it != paths.end() && it->second.size() < 2) r.where = it->first;
  }
  return runs;
}

// `runs` without what was issued at or after `seq`.
std::vector<HistoryRun> before(const std::vector<HistoryRun>& runs, uint64_t seq) {
  std::vector<HistoryRun> out;
  for (auto r : runs) {
    if (r.firstSeq >= seq) break;
    if (r.lastSeq >= seq) {
      r.count -= r.lastSeq - seq + 1;
      r.lastSeq = seq - 1;
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

std::vector<HistoryRun> historyRuns(const std::vector<HistoryItem>& items, size_t maxRuns) {
  std::vector<HistoryRun> runs;
  for (const auto& it : items) {
    if (!runs.empty() && runs.back().op == it.op && runs.back().where == it.where &&
        runs.back().lastSeq + 1 == it.seq) {
      runs.back().lastSeq = it.seq;
      ++runs.back().count;
      continue;
    }
    runs.push_back(HistoryRun{it.seq, it.seq, 1, it.op, it.where});
  }
  if (runs.size() > maxRuns) runs.erase(runs.begin(), runs.end() - static_cast<std::ptrdiff_t>(maxRuns));
  return runs;
}

std::string encodeHistory(const std::vector<HistoryRun>& runs) {
  std::ostringstream os;
  for (const auto& r : runs) {
    os << r.firstSeq << '\t' << r.lastSeq << '\t' << r.count << '\t' << clean(r.op) << '\t' << clean(r.where) << '\n';
  }
  return os.str();
}

std::vector<HistoryRun> decodeHistory(const std::string& text) {
  std::vector<HistoryRun> runs;
  // Complete lines only: a text cut short (one that did not fit) ends in a
  // partial run, which is dropped rather than misread.
  for (size_t at = 0, end; (end = text.find('\n', at)) != std::string::npos; at = end + 1) {
    const std::string line = text.substr(at, end - at);
    std::vector<std::string> f;
    for (size_t at = 0;;) {
      const auto tab = line.find('\t', at);
      if (f.size() == 4 || tab == std::string::npos) {
        f.push_back(line.substr(at));
        break;
      }
      f.push_back(line.substr(at, tab - at));
      at = tab + 1;
    }
    if (f.size() != 5) continue;
    try {
      runs.push_back(HistoryRun{std::stoull(f[0]), std::stoull(f[1]), std::stoull(f[2]), f[3], f[4]});
    } catch (const std::exception&) {
      continue;
    }
  }
  return runs;
}

// Long: one text layout (runs of each rank side by side, elided where they
// agree); its column arithmetic reads best in one body.
std::string formatHistories(const std::vector<RankHistory>& ranks, uint64_t seq, bool lookAlike) {
  struct Line {
    std::vector<HistoryRun> runs;
    std::vector<int64_t> ranks;
  };
  // Every history from the same collective on: the latest that every rank's
  // (window of) history reaches back to.
  uint64_t start = 0;
  for (const auto& r : ranks) {
    if (r.known && !r.runs.empty()) start = std::max(start, r.runs.front().firstSeq);
  }
  std::vector<Line> lines;
  for (const auto& r : ranks) {
    if (!r.known || r.runs.empty()) continue;
    std::vector<HistoryRun> runs = from(r.runs, start);
    if (runs.empty()) continue;
    auto it = std::find_if(lines.begin(), lines.end(), [&](const Line& l) { return l.runs == runs; });
    if (it == lines.end()) {
      lines.push_back(Line{std::move(runs), {r.globalRank}});
    } else {
      it->ranks.push_back(r.globalRank);
    }
  }
  if (lines.size() < 2) return "";
  std::map<std::string, std::set<std::string>> paths;  // site -> the call paths it was reached from
  for (const auto& l : lines) {
    for (const auto& r : l.runs) paths[siteOf(r.where)].insert(r.where);
  }
  // Only when it tells more than the lines of the mismatch itself: the histories
  // part before `seq`, or one side left a run the other is still in (below).
  bool priorDiffers = false;
  {
    std::vector<HistoryRun> first;
    for (size_t i = 0; i < lines.size() && !priorDiffers; ++i) {
      std::vector<HistoryRun> prior = before(lines[i].runs, seq);
      if (i == 0) {
        first = std::move(prior);
      } else {
        priorDiffers = prior != first;
      }
    }
  }
  std::string reading;
  if (lines.size() == 2) {
    reading = partingReading(lines[0].runs, lines[0].ranks, lines[1].runs, lines[1].ranks, start, seq, lookAlike);
  }
  if (lines.size() == 2 && reading.empty()) {
    // One side still in a run at `seq` (its last run covers seq), the other's
    // run at the same site ended at seq - 1 and something else followed.
    for (int a = 0; a < 2; ++a) {
      const Line& late = lines[a];
      const Line& early = lines[1 - a];
      if (early.runs.size() < 2) continue;
      const HistoryRun& lateRun = late.runs.back();
      const HistoryRun& earlyRun = early.runs[early.runs.size() - 2];
      const HistoryRun& earlyNext = early.runs.back();
      if (lateRun.sameSite(earlyRun) && lateRun.lastSeq >= seq && earlyRun.lastSeq + 1 == seq &&
          earlyNext.firstSeq == seq && !earlyNext.sameSite(lateRun)) {
        // Counted from the same start only: a window that begins inside the run
        // would make the counts incomparable.
        if (earlyRun.firstSeq == lateRun.firstSeq) {
          reading = earlyEndReading(early.ranks, late.ranks, shownRuns({earlyRun}, paths)[0],
                                    shownRuns({earlyNext}, paths)[0], countAt(early.runs, earlyRun, seq),
                                    countAt(late.runs, lateRun, seq));
        }
        break;
      }
    }
  }
  if (!priorDiffers && reading.empty()) return "";
  size_t who = 0, seqWidth = 0, countWidth = 0;
  for (const auto& l : lines) {
    who = std::max(who, formatRanks(l.ranks).size() + 1);
    for (const auto& r : l.runs) {
      seqWidth = std::max(seqWidth, seqs(r).size());
      countWidth = std::max(countWidth, std::to_string(r.count).size());
    }
  }
  std::ostringstream os;
  os << "\n  how each rank got to #" << seq << " (its collectives from #" << start
     << " on, each run from one call site counted):";
  for (const auto& l : lines) {
    const std::vector<HistoryRun> shown = shownRuns(l.runs, paths);
    for (size_t i = 0; i < shown.size(); ++i) {
      const HistoryRun& r = shown[i];
      std::string name = i == 0 ? formatRanks(l.ranks) + ":" : "";
      std::string at = seqs(r), count = std::to_string(r.count);
      name.resize(who + 1, ' ');
      at.resize(seqWidth, ' ');
      count.insert(0, countWidth - count.size(), ' ');
      os << "\n    " << name << at << "  " << count << " x " << r.op << (r.where.empty() ? "" : " at " + r.where);
    }
  }
  os << reading;
  return os.str();
}

}  // namespace torch_ext
