#include "guard/watchdog/LastWords.h"

#include "guard/Clock.h"
#include "guard/collective/GroupState.h"
#include "guard/store/StoreKeys.h"
#include "guard/watchdog/Dumps.h"

#include <unistd.h>

#include <chrono>

namespace torch_ext {

namespace {

constexpr size_t kLedgerWindow = 64;  // the last collectives of the ledger the record carries

}  // namespace

void publishLastWords(GroupState& st, const LastWordsWhy& why) {
  if (st.id().size < 2 || st.store().health() != StoreHealth::Healthy) return;
  RankSnapshot snap;
  snap.rank = st.id().globalRank(st.id().rank);
  snap.pid = static_cast<int64_t>(getpid());
  snap.hostname = hostname();
  snap.timeNs = wallNs();
  snap.incident = why.encode();
  snap.groups.push_back(groupView(st, kLedgerWindow));
  st.store().set(keys::lastWords(st.id().rank), toJson(snap).dump(), kLastWordsStoreBound);
}

}  // namespace torch_ext
