#pragma once

// Label: what a collective was for, as the user (or an integration such as the
// Lightning strategy) said it with torch_ext.label(...): a short text ("metric
// 'val_loss'"), optional fields, the call site that asked for the work earlier
// (its origin: a deferred collective runs far from the line that caused it), and
// an optional hint for reports. A pure value: the live side interns labels
// (collective/LabelTable.h), snapshots and dumps carry them.

#include "guard/report/Frame.h"

#include <string>
#include <utility>
#include <vector>

namespace torch_ext {

struct Label {
  std::string text;                                         // empty: no label
  std::vector<std::pair<std::string, std::string>> fields;  // in the order given
  std::vector<Frame> origin;                                // innermost first; empty when none was given
  std::string hint;                                         // said once in a report about an op with this label

  bool empty() const {
    return text.empty();
  }
  // The metric a sync with this label is for (its "metric" field: ddp_guard's
  // epoch-end syncs, torchmetrics, label(..., metric=...)); nullptr for none.
  const std::string* metric() const {
    for (const auto& [k, v] : fields) {
      if (k == "metric") return &v;
    }
    return nullptr;
  }
  // What every rank must agree on for a collective issued under this label: its
  // metric, else the module it is for (its "module" field: FSDP2's parameter
  // groups, torch_ext/_libraries.py; ranks gathering different modules' shards
  // of one shape at the same step would read each other's weights); nullptr for none.
  const std::string* identityField() const {
    if (const std::string* m = metric()) return m;
    for (const auto& [k, v] : fields) {
      if (k == "module") return &v;
    }
    return nullptr;
  }
  // "metric 'val_loss' (asked for at model.py:41 in validation_step)"; "" when empty.
  // The origin is left out when it is the line of `site` (the call site the
  // label is appended to, innermost first): a library called from the line that
  // asked for the work.
  std::string describe(const std::vector<Frame>& site = {}) const;
};

// " for metric 'val_loss' (...)", appended to the call site `site`; "" when empty.
std::string labelSuffix(const Label& label, const std::vector<Frame>& site = {});

}  // namespace torch_ext
