#include "guard/Dumps.h"

#include "guard/Runtime.h"

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

RankSnapshot takeSnapshot(const std::string& reason, const std::vector<std::shared_ptr<GroupState>>& states,
                          size_t maxEntries) {
  RankSnapshot s;
  s.pid = static_cast<int64_t>(getpid());
  s.hostname = hostname();
  s.timeNs = wallNs();
  s.incident = reason;
  for (const auto& st : states) {
    s.groups.push_back(GroupView::from(*st, maxEntries ? maxEntries : st->ledger().capacity()));
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
