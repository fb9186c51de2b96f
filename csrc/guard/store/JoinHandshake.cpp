#include "guard/store/JoinHandshake.h"

#include "guard/Errors.h"
#include "guard/Runtime.h"
#include "guard/report/Json.h"
#include "guard/report/RankList.h"
#include "guard/store/StoreKeys.h"

#include <algorithm>
#include <sstream>
#include <thread>

namespace torch_ext {

namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> asBytes(const std::string& s) {
  return {s.begin(), s.end()};
}

std::string asText(const std::vector<uint8_t>& b) {
  return {b.begin(), b.end()};
}

Json stringMap(const std::map<std::string, std::string>& m) {
  Json j = Json::object();
  for (const auto& [k, v] : m) j.set(k, v);
  return j;
}

std::map<std::string, std::string> stringMapOf(const Json* j) {
  std::map<std::string, std::string> out;
  if (j == nullptr || !j->isObject()) return out;
  for (const auto& [k, v] : j->asObject()) {
    if (v.isString()) out[k] = v.asString();
  }
  return out;
}

Json intList(const std::vector<int64_t>& v) {
  Json j = Json::array();
  for (int64_t x : v) j.push(x);
  return j;
}

std::vector<int64_t> intListOf(const Json* j) {
  std::vector<int64_t> out;
  if (j == nullptr || !j->isArray()) return out;
  for (const auto& x : j->asArray()) {
    if (x.type() == Json::Type::Int) out.push_back(x.asInt());
  }
  return out;
}

// "[0, 1]", as the list was written in the program.
std::string listText(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

std::string secondsText(std::chrono::milliseconds ms) {
  std::ostringstream os;
  os.precision(3);
  os << static_cast<double>(ms.count()) / 1000.0 << " s";
  return os.str();
}

std::string head(const JoinContext& ctx) {
  return "guard group \"" + ctx.group + "\" (" + std::to_string(ctx.size) + " ranks) cannot start: ";
}

// The store's keys of this handshake (the guard's under its prefix).
std::string recordKey(int rank, int64_t claim = 1) {
  return std::string(keys::kPrefix) + keys::joinRecord(rank, claim);
}
std::string claimKey(int rank) {
  return std::string(keys::kPrefix) + keys::joinClaim(rank);
}
std::string storeFailedText(const JoinContext& ctx, const std::exception& e) {
  std::string what = e.what();
  what = what.substr(0, what.find("\nException raised from"));  // torch's C++ backtrace
  return head(ctx) + "the store failed while its ranks joined (" + what +
         "); the store is torchrun's agent, or rank 0's process under plain env://";
}

std::string seenKey() {
  return std::string(keys::kPrefix) + keys::kJoinSeen;
}
const std::string& verdictKey() {
  static const std::string k = std::string(keys::kPrefix) + keys::kJoinVerdict;
  return k;
}

bool present(c10d::Store& store, const std::string& key) {
  return store.check({key});
}

// What is known of a rank that has not joined: its own backend's rendezvous
// key at this prefix ("gloo"), a guard status without a join record
// ("guard": an older torch_ext), or nothing.
std::string knownOf(c10d::Store& store, int rank) {
  if (present(store, keys::glooRendezvous(rank))) return "gloo";
  if (present(store, std::string(keys::kPrefix) + keys::status(rank))) return "guard";
  return "";
}

// Every rank without a record, with what is known of it.
std::vector<JoinHandshake::Missing> findMissing(c10d::Store& store, int size) {
  std::vector<JoinHandshake::Missing> out;
  for (int r = 0; r < size; ++r) {
    if (!present(store, recordKey(r))) out.push_back({r, knownOf(store, r)});
  }
  return out;
}

// Sets the verdict unless one is there; returns the one that is.
JoinVerdict settle(c10d::Store& store, const JoinVerdict& mine) {
  const std::string want = mine.encode();
  const std::string now = asText(store.compareSet(verdictKey(), {}, asBytes(want)));
  if (now == want) return mine;
  auto theirs = JoinVerdict::decode(now);
  if (!theirs) {
    JoinVerdict bad;
    bad.error = "the join verdict in the store is unreadable (another program wrote the guard's keys?)";
    return bad;
  }
  return *theirs;
}

// Ends the group on the ranks that concluded it already: the group's alerts
// carry the refusal to their watchdogs (StoreKeys.h, kJoinRefused). A store
// that fails here is the caller's error to report.
void refuse(c10d::Store& store, int rank, const std::string& why) {
  const int64_t k = store.add(std::string(keys::kPrefix) + keys::kAlerts, 1);
  store.set(std::string(keys::kPrefix) + keys::alert(k),
            asBytes(keys::AlertRecord{keys::kJoinRefused, rank, why}.encode()));
}

// Asks the store whether every key is there, and paces the next ask at a
// tenth of the time waited so far (1 ms to 250 ms): what is late by 20 ms is
// seen within 2 ms more, and a long wait for a late rank costs each rank 4 asks
// a second. Not store.wait with a timeout: the TCPStore client logs two c10d
// warnings every time such a wait times out, which a join that waits seconds
// for a late rank would print again and again on every rank.
class Poll {
 public:
  bool there(c10d::Store& store, const std::vector<std::string>& keys) {
    if (store.check(keys)) return true;
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start_);
    std::this_thread::sleep_for(std::clamp(waited / 10, std::chrono::milliseconds(1), std::chrono::milliseconds(250)));
    return store.check(keys);
  }

 private:
  const Clock::time_point start_ = Clock::now();
};

}  // namespace

