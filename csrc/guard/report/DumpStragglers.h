#pragma once

// DumpStragglers: the watchdog's straggler rule (StragglerBoard) applied to
// the wait windows that dumps and live snapshots carry (GroupView::
// waitWindows), for `python -m torch_ext.diagnose` and the live report. One
// rule names stragglers everywhere: the live warning, torch_ext.stragglers(),
// the post-mortem and the live report.
//
// A snapshot holds each rank's last few closed windows per level
// (WaitWindows::kKept), not the watchdog's history of 32, so one look at them
// names a rank only when it was late in all of the windows at the finest
// level every rank shows (StragglerBoard::kMinWindows): a post-mortem says
// less than the running job did, never something else.

#include "guard/report/Json.h"
#include "guard/report/Snapshot.h"

#include <vector>

namespace torch_ext {

// One JSON object per group in the snapshots (first seen first): what
// stragglersJson() gives torch_ext.stragglers(), plus "group_name",
// "first_seq"/"last_seq"/"collectives" (the windows analysed; null/0 when
// none could be: a rank without windows, too few collectives) and "ranks":
// [{rank (global), wait_s, span_s, wait_share}] over those windows.
std::vector<Json> stragglersFromSnapshots(const std::vector<RankSnapshot>& snapshots, double threshold);

}  // namespace torch_ext
