#pragma once

// StrictExchange: strict mode's exchanges through the store.
//
//  - After the check collective saw different hashes, every rank publishes its
//    full fingerprint and reads all others', so every rank raises the same
//    report.
//  - Point-to-point: the sender publishes its fingerprint, the receiver reads
//    it before posting the receive (gloo aborts a receiving process on an
//    oversized message, so nothing after the receive could report it).
//
// Waits run in short bounded slices through the group's GroupStore, so a group
// failure (a deadline, a lost store) ends them with the group's error instead
// of a hang.

#include "guard/collective/Fingerprint.h"
#include "guard/collective/GroupState.h"
#include "guard/report/Report.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch_ext {

// Every rank's fingerprint at `seq`; throws the group's error if it fails
// meanwhile (e.g. the store is lost). `where`: the call site (and label);
// `caller`: the line that called it ("" when none).
// `hint`: the hint of the label active on this rank, if any.
// `metrics` (optional): this rank's metric syncs around `seq` (`names`, and
// `known` set when the op at `seq` is itself a metric sync); on return, every
// rank's, in group-rank order.
std::vector<RankOp> exchangeStrictFingerprints(GroupState& st, const Fingerprint& fp, uint64_t seq,
                                               const std::string& where, const std::string& caller,
                                               const std::string& hint = std::string(),
                                               std::vector<RankMetrics>* metrics = nullptr);

struct P2PPrint {
  std::string text;   // fingerprint text
  std::string where;  // call site
  uint64_t pair = 0;  // p2pPairHash
};

// Sender side; false when the store did not take it.
bool publishP2PPrint(GroupState& st, const std::string& key, const P2PPrint& print);
// Receiver side: waits for the sender's print and removes it; throws the
// group's error if the group fails meanwhile.
P2PPrint awaitP2PPrint(GroupState& st, const std::string& key, const std::string& op);
// The same without waiting: the print if the sender has published it.
std::optional<P2PPrint> takeP2PPrintIfThere(GroupState& st, const std::string& key, const std::string& op);

// True when `theirs` (the sender's print) pairs with receive `fp`; else the
// difference is published to every rank as a verdict, fails the group, and
// with `raise` is thrown here too (strict receives, P2PPairing).
bool p2pPairsOrFails(const std::shared_ptr<GroupState>& state, const P2PPrint& theirs, const Fingerprint& fp,
                     uint64_t ordinal, int src, const std::string& where, bool raise);

}  // namespace torch_ext