JoinRecord JoinRecord::of(const Config& cfg, std::string torchExt, std::string torch, std::string host, int64_t pid) {
  JoinRecord r;
  r.torchExt = std::move(torchExt);
  r.torch = std::move(torch);
  r.host = std::move(host);
  r.pid = pid;
  for (const auto& s : torch_ext::settings()) {
    if (s.scope != SettingScope::Job) continue;
    r.settings[s.option] = s.show(cfg);
    auto it = cfg.source.find(s.option);
    r.sources[s.option] = it == cfg.source.end() ? "default" : it->second;
  }
  return r;
}

std::string JoinRecord::encode() const {
  Json j = Json::object();
  j.set("protocol", protocol);
  j.set("torch_ext", torchExt);
  j.set("torch", torch);
  j.set("host", host);
  j.set("pid", pid);
  j.set("global_rank", globalRank);
  j.set("members", intList(members));
  j.set("settings", stringMap(settings));
  j.set("sources", stringMap(sources));
  return j.dump();
}

std::optional<JoinRecord> JoinRecord::decode(const std::string& value) {
  try {
    const Json j = Json::parse(value);
    JoinRecord r;
    r.protocol = static_cast<int>(j.intOr("protocol", -1));
    r.torchExt = j.stringOr("torch_ext");
    r.torch = j.stringOr("torch");
    r.host = j.stringOr("host");
    r.pid = j.intOr("pid");
    r.globalRank = j.intOr("global_rank", -1);
    r.members = intListOf(j.get("members"));
    r.settings = stringMapOf(j.get("settings"));
    r.sources = stringMapOf(j.get("sources"));
    return r;
  } catch (const JsonError&) {
    return std::nullopt;
  }
}

std::string JoinVerdict::encode() const {
  Json j = Json::object();
  j.set("ok", ok);
  j.set("error", error);
  j.set("members", intList(members));
  j.set("settings", stringMap(settings));
  j.set("sources", stringMap(sources));
  return j.dump();
}

std::optional<JoinVerdict> JoinVerdict::decode(const std::string& value) {
  try {
    const Json j = Json::parse(value);
    JoinVerdict v;
    const Json* ok = j.get("ok");
    v.ok = ok != nullptr && ok->type() == Json::Type::Bool && ok->asBool();
    v.error = j.stringOr("error");
    v.members = intListOf(j.get("members"));
    v.settings = stringMapOf(j.get("settings"));
    v.sources = stringMapOf(j.get("sources"));
    return v;
  } catch (const JsonError&) {
    return std::nullopt;
  }
}

