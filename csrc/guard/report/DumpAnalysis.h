#pragma once

// DumpAnalysis: the post-mortem. Reads the per-rank dump files of a job
// (<dump_dir>/rank<r>.json, as text) and makes, for every group found in them,
// the same cross-rank verdict a live incident makes: which collective the ranks
// were stuck in, who had not arrived, or where their histories differ.
//
// Dumps are input from disk, possibly truncated, edited or hostile: every
// problem is a DumpError naming the file and what is wrong, never a crash.

#include "guard/report/Report.h"
#include "guard/report/Snapshot.h"

#include <cstddef>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace torch_ext {

class DumpError : public std::runtime_error {
 public:
  DumpError(const std::string& file, const std::string& what)
      : std::runtime_error(file + ": " + what), file_(file), reason_(what) {}
  const std::string& file() const {
    return file_;
  }
  // What is wrong, without the file's name.
  const std::string& reason() const {
    return reason_;
  }

 private:
  std::string file_;
  std::string reason_;
};

// Bounds on what one dump may hold, so a hostile file cannot exhaust memory.
constexpr size_t kMaxDumpBytes = 256u << 20;  // one file
constexpr int kMaxDumpGroupSize = 1 << 18;    // ranks in one group (262,144)

struct DumpInput {
  std::string name;  // the file, for errors ("rank3.json")
  std::string text;
};

// Parses and validates one dump; throws DumpError naming the file.
RankSnapshot readDump(const DumpInput& dump);

struct GroupFinding {
  std::string groupName;
  Verdict verdict;
  bool pending = false;      // some rank still waited in an operation when it dumped
  std::string dumpIncident;  // what made the ranks dump ("hang:57", "manual", ...)
  // The global rank whose process hosted the store some rank's dump says was
  // lost (StoreLostError); -1: no dump says so.
  int64_t storeLostHost = -1;
  StoreHealth storeHealth = StoreHealth::Healthy;  // how that store was lost (not answering, or gone)
};

// One finding per group found in the dumps, in group-name order. `absent`:
// the last status record of ranks (by global rank) that have no snapshot,
// when known (a live report reads them from the store), so the report says
// "exited", "left" or how old their heartbeat is.
// `notAsked`: global ranks a narrowed live report did not ask (RankInput::notAsked).
std::vector<GroupFinding> analyzeDumps(const std::vector<RankSnapshot>& snapshots,
                                       const std::map<int64_t, StatusRecord>* absent = nullptr,
                                       const std::set<int64_t>* notAsked = nullptr);

}  // namespace torch_ext
