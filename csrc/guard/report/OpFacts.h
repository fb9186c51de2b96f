#pragma once

// OpFacts: what one operation a report shows is, as values beside the text
// that shows it ("all_reduce(float32[2177], SUM)"). A verdict carries the
// facts of every operation its text names (Verdict::shown), so that a reader
// of the report (Python: GuardError.report, torch_ext/_ddp.py naming DDP's
// gradient bucket of an all_reduce) never parses the text back.

#include "guard/report/Json.h"

#include <cstdint>
#include <string>
#include <vector>

namespace torch_ext {

struct EntryView;

struct OpFacts {
  std::string text;            // as reports write it: "all_reduce(float32[2177], SUM)"
  std::string op;              // "all_reduce" ("" when unknown: the facts are empty)
  std::string dtype;           // of its first tensor: "float32" ("" without tensors)
  std::vector<int64_t> sizes;  // of its first tensor
  int64_t tensors = 0;         // how many tensors it has (the rank-invariant ones: Fingerprint.h)
  std::string reduceOp;        // "SUM"; "" for an op that does not reduce

  bool known() const {
    return !op.empty();
  }
  bool operator==(const OpFacts& o) const = default;

  Json toJson() const;
  static OpFacts fromJson(const Json& j);
};

// The facts of a ledger entry as a snapshot or dump shows it.
OpFacts opFacts(const EntryView& e);

// Adds `f` to `shown` unless it is unknown or an entry with its text is there.
void addShown(std::vector<OpFacts>& shown, const OpFacts& f);

}  // namespace torch_ext
