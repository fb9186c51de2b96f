// nccl_sim's count agreement (nccl_sim/CountAgreement.h): which exchanges fit
// across ranks. The stream's use of it (a hang, then the guard's verdict) runs
// in tests/python/test_paths.py and test_device_path.py.

#include "nccl_sim/CountAgreement.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

using torch_ext::nccl_sim::Agreement;
using torch_ext::nccl_sim::agreementRow;
using torch_ext::nccl_sim::AgreementWord;
using torch_ext::nccl_sim::compareCounts;
using torch_ext::nccl_sim::compareRows;
using torch_ext::nccl_sim::splitBytes;

namespace test_count_agreement {

namespace {

std::vector<std::vector<int64_t>> rowsOf(const std::vector<Agreement>& ranks) {
  std::vector<std::vector<int64_t>> rows;
  for (const auto& a : ranks) rows.push_back(agreementRow(a, static_cast<int>(ranks.size())));
  return rows;
}

Agreement allGather(int64_t n) {
  return AgreementWord("all_gather_into_tensor").bytes(at::zeros({n})).bytes(at::zeros({3 * n})).collective();
}

}  // namespace

TEST(CountAgreement, TheSameCollectiveFitsOnEveryRank) {
  EXPECT_EQ(compareRows(rowsOf({allGather(4), allGather(4), allGather(4)}), 3), "");
}

TEST(CountAgreement, AnAllGatherOfOtherSizeOnOneRankDoesNotFitAndNamesIt) {
  // PyTorch #174844's shape: rank 1 gathers 6 elements, the others 4.
  const auto diff = compareRows(rowsOf({allGather(4), allGather(6), allGather(4)}), 3);
  EXPECT_NE(diff.find("on rank 1 than on rank 0"), std::string::npos) << diff;
}

TEST(CountAgreement, AnotherOperationOrDtypeWidthOrRootDoesNotFit) {
  const auto ar = AgreementWord("all_reduce").bytes(std::vector<at::Tensor>{at::zeros({4})}).collective();
  const auto bc = AgreementWord("broadcast").add(0).add(0).bytes(std::vector<at::Tensor>{at::zeros({4})}).collective();
  EXPECT_NE(compareRows(rowsOf({ar, bc}), 2), "");
  const auto f64 = AgreementWord("all_reduce").bytes(std::vector<at::Tensor>{at::zeros({4}, at::kDouble)}).collective();
  EXPECT_NE(compareRows(rowsOf({ar, f64}), 2), "");
  const auto root1 =
      AgreementWord("broadcast").add(1).add(0).bytes(std::vector<at::Tensor>{at::zeros({4})}).collective();
  EXPECT_NE(compareRows(rowsOf({bc, root1}), 2), "");
  // The same bytes in another dtype fit, as on NCCL (it moves bytes).
  const auto i32 = AgreementWord("all_reduce").bytes(std::vector<at::Tensor>{at::zeros({4}, at::kInt)}).collective();
  EXPECT_EQ(compareRows(rowsOf({ar, i32}), 2), "");
}

TEST(CountAgreement, AnUnevenAllToAllFitsWhenEverySendMeetsItsReceive) {
  // Rank 0 sends 1 row to itself and 3 to rank 1; rank 1 sends 2 to rank 0 and 2 to itself.
  const auto t = at::zeros({4, 2});
  Agreement a0 = AgreementWord("all_to_all_single").collective();
  a0.sendTo = splitBytes(t, {1, 3}, 2);
  a0.recvFrom = splitBytes(t, {1, 2}, 2);
  Agreement a1 = AgreementWord("all_to_all_single").collective();
  a1.sendTo = splitBytes(t, {2, 2}, 2);
  a1.recvFrom = splitBytes(t, {3, 2}, 2);
  EXPECT_EQ(a0.sendTo, (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(compareRows(rowsOf({a0, a1}), 2), "");
  a1.recvFrom = splitBytes(t, {2, 2}, 2);  // rank 1 expects 2 rows from rank 0, which sends 3
  EXPECT_EQ(compareRows(rowsOf({a0, a1}), 2), "rank 0 sends 24 bytes to rank 1, which expects 16");
}

TEST(CountAgreement, EqualSplitsAreTheTensorInEqualParts) {
  EXPECT_EQ(splitBytes(at::zeros({6}), {}, 3), (std::vector<int64_t>{8, 8, 8}));
}

TEST(CountAgreement, AReceiveMustMeetASendOfItsOwnLength) {
  Agreement::PeerCount recv{false, 0, 5, 24};
  EXPECT_EQ(compareCounts(recv, 24), "");
  EXPECT_EQ(compareCounts(recv, 16), "rank 0 sends 16 bytes (tag 5) into a receive of 24 bytes");
}

TEST(CountAgreement, ABlockAgreesOnceForAllItsOperations) {
  Agreement block;
  block.merge(allGather(4));
  block.merge(allGather(2));
  Agreement::PeerCount send{true, 1, 0, 8};
  Agreement p2p;
  p2p.p2p.push_back(send);
  block.merge(p2p);
  EXPECT_TRUE(block.collective);
  EXPECT_EQ(block.p2p.size(), 1u);
  Agreement same;
  same.merge(allGather(4));
  same.merge(allGather(2));
  EXPECT_EQ(block.word, same.word);
  Agreement swapped;  // the same collectives in another order differ
  swapped.merge(allGather(2));
  swapped.merge(allGather(4));
  EXPECT_NE(block.word, swapped.word);
}

}  // namespace test_count_agreement
