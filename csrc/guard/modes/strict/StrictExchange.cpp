#include "guard/modes/strict/StrictExchange.h"

#include "guard/collective/StoreExchange.h"

#include "guard/Errors.h"
#include "guard/store/StoreKeys.h"
#include "guard/report/Messages.h"

#include <sstream>

namespace torch_ext {

namespace {

// One rank's words: its op, where, its metric syncs (no history).
constexpr size_t kMaxWordsBytes = 8192;

}  // namespace

std::vector<RankOp> exchangeStrictFingerprints(GroupState& st, const OpWords& mine, uint64_t seq,
                                               std::vector<RankMetrics>* metrics) {
  const auto& id = st.id();
  const std::string op = "the strict check of #" + std::to_string(seq);
  if (!st.store().set(keys::strictPrint(seq, id.rank), mine.encode(kMaxWordsBytes))) storeLost(st, op);
  std::vector<std::string> prints;
  for (int r = 0; r < id.size; ++r) prints.push_back(keys::strictPrint(seq, r));
  // Every rank took part in the check collective, so every rank writes its key.
  awaitGroupKeys(st, prints, op);
  auto values = st.store().multiGet(prints);
  if (!values.ok()) storeLost(st, op);
  std::vector<RankOp> ops;
  std::vector<RankMetrics> theirs;
  for (int r = 0; r < id.size; ++r) {
    OpWords words = OpWords::decode(values.value[r]);
    const int64_t globalRank = id.globalRank(r);
    ops.push_back(words.rankOp(globalRank));
    theirs.push_back(RankMetrics{globalRank, words.metricSync, std::move(words.metrics), -1});
  }
  if (metrics != nullptr) *metrics = std::move(theirs);
  auto done = st.store().add(keys::strictDone(seq), 1);
  if (done.ok() && done.value >= id.size) {
    prints.push_back(keys::strictDone(seq));
    st.store().deleteKeys(prints);
  }
  return ops;
}

}  // namespace torch_ext
