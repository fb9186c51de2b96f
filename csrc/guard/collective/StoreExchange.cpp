#include "guard/collective/StoreExchange.h"

#include "guard/Errors.h"
#include "guard/report/Messages.h"

#include <algorithm>
#include <sstream>

namespace torch_ext {

namespace {

// One slice of a wait: short, so a group failure ends it quickly.
constexpr std::chrono::milliseconds kSlice{100};
// A print's words: its text and where (no history).
constexpr size_t kMaxPrintBytes = 4096;

}  // namespace

// The store stopped answering: the watchdog fails the group within a tick;
// raise that failure, or say so plainly if it has not come yet.
[[noreturn]] void storeLost(GroupState& st, const std::string& op) {
  st.waitUntil([] { return false; },
               std::chrono::milliseconds(static_cast<int64_t>(std::max(1.0, 4 * st.exchangeIntervalS()) * 1000)));
  if (st.failed()) st.throwFailure(op);
  throw StoreLostError(st.store().channel().describeLoss() + " (during " + op + " on group \"" + st.label() + "\")");
}

// Waits for `keys` in slices until they exist or the group fails.
void awaitGroupKeys(GroupState& st, const std::vector<std::string>& keys, const std::string& op) {
  while (true) {
    if (st.failed()) st.throwFailure(op);
    auto r = st.store().waitFor(keys, kSlice);
    if (!r.ok()) {
      if (r.status == CallStatus::Failed) {  // the store answered with an error: try again shortly
        st.waitUntil([] { return false; }, kSlice);
        continue;
      }
      storeLost(st, op);
    }
    if (r.value) return;
  }
}

bool publishP2PPrint(GroupState& st, const std::string& key, const OpWords& print) {
  return st.store().set(key, print.encode(kMaxPrintBytes));  // the receiver deletes it
}

std::optional<OpWords> takeP2PPrintIfThere(GroupState& st, const std::string& key, const std::string& op) {
  if (st.failed()) st.throwFailure(op);
  auto there = st.store().check({key});
  if (!there.ok()) {
    if (there.status == CallStatus::Failed) return std::nullopt;  // the store answered with an error: try later
    storeLost(st, op);
  }
  if (!there.value) return std::nullopt;
  return awaitP2PPrint(st, key, op);
}

OpWords awaitP2PPrint(GroupState& st, const std::string& key, const std::string& op) {
  awaitGroupKeys(st, {key}, op);
  auto raw = st.store().get(key);
  if (!raw) storeLost(st, op);
  st.store().deleteKeys({key});
  return OpWords::decode(*raw);
}

bool p2pPairsOrFails(const std::shared_ptr<GroupState>& state, const OpWords& theirs, const Fingerprint& fp,
                     uint64_t ordinal, int src, const std::string& where, bool raise) {
  if (theirs.hash == fp.p2pPairHash()) return true;
  // Found here alone: the desk publishes it for the sender and the others
  // before the group fails (and this rank raises it).
  Difference d;
  d.kind = Difference::Kind::SendRecv;
  d.group = state->label();
  d.groupSize = state->id().size;
  d.sender = {state->id().globalRank(src), theirs.text, ordinal, theirs.where};
  d.receiver = {state->id().globalRank(state->id().rank), fp.describe(), ordinal, where};
  state->incidents().failGroup(*state, GroupFailure::of(std::move(d)));
  if (raise) state->throwFailure("");
  return false;
}

}  // namespace torch_ext
