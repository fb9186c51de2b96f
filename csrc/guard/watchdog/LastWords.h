#pragma once

// LastWords: the record a rank leaves in a group's store when it ends without
// leaving the group (keys::lastWords): its ledger window and why it ended, so
// that the report of a peer it leaves waiting describes what it issued and how
// it ended instead of "did not answer". Written by the terminate handler
// (TerminateHandler.h) and at interpreter exit (Watchdog::atExit).

#include "guard/report/Snapshot.h"

#include <chrono>

namespace torch_ext {

class GroupState;

// Writes this rank's ledger window of `st` under keys::lastWords (bounded;
// nothing when the store is not healthy or the rank is alone), with `why`.
// Also called at interpreter exit for a group that failed (a rank that raised
// a verdict and ends at once leaves what it issued for the ranks still
// analysing), and for every group when an uncaught exception ends the process
// (the peers it leaves waiting say what it raised).
void publishLastWords(GroupState& st, const LastWordsWhy& why);

// The bound on each store write of the last words (the terminate handler
// waits this long for them before the process ends anyway).
constexpr auto kLastWordsStoreBound = std::chrono::milliseconds(1500);

}  // namespace torch_ext
