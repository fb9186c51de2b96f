#pragma once

// StoreExchange: what ranks exchange through the group's store while an
// operation waits, in waits that a group failure (a deadline, a lost store)
// ends with the group's error instead of a hang (short bounded slices through
// GroupStore).
//
// Point-to-point prints: a sender publishes its fingerprint, its receiver
// reads it (strict, before posting the receive: gloo aborts a receiving
// process on an oversized message, so nothing after the receive could report
// it; verify's P2PPairing builds the same print from the words it receives)
// and one function says whether the two pair, failing the group when not.

#include "guard/collective/Fingerprint.h"
#include "guard/collective/GroupState.h"
#include "guard/report/OpWords.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch_ext {

// The store stopped answering during `op`: raises the group's failure once
// the watchdog has set it (within a few exchange intervals), else StoreLostError.
[[noreturn]] void storeLost(GroupState& st, const std::string& op);
// Waits until every one of `keys` exists; throws the group's error if it fails meanwhile.
void awaitGroupKeys(GroupState& st, const std::vector<std::string>& keys, const std::string& op);

// A send's print is its OpWords (report/OpWords.h): text, where, and as its
// hash the pair hash (Fingerprint::p2pPairHash) its receive must match.
// Sender side; false when the store did not take it.
bool publishP2PPrint(GroupState& st, const std::string& key, const OpWords& print);
// Receiver side: waits for the sender's print and removes it; throws the
// group's error if the group fails meanwhile.
OpWords awaitP2PPrint(GroupState& st, const std::string& key, const std::string& op);
// The same without waiting: the print if the sender has published it.
std::optional<OpWords> takeP2PPrintIfThere(GroupState& st, const std::string& key, const std::string& op);

// True when `theirs` (the sender's print) pairs with receive `fp`; else the
// difference is published to every rank as a verdict, fails the group, and
// with `raise` is thrown here too (strict receives, P2PPairing).
bool p2pPairsOrFails(const std::shared_ptr<GroupState>& state, const OpWords& theirs, const Fingerprint& fp,
                     uint64_t ordinal, int src, const std::string& where, bool raise);

}  // namespace torch_ext
