#include "guard/watchdog/Dumps.h"

#include "guard/Runtime.h"
#include "guard/collective/CallSite.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace torch_ext {

namespace {

std::string hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

bool makeDirs(const std::string& path) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

} // namespace

EntryView entryView(const Entry& e) {
  EntryView v;
  v.id = e.id;
  v.seq = e.seq;
  v.p2pOrdinal = e.p2pOrdinal;
  v.op = e.fp.op;
  v.device = c10::DeviceTypeName(e.fp.device, /*lower_case=*/true);
  v.text = e.fp.describe();
  v.isP2P = ::torch_ext::isP2P(e.fp.op);
  v.peer = e.fp.root;
  v.tag = e.fp.tag;
  v.reduceOp = reduceOpName(e.fp.reduceOp);
  for (const auto& m : e.fp.metas) {
    v.dtypes.push_back(dtypeName(m.dtype));
    v.sizes.emplace_back(m.sizes.begin(), m.sizes.end());
  }
  v.hash = e.fp.hash;
  v.rolling = e.rolling;
  v.pairHash = v.isP2P ? e.fp.p2pPairHash() : 0;
  v.splitSend = e.fp.splitSend;
  v.splitRecv = e.fp.splitRecv;
  v.state = e.state;
  v.startNs = e.startNs;
  v.endNs = e.endNs;
  v.frames = CallSites::instance().frames(e.callSite);
  v.error = e.error;
  return v;
}

GroupView groupView(GroupState& state, size_t maxEntries) {
  GroupView g;
  const auto& id = state.id();
  g.name = id.name;
  g.desc = state.label();
  g.rank = id.rank;
  g.size = id.size;
  g.globalRanks = id.globalRanks;
  if (g.globalRanks.empty()) {
    for (int r = 0; r < id.size; ++r) g.globalRanks.push_back(r);
  }
  Progress p = state.ledger().progress();
  g.lastSeq = p.lastSeq;
  g.lastCompletedSeq = p.lastCompletedSeq;
  g.lastCompletedNs = p.lastCompletedNs;
  g.rolling = p.rolling;
  g.timeoutMs = state.abortAfter().count();
  for (const auto& e : state.ledger().entries(maxEntries)) g.entries.push_back(entryView(e));
  return g;
}

RankSnapshot takeSnapshot(const std::string& reason, const std::vector<std::shared_ptr<GroupState>>& states,
                          size_t maxEntries) {
  RankSnapshot s;
  s.pid = static_cast<int64_t>(getpid());
  s.hostname = hostname();
  s.timeNs = wallNs();
  s.incident = reason;
  for (const auto& st : states) {
    s.groups.push_back(groupView(*st, maxEntries ? maxEntries : st->ledger().capacity()));
  }
  if (!states.empty()) {
    s.rank = states.front()->id().globalRank(states.front()->id().rank);
    s.config = states.front()->config().describe();
  }
  s.main = Runtime::instance().mainThreadStack(std::chrono::milliseconds(300));
  return s;
}

std::string writeDumpFile(const std::string& dir, const RankSnapshot& snap, std::string* error) {
  const std::string path = dir + "/rank" + std::to_string(snap.rank) + ".json";
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  bool ok = makeDirs(dir);
  if (ok) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << toJson(snap).dump() << "\n";
    out.close();
    ok = out.good() && std::rename(tmp.c_str(), path.c_str()) == 0;
    if (!ok) std::remove(tmp.c_str());
  }
  if (!ok) {
    *error = std::strerror(errno);
    return "";
  }
  return path;
}

} // namespace torch_ext
