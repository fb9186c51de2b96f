#pragma once

// Verdict: what a group's ranks concluded about an incident (a mismatch, a
// hang, a failure), as every rank reads it: the report's text and its facts,
// with one JSON form (the store's verdict key, dumps, the Python errors).

#include "guard/report/EnumNames.h"
#include "guard/report/Json.h"
#include "guard/report/OpFacts.h"
#include "guard/report/WaitGraph.h"

#include <cstdint>
#include <string>
#include <vector>

namespace torch_ext {

// One rank's view of one collective, for mismatch reports.
struct RankOp {
  int64_t globalRank = 0;
  bool issued = true;  // false: the rank has not reached this seq
  std::string text;    // fingerprint text, or "has not issued #57 yet (last #56)"
  std::string where;   // call site (and label, if any)
  uint64_t hash = 0;
  std::string hint;    // the hint of the op's label, if any
  OpFacts facts;       // what it issued, as values (unknown when not issued)
  std::string caller;  // the line that called the call site ("" when none): shown where it tells ranks apart
};

struct Verdict {
  enum class Kind : uint8_t { None, Mismatch, Hang, Failure };
  Kind kind = Kind::None;
  std::string text;
  int64_t reporter = -1;  // global rank that logs the report
  uint64_t seq = 0;
  std::string group;     // group label
  std::string incident;  // incident id
  std::string op;        // hang/failure: the stuck op's text
  // Hang/failure: global ranks by where they are.
  std::vector<int64_t> waiting, notArrived, gone, completed;
  // Mismatch: what each rank issued at `seq`.
  std::vector<RankOp> ops;
  // Hang/failure: what the waits across groups form (WaitGraph): a cycle
  // (a deadlock across `cycleGroups`, by label) or a chain ending at `waitsFor`.
  WaitShape shape = WaitShape::None;
  std::vector<std::string> cycleGroups;
  // Cycle: every rank of the loop blocks in its wait (WaitFinding::certain):
  // a deadlock that can never resolve, ended at once (Config::endCertain).
  bool certain = false;
  std::vector<int64_t> waitsFor;
  // Cycle or chain: its sites, each waiting for ranks of the next (the
  // HTML view draws them).
  std::vector<WaitSite> sites;
  // The facts of each operation the text names (OpFacts.h), once per text.
  std::vector<OpFacts> shown;

  static const char* kindName(Kind k);
  Json toJson() const;
  static Verdict fromJson(const Json& j);
};

template <>
struct EnumTable<Verdict::Kind> {
  static constexpr NamedValue<Verdict::Kind> kEntries[] = {
      {Verdict::Kind::None, "none"},
      {Verdict::Kind::Mismatch, "mismatch"},
      {Verdict::Kind::Hang, "hang"},
      {Verdict::Kind::Failure, "failure"},
  };
};

inline const char* Verdict::kindName(Kind k) {
  return enumName(k);
}

}  // namespace torch_ext