JoinVerdict JoinHandshake::conclude(const JoinContext& ctx, const std::vector<JoinRecord>& records) {
  JoinVerdict v;
  const JoinRecord& zero = records.at(0);
  const bool differ =
      std::any_of(records.begin(), records.end(), [&](const JoinRecord& r) { return r.protocol != zero.protocol; });
  if (differ) {
    // Side by side, as a mismatch report lists fingerprints: one line per
    // distinct (protocol, torch_ext, torch), with its ranks.
    std::vector<std::pair<std::string, std::vector<int64_t>>> rows;
    for (size_t r = 0; r < records.size(); ++r) {
      const JoinRecord& rec = records[r];
      const std::string row =
          "torch_ext " + rec.torchExt + " (join protocol " + std::to_string(rec.protocol) + "), torch " + rec.torch;
      auto it = std::find_if(rows.begin(), rows.end(), [&](const auto& p) { return p.first == row; });
      if (it == rows.end()) {
        rows.push_back({row, {static_cast<int64_t>(r)}});
      } else {
        it->second.push_back(static_cast<int64_t>(r));
      }
    }
    size_t width = 0;
    for (const auto& row : rows) width = std::max(width, formatRanks(row.second).size());
    std::string body;
    for (const auto& [row, ranks] : rows) {
      const std::string who = formatRanks(ranks) + ":";
      body += "\n  " + who + std::string(width + 2 - who.size(), ' ') + row;
    }
    v.error = head(ctx) + "its ranks run torch_ext releases that cannot work together:" + body +
              "\nInstall one torch_ext release on every node (pip show torch_ext on each).";
    return v;
  }
  for (size_t r = 0; r < records.size(); ++r) {
    const JoinRecord& rec = records[r];
    const bool where = rec.members.size() <= r || rec.members[r] == rec.globalRank;
    if (rec.members != zero.members || !where) {
      v.error = membersText(ctx, records, -1);
      return v;
    }
  }
  v.ok = true;
  v.members = zero.members;
  v.settings = zero.settings;
  v.sources = zero.sources;
  return v;
}

std::string JoinHandshake::membersText(const JoinContext& ctx, const std::vector<JoinRecord>& records, int claimed) {
  // One line per list asked for, with the processes that asked for it.
  std::vector<std::pair<std::vector<int64_t>, std::vector<const JoinRecord*>>> rows;
  for (const JoinRecord& rec : records) {
    auto it = std::find_if(rows.begin(), rows.end(), [&](const auto& row) { return row.first == rec.members; });
    if (it == rows.end()) {
      rows.push_back({rec.members, {&rec}});
    } else {
      it->second.push_back(&rec);
    }
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::ostringstream os;
  os << head(ctx) << "its processes asked for different member lists";
  if (claimed >= 0) os << " (two processes claim group rank " << claimed << ")";
  os << ", so torch gave two groups one name and one store:";
  for (const auto& [list, who] : rows) {
    os << "\n  new_group(" << (list.empty() ? std::string("?") : listText(list)) << ") on ";
    for (size_t i = 0; i < who.size(); ++i) {
      os << (i ? ", " : "") << "global rank " << who[i]->globalRank;
      if (!who[i]->host.empty()) os << " (" << who[i]->host << ", pid " << who[i]->pid << ")";
    }
  }
  os << "\nCall new_group on every rank with the same ranks, in the same order, also on ranks outside the group "
        "(torch.distributed.new_group's contract): for a group per node, create every node's group on every rank "
        "and keep your own (or use torch.distributed.new_subgroups / a DeviceMesh).";
  return os.str();
}

JoinResult JoinHandshake::apply(const JoinContext& ctx, const JoinRecord& mine, const JoinVerdict& verdict) {
  JoinResult out;
  for (const auto& [option, value] : verdict.settings) {
    auto it = mine.settings.find(option);
    if (it == mine.settings.end() || it->second == value) continue;
    out.adopt[option] = value;
    auto src = mine.sources.find(option);
    auto theirs = verdict.sources.find(option);
    const std::string own = src == mine.sources.end() ? "default" : src->second;
    const std::string zero = theirs == verdict.sources.end() ? "default" : theirs->second;
    out.notes.push_back("group \"" + ctx.group + "\": " + option + "=" + it->second + " here (" +
                        (own == "default" ? std::string("the default") : "from " + own) + "), rank 0 has " + option +
                        "=" + value + " (" + (zero == "default" ? std::string("its default") : "from " + zero) +
                        "): this rank runs " + option + "=" + value +
                        ", rank 0's (a job-wide setting: set it alike on every rank)");
  }
  return out;
}

std::vector<int> JoinHandshake::plainGlooRanks(c10d::Store& store, int size) {
  std::vector<int> out;
  for (const Missing& m : findMissing(store, size)) {
    if (m.known == "gloo") out.push_back(m.rank);
  }
  return out;
}

std::string JoinHandshake::missingText(const JoinContext& ctx, const std::vector<Missing>& missing, double waitedS) {
  std::vector<int64_t> absent;
  std::vector<int64_t> joined;
  for (const auto& m : missing) absent.push_back(m.rank);
  for (int r = 0; r < ctx.size; ++r) {
    if (std::find(absent.begin(), absent.end(), r) == absent.end()) joined.push_back(r);
  }
  const bool foreign = std::any_of(missing.begin(), missing.end(), [](const Missing& m) { return !m.known.empty(); });
  const double timeoutS = static_cast<double>(ctx.timeout.count()) / 1000.0;
  std::ostringstream os;
  os.precision(3);
  os << head(ctx) << formatRanks(absent) << " did not join it";
  if (foreign) {
    os << " (found after " << waitedS << " s):";
  } else {
    os << " within join_timeout (" << timeoutS << " s):";
  }
  for (const auto& m : missing) {
    os << "\n  rank " << m.rank << ": ";
    if (m.known == "gloo") {
      os << "created a plain gloo group here where the others created guard (its init_process_group / new_group "
            "names another backend)";
    } else if (m.known == "guard") {
      os << "created a guard without the join handshake (an older torch_ext)";
    } else {
      os << "never reached this group's creation (still starting, stuck before it, or gone)";
    }
  }
  if (!joined.empty()) os << "\n  joined: " << formatRanks(joined);
  if (foreign) {
    os << "\nGive every rank the same backend (\"guard\") and the same torch_ext release.";
  } else {
    os << "\nStart every rank and let each reach this group's creation; for a start slower than " << timeoutS
       << " s, set TORCH_EXT_JOIN_TIMEOUT.";
  }
  return os.str();
}

void JoinHandshake::holdUntilSeen(c10d::Store& store, const JoinContext& ctx, bool hold) {
  store.add(seenKey(), 1);
  if (!hold) return;
  // Stay until every process that claimed a rank of this group has read the
  // failure (bounded: one that claimed and then died never says so).
  int64_t claims = 0;
  for (int r = 0; r < ctx.size; ++r) claims += store.add(claimKey(r), 0);
  const auto until = Clock::now() + kSeenWithin;
  while (store.add(seenKey(), 0) < claims && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::string JoinHandshake::refusal(c10d::Store& store, const JoinContext& ctx, const JoinRecord& mine, int64_t claim,
                                   const JoinVerdict& verdict) {
  if (claim > 1) {
    // The first claimant writes its record right after its claim.
    std::vector<JoinRecord> records;
    Poll poll;
    const auto until = Clock::now() + std::chrono::seconds(2);
    while (!poll.there(store, {recordKey(ctx.rank)}) && Clock::now() < until) continue;
    if (present(store, recordKey(ctx.rank))) {
      if (auto first = JoinRecord::decode(asText(store.get(recordKey(ctx.rank))))) records.push_back(*first);
    }
    records.push_back(mine);
    return membersText(ctx, records, ctx.rank);
  }
  if (verdict.ok && !verdict.members.empty() && !mine.members.empty() && verdict.members != mine.members) {
    std::vector<JoinRecord> records;
    if (auto zero = JoinRecord::decode(asText(store.get(recordKey(0))))) records.push_back(*zero);
    records.push_back(mine);
    return membersText(ctx, records, -1);
  }
  return "";
}

JoinResult JoinHandshake::join(c10d::Store& store, const JoinContext& ctx, const JoinRecord& mine) {
  JoinVerdict verdict;
  try {
    const int64_t claim = store.add(claimKey(ctx.rank), 1);
    store.set(recordKey(ctx.rank, claim), asBytes(mine.encode()));
    if (claim > 1) {
      // Another process holds this group rank: the group cannot exist as
      // either asked. Ranks still joining read the verdict; ranks past it, the
      // alert.
      const std::string why = refusal(store, ctx, mine, claim, verdict);
      JoinVerdict fail;
      fail.error = why;
      settle(store, fail);
      refuseAndThrow(store, ctx, why);
    }
    verdict = awaitVerdict(store, ctx);
    if (!verdict.ok) holdUntilSeen(store, ctx, ctx.rank == 0);
    // Rank 0 concluded from lists that agree, and this rank asked for another.
    if (const std::string why = refusal(store, ctx, mine, claim, verdict); !why.empty())
      refuseAndThrow(store, ctx, why);
  } catch (const GuardError&) {
    throw;
  } catch (const std::exception& e) {
    throw GroupJoinError(storeFailedText(ctx, e));
  }
  if (!verdict.ok) throw GroupJoinError(verdict.error);
  return apply(ctx, mine, verdict);
}

void JoinHandshake::refuseAndThrow(c10d::Store& store, const JoinContext& ctx, const std::string& why) {
  refuse(store, ctx.rank, why);
  holdUntilSeen(store, ctx, true);
  throw GroupJoinError(why);
}

JoinVerdict JoinHandshake::awaitVerdict(c10d::Store& store, const JoinContext& ctx) {
  const auto start = Clock::now();
  const auto waited = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  std::vector<std::string> records;
  for (int r = 0; r < ctx.size; ++r) records.push_back(recordKey(r));
  // Ranks other than 0 give up a little after rank 0 would, so that rank
  // 0's verdict (which names every missing rank) normally comes first.
  const auto deadline = start + ctx.timeout + (ctx.rank == 0 ? std::chrono::seconds(0) : std::chrono::seconds(2));
  const auto warnAt = start + ctx.warnAfter;
  bool warned = false;
  auto nextLook = start + std::chrono::seconds(1);
  Poll poll;
  for (;;) {
    if (ctx.rank == 0) {
      if (poll.there(store, records)) {
        std::vector<JoinRecord> all;
        for (const auto& value : store.multiGet(records)) {
          auto rec = JoinRecord::decode(asText(value));
          if (!rec) {
            rec = JoinRecord{};
            rec->protocol = -1;  // unreadable: cannot work together either
          }
          all.push_back(*rec);
        }
        return settle(store, conclude(ctx, all));
      }
      if (present(store, verdictKey())) return settle(store, JoinVerdict{});  // another rank gave up first
    } else if (poll.there(store, {verdictKey()})) {
      return settle(store, JoinVerdict{});
    }
    const auto now = Clock::now();
    if (now < nextLook && now < deadline) continue;
    nextLook = now + std::chrono::seconds(1);
    // Rank 0 looks at every rank that has not joined; the others at rank 0
    // only (the one they wait for), so the store sees O(1) reads per rank.
    std::vector<Missing> missing;
    if (ctx.rank == 0 || now >= deadline) {
      missing = findMissing(store, ctx.size);
    } else if (!present(store, recordKey(0))) {
      missing.push_back({0, knownOf(store, 0)});
    }
    const bool foreign = std::any_of(missing.begin(), missing.end(), [](const Missing& m) { return !m.known.empty(); });
    if (foreign || now >= deadline) {
      if (foreign && ctx.rank != 0) missing = findMissing(store, ctx.size);
      if (!missing.empty()) {
        JoinVerdict fail;
        fail.error = missingText(ctx, missing, waited());
        return settle(store, fail);
      }
    }
    if (!warned && now >= warnAt && !missing.empty()) {
      warned = true;
      std::vector<int64_t> ranks;
      for (const auto& m : missing) ranks.push_back(m.rank);
      logMessage(LogLevel::Warning, "guard group \"" + ctx.group + "\" (" + std::to_string(ctx.size) +
                                        " ranks): waiting for " + formatRanks(ranks) + " to join it (" +
                                        secondsText(ctx.warnAfter) + " since this rank joined; join_timeout " +
                                        secondsText(ctx.timeout) + ")");
    }
  }
}

}  // namespace torch_ext
