// Fingerprint: equal on every rank exactly when the ranks agree. Each
// rank-invariant argument enters the hash; per-rank ones (p2p peers, dim 0 of
// all_to_all_single, split values) do not, and are checked through the p2p pair
// hash and the additive all-to-all pairing sums instead.
#include "guard/collective/Fingerprint.h"

#include <ATen/ATen.h>

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

using torch_ext::Fingerprint;
using torch_ext::FingerprintBuilder;
using torch_ext::Op;

namespace test_fingerprint {

namespace {

constexpr auto CPU = c10::DeviceType::CPU;

at::Tensor f32(std::vector<int64_t> sizes) {
  return at::zeros(sizes, at::kFloat);
}

c10d::ReduceOp red(c10d::ReduceOp::RedOpType t) {
  return c10d::ReduceOp(t);
}

Fingerprint allReduce(const at::Tensor& t, c10d::ReduceOp::RedOpType r = c10d::ReduceOp::SUM) {
  return FingerprintBuilder(Op::AllReduce).tensor(t).reduceOp(red(r)).finish();
}

Fingerprint p2p(Op op, const at::Tensor& t, int64_t peer, int64_t tag) {
  return FingerprintBuilder(op).tensor(t).peer(peer, tag).finish();
}

// all_to_all_single on rank `me` of a group whose split matrix is m[from][to].
Fingerprint a2a(const std::vector<std::vector<int64_t>>& m, int64_t me, int64_t cols = 4) {
  std::vector<int64_t> send = m[me];
  std::vector<int64_t> recv;
  int64_t rows = 0;
  for (size_t j = 0; j < m.size(); ++j) {
    recv.push_back(m[j][me]);
    rows += m[me][j];
  }
  return FingerprintBuilder(Op::AllToAllSingle).rowShape(f32({rows, cols})).splits(me, send, recv).finish();
}

Fingerprint a2aRank(int64_t me, const std::vector<int64_t>& send, const std::vector<int64_t>& recv) {
  return FingerprintBuilder(Op::AllToAllSingle).rowShape(f32({3, 4})).splits(me, send, recv).finish();
}

}  // namespace

TEST(Fingerprint, EqualInputsGiveEqualHashes) {
  auto a = allReduce(f32({4, 8}));
  auto b = allReduce(at::ones({4, 8}, at::kFloat));       // values never matter
  auto c = allReduce(at::zeros({8, 4}, at::kFloat).t());  // nor strides
  EXPECT_NE(a.hash, 0u);
  EXPECT_EQ(a.hash, b.hash);
  EXPECT_EQ(a.hash, c.hash);
  // meta() is tensor() without a tensor.
  auto d = FingerprintBuilder(Op::AllReduce).meta(at::kFloat, {4, 8}, CPU).reduceOp(red(c10d::ReduceOp::SUM)).finish();
  EXPECT_EQ(a.hash, d.hash);
  EXPECT_EQ(a.numTensors, 1u);
  ASSERT_EQ(a.metas.size(), 1u);
  EXPECT_EQ(a.metas[0].dtype, at::kFloat);
  EXPECT_EQ(std::vector<int64_t>(a.metas[0].sizes.begin(), a.metas[0].sizes.end()), (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(a.reduceOp, 0);
  EXPECT_EQ(a.root, -1);
  EXPECT_EQ(a.splitSend, 0u);
  EXPECT_EQ(a.splitRecv, 0u);
}

TEST(Fingerprint, EveryRankInvariantArgumentChangesTheHash) {
  const std::vector<std::pair<std::string, Fingerprint>> fps = {
      {"base", allReduce(f32({10}))},
      {"op", FingerprintBuilder(Op::AllReduceCoalesced).tensor(f32({10})).reduceOp(red(c10d::ReduceOp::SUM)).finish()},
      {"dtype", allReduce(at::zeros({10}, at::kDouble))},
      {"shape, same numel", allReduce(f32({2, 5}))},
      {"shape, transposed", allReduce(f32({5, 2}))},
      {"numel", allReduce(f32({11}))},
      {"0-dim", allReduce(f32({}))},
      {"reduce op", allReduce(f32({10}), c10d::ReduceOp::MAX)},
      {"no reduce op", FingerprintBuilder(Op::AllReduce).tensor(f32({10})).finish()},
      {"two tensors", FingerprintBuilder(Op::AllReduce)
                          .tensor(f32({10}))
                          .tensor(f32({10}))
                          .reduceOp(red(c10d::ReduceOp::SUM))
                          .finish()},
      {"undefined tensor",
       FingerprintBuilder(Op::AllReduce).tensor(at::Tensor()).reduceOp(red(c10d::ReduceOp::SUM)).finish()},
      {"root 0",
       FingerprintBuilder(Op::AllReduce).tensor(f32({10})).reduceOp(red(c10d::ReduceOp::SUM)).root(0).finish()},
      {"root 1",
       FingerprintBuilder(Op::AllReduce).tensor(f32({10})).reduceOp(red(c10d::ReduceOp::SUM)).root(1).finish()},
  };
  std::set<uint64_t> hashes;
  for (const auto& [what, fp] : fps) {
    EXPECT_TRUE(hashes.insert(fp.hash).second) << what << " collides with an earlier variant";
  }
  {
    SCOPED_TRACE("RootOfRootedCollectivesEntersTheHash");
    for (Op op : {Op::Broadcast, Op::Reduce, Op::Gather, Op::Scatter}) {
      auto r0 = FingerprintBuilder(op).tensor(f32({10})).root(0).finish();
      auto r0b = FingerprintBuilder(op).tensor(f32({10})).root(0).finish();
      auto r1 = FingerprintBuilder(op).tensor(f32({10})).root(1).finish();
      EXPECT_EQ(r0.hash, r0b.hash) << torch_ext::opName(op);
      EXPECT_NE(r0.hash, r1.hash) << torch_ext::opName(op);
      EXPECT_EQ(r1.root, 1);
    }
  }
  {
    SCOPED_TRACE("EveryOpHashesDifferently");
    std::set<uint64_t> hashes;
    for (size_t i = 0; i < static_cast<size_t>(Op::NumOps); ++i) {
      auto fp = FingerprintBuilder(static_cast<Op>(i)).tensor(f32({3})).finish();
      EXPECT_TRUE(hashes.insert(fp.hash).second) << torch_ext::opName(static_cast<Op>(i));
    }
  }
}

TEST(Fingerprint, P2PPeerAndTagStayOutOfTheHashButTagEntersThePairHash) {
  auto s = p2p(Op::Send, f32({4}), 1, 0);
  auto otherPeer = p2p(Op::Send, f32({4}), 2, 0);
  auto otherTag = p2p(Op::Send, f32({4}), 1, 7);
  EXPECT_EQ(s.root, 1);
  EXPECT_EQ(s.tag, 0);
  EXPECT_EQ(otherTag.tag, 7);
  EXPECT_EQ(s.hash, otherPeer.hash);
  EXPECT_EQ(s.hash, otherTag.hash);

  // Pair hash: dtype, element count and tag; not the peer, not the op, not the shape.
  EXPECT_EQ(s.p2pPairHash(), otherPeer.p2pPairHash());
  EXPECT_NE(s.p2pPairHash(), otherTag.p2pPairHash());
  auto recv = p2p(Op::Recv, f32({4}), 0, 0);
  EXPECT_NE(s.hash, recv.hash);
  EXPECT_EQ(s.p2pPairHash(), recv.p2pPairHash());
  EXPECT_EQ(s.p2pPairHash(), p2p(Op::Recv, f32({2, 2}), 0, 0).p2pPairHash());
  EXPECT_EQ(s.p2pPairHash(), p2p(Op::RecvAnySource, f32({4}), -1, 0).p2pPairHash());
  EXPECT_NE(s.p2pPairHash(), p2p(Op::Recv, f32({5}), 0, 0).p2pPairHash());
  EXPECT_NE(s.p2pPairHash(), p2p(Op::Recv, at::zeros({4}, at::kDouble), 0, 0).p2pPairHash());
  EXPECT_NE(s.p2pPairHash(), p2p(Op::Recv, f32({4}), 0, 1).p2pPairHash());
}

TEST(Fingerprint, RowShapeIgnoresDimZeroOnly) {
  auto a = FingerprintBuilder(Op::AllToAllSingle).rowShape(f32({3, 4})).finish();
  auto b = FingerprintBuilder(Op::AllToAllSingle).rowShape(f32({7, 4})).finish();
  auto c = FingerprintBuilder(Op::AllToAllSingle).rowShape(f32({3, 5})).finish();
  auto d = FingerprintBuilder(Op::AllToAllSingle).rowShape(at::zeros({3, 4}, at::kDouble)).finish();
  auto e = FingerprintBuilder(Op::AllToAllSingle).rowShape(f32({3, 4, 1})).finish();
  EXPECT_EQ(a.hash, b.hash);
  EXPECT_NE(a.hash, c.hash);
  EXPECT_NE(a.hash, d.hash);
  EXPECT_NE(a.hash, e.hash);
  // The full shape is kept for the text.
  ASSERT_EQ(b.metas.size(), 1u);
  EXPECT_EQ(std::vector<int64_t>(b.metas[0].sizes.begin(), b.metas[0].sizes.end()), (std::vector<int64_t>{7, 4}));
  // tensor() does hash dim 0.
  EXPECT_NE(FingerprintBuilder(Op::AllToAllSingle).tensor(f32({3, 4})).finish().hash,
            FingerprintBuilder(Op::AllToAllSingle).tensor(f32({7, 4})).finish().hash);
}

TEST(Fingerprint, AllToAllPairingSumsAndSplits) {
  // m[from][to]: elements (rows) rank `from` sends to rank `to`.
  const std::vector<std::vector<int64_t>> m = {{1, 2, 3, 0}, {4, 0, 5, 6}, {2, 2, 2, 2}, {0, 7, 1, 3}};
  const int64_t W = static_cast<int64_t>(m.size());
  uint64_t send = 0, recv = 0;
  std::set<uint64_t> hashes;
  for (int64_t r = 0; r < W; ++r) {
    auto fp = a2a(m, r);
    EXPECT_NE(fp.splitSend, 0u);
    EXPECT_NE(fp.splitRecv, 0u);
    send += fp.splitSend;
    recv += fp.splitRecv;
    hashes.insert(fp.hash);
  }
  EXPECT_EQ(send, recv);
  // Splits differ per rank legitimately: the hash stays equal across ranks.
  EXPECT_EQ(hashes.size(), 1u);

  // A single wrong entry anywhere breaks the equality.
  for (int64_t i = 0; i < W; ++i) {
    for (int64_t j = 0; j < W; ++j) {
      // Rank i believes it sends one more element to j than j expects.
      uint64_t s = 0, r = 0;
      for (int64_t k = 0; k < W; ++k) {
        std::vector<int64_t> sendK = m[k], recvK;
        for (int64_t x = 0; x < W; ++x) recvK.push_back(m[x][k]);
        if (k == i) sendK[j] += 1;
        auto fp = a2aRank(k, sendK, recvK);
        s += fp.splitSend;
        r += fp.splitRecv;
      }
      EXPECT_NE(s, r) << "send entry " << i << "->" << j;
      // Rank j expects one element fewer from i than i sends.
      s = 0;
      r = 0;
      for (int64_t k = 0; k < W; ++k) {
        std::vector<int64_t> recvK;
        for (int64_t x = 0; x < W; ++x) recvK.push_back(m[x][k]);
        if (k == j) recvK[i] -= 1;
        auto fp = a2aRank(k, m[k], recvK);
        s += fp.splitSend;
        r += fp.splitRecv;
      }
      EXPECT_NE(s, r) << "recv entry " << i << "->" << j;
    }
  }
  // Swapped receive counts on one rank (same multiset of amounts) also break it.
  {
    uint64_t s = 0, r = 0;
    for (int64_t k = 0; k < W; ++k) {
      std::vector<int64_t> recvK;
      for (int64_t x = 0; x < W; ++x) recvK.push_back(m[x][k]);
      if (k == 3) std::swap(recvK[1], recvK[3]);  // expects 3 from rank 1 and 6 from itself
      auto fp = a2aRank(k, m[k], recvK);
      s += fp.splitSend;
      r += fp.splitRecv;
    }
    EXPECT_NE(s, r);
  }
  {
    SCOPED_TRACE("AllToAllPeerCountEntersTheHashAndSplitsAreKeptForText");
    auto three = a2aRank(0, {1, 1, 1}, {1, 1, 1});
    auto four = a2aRank(0, {1, 1, 1, 0}, {1, 1, 1, 0});
    EXPECT_NE(three.hash, four.hash);
    EXPECT_EQ(std::vector<int64_t>(three.sendSplits.begin(), three.sendSplits.end()), (std::vector<int64_t>{1, 1, 1}));
    EXPECT_FALSE(three.splitsTruncated);

    std::vector<int64_t> many(20, 2);
    auto big = a2aRank(0, many, many);
    EXPECT_TRUE(big.splitsTruncated);
    EXPECT_EQ(big.sendSplits.size(), 16u);
    EXPECT_EQ(big.recvSplits.size(), 16u);
    EXPECT_EQ(big.describe(),
              "all_to_all_single(float32[*, 4], send=[2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,...], "
              "recv=[2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,2,...])");
  }
}

TEST(Fingerprint, TextsNamesAndNumel) {
  EXPECT_EQ(allReduce(f32({10})).describe(), "all_reduce(float32[10], SUM)");
  EXPECT_EQ(allReduce(f32({})).describe(), "all_reduce(float32[], SUM)");
  EXPECT_EQ(allReduce(at::zeros({2, 3}, at::kLong), c10d::ReduceOp::MAX).describe(), "all_reduce(int64[2, 3], MAX)");
  EXPECT_EQ(FingerprintBuilder(Op::Broadcast).tensor(f32({10})).root(0).finish().describe(),
            "broadcast(float32[10], src=0)");
  EXPECT_EQ(FingerprintBuilder(Op::Scatter).tensor(f32({10})).root(2).finish().describe(),
            "scatter(float32[10], src=2)");
  EXPECT_EQ(
      FingerprintBuilder(Op::Reduce).tensor(f32({10})).reduceOp(red(c10d::ReduceOp::MIN)).root(3).finish().describe(),
      "reduce(float32[10], MIN, dst=3)");
  EXPECT_EQ(FingerprintBuilder(Op::Gather).tensor(f32({1})).root(1).finish().describe(), "gather(float32[1], dst=1)");
  EXPECT_EQ(p2p(Op::Send, f32({4}), 1, 0).describe(), "send(float32[4], dst=1, tag=0)");
  EXPECT_EQ(p2p(Op::Recv, at::zeros({4}, at::kHalf), 0, 3).describe(), "recv(float16[4], src=0, tag=3)");
  EXPECT_EQ(p2p(Op::RecvAnySource, f32({4}), -1, 2).describe(), "recv_any_source(float32[4], src=any, tag=2)");
  EXPECT_EQ(FingerprintBuilder(Op::Barrier).finish().describe(), "barrier()");
  EXPECT_EQ(FingerprintBuilder(Op::AllReduceCoalesced)
                .tensor(f32({4}))
                .tensor(at::zeros({2, 3}, at::kLong))
                .reduceOp(red(c10d::ReduceOp::SUM))
                .finish()
                .describe(),
            "all_reduce_coalesced(2 tensors: float32[4], int64[2, 3], SUM)");
  // Only the first kInlineMetas tensors are kept; the rest show as "...".
  FingerprintBuilder five(Op::AllReduceCoalesced);
  for (int64_t n = 1; n <= 5; ++n) five.tensor(f32({n}));
  auto fp = five.reduceOp(red(c10d::ReduceOp::SUM)).finish();
  EXPECT_EQ(fp.numTensors, 5u);
  EXPECT_EQ(fp.metas.size(), Fingerprint::kInlineMetas);
  EXPECT_EQ(fp.describe(), "all_reduce_coalesced(5 tensors: float32[1], float32[2], float32[3], float32[4], ..., SUM)");
  EXPECT_EQ(FingerprintBuilder(Op::AllToAllSingle).rowShape(f32({3, 4})).splits(0, {1, 2}, {2, 1}).finish().describe(),
            "all_to_all_single(float32[*, 4], send=[1,2], recv=[2,1])");
  EXPECT_EQ(FingerprintBuilder(Op::AllToAll)
                .meta(at::kFloat, {2}, CPU)
                .meta(at::kFloat, {3}, CPU)
                .splits(1, {2, 3}, {2, 3})
                .finish()
                .describe(),
            "all_to_all(2 tensors: float32[2], float32[3], send=[2,3], recv=[2,3])");
  {
    SCOPED_TRACE("TensorMetaDescribeAndNames");
    torch_ext::TensorMeta m;
    m.dtype = at::kFloat;
    m.sizes = {4, 8};
    EXPECT_EQ(m.describe(), "float32[4, 8]");
    EXPECT_EQ(torch_ext::dtypeName(c10::ScalarType::Undefined), "undefined");
    EXPECT_EQ(torch_ext::dtypeName(at::kHalf), "float16");
    EXPECT_EQ(torch_ext::dtypeName(at::kBool), "bool");
    EXPECT_EQ(torch_ext::dtypeName(at::kBFloat16), "bfloat16");
    const char* names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
    for (int i = 0; i < 9; ++i) EXPECT_STREQ(torch_ext::reduceOpName(i), names[i]);
    EXPECT_STREQ(torch_ext::reduceOpName(-1), "");
    EXPECT_STREQ(torch_ext::reduceOpName(9), "");
    // The enum values of c10d::ReduceOp are what reduceOpName indexes.
    EXPECT_STREQ(torch_ext::reduceOpName(c10d::ReduceOp::AVG), "AVG");
    EXPECT_STREQ(torch_ext::reduceOpName(c10d::ReduceOp::BXOR), "BXOR");
  }
  {
    SCOPED_TRACE("NumelIsTheFirstTensorsElementCount");
    EXPECT_EQ(allReduce(f32({2, 3})).numel(), 6);
    EXPECT_EQ(allReduce(f32({})).numel(), 1);
    EXPECT_EQ(allReduce(f32({0, 3})).numel(), 0);
    EXPECT_EQ(FingerprintBuilder(Op::Barrier).finish().numel(), 0);
    EXPECT_EQ(FingerprintBuilder(Op::AllReduceCoalesced).tensor(f32({5})).tensor(f32({7})).finish().numel(), 5);
  }
}

TEST(Fingerprint, SizesPastEightDimensionsAreHashedCountedAndNotKept) {
  // A fingerprint keeps its sizes inline (it moves into the ledger as bytes, issue 70): the
  // first Dims::kMax, every dimension in the hash, the element count and the rank.
  const std::vector<int64_t> ten{1, 2, 1, 1, 1, 1, 1, 1, 3, 2};
  auto fp = allReduce(f32(ten));
  EXPECT_EQ(fp.describe(), "all_reduce(float32[1, 2, 1, 1, 1, 1, 1, 1, ... (10 dimensions)], SUM)");
  EXPECT_EQ(fp.numel(), 12);
  EXPECT_EQ(fp.metas[0].sizes.rank(), 10u);
  EXPECT_EQ(fp.metas[0].sizes.size(), Dims::kMax);
  std::vector<int64_t> other = ten;
  other[9] = 1;
  other[8] = 6;  // the same kept dimensions and element count, another shape
  EXPECT_NE(allReduce(f32(other)).hash, fp.hash);
  EXPECT_EQ(allReduce(f32({2, 3})).metas[0].sizes.rank(), 2u);
  static_assert(std::is_trivially_copyable_v<TensorMeta>);
}

TEST(Fingerprint, OpNamesRoundTripForEveryOp) {
  std::set<std::string> names;
  for (size_t i = 0; i < static_cast<size_t>(Op::NumOps); ++i) {
    const Op op = static_cast<Op>(i);
    const std::string name = torch_ext::opName(op);
    EXPECT_NE(name, "unknown");
    EXPECT_TRUE(names.insert(name).second) << name << " listed twice";
    const auto back = torch_ext::opFromName(name);
    ASSERT_TRUE(back.has_value()) << name;
    EXPECT_EQ(*back, op) << name;
    EXPECT_NE(torch_ext::toOpType(op), c10d::OpType::UNKNOWN) << name;
  }
  EXPECT_STREQ(torch_ext::opName(Op::AllToAllSingle), "all_to_all_single");
  EXPECT_STREQ(torch_ext::opName(Op::AllGatherIntoTensor), "all_gather_into_tensor");
  EXPECT_STREQ(torch_ext::opName(Op::NumOps), "unknown");
  EXPECT_FALSE(torch_ext::opFromName("allreduce").has_value());
  EXPECT_FALSE(torch_ext::opFromName("").has_value());
  EXPECT_EQ(torch_ext::toOpType(Op::AllReduce), c10d::OpType::ALLREDUCE);
  EXPECT_EQ(torch_ext::toOpType(Op::Send), c10d::OpType::SEND);
  EXPECT_EQ(torch_ext::toOpType(Op::AllToAllSingle), c10d::OpType::ALLTOALL_BASE);
  EXPECT_EQ(torch_ext::toOpType(Op::NumOps), c10d::OpType::UNKNOWN);
  for (size_t i = 0; i < static_cast<size_t>(Op::NumOps); ++i) {
    const Op op = static_cast<Op>(i);
    EXPECT_EQ(torch_ext::isP2P(op), op == Op::Send || op == Op::Recv || op == Op::RecvAnySource)
        << torch_ext::opName(op);
  }
}

TEST(Fingerprint, WhoMayFinishBeforeThePeersItWaitsFor) {
  auto fp = [](Op op, int64_t root) {
    FingerprintBuilder b(op);
    b.tensor(at::ones({4}));
    if (root >= 0) b.root(root);
    return b.finish();
  };
  // Needs its peers whatever the mode: a receive, an all_reduce, a broadcast's receiver.
  EXPECT_FALSE(fp(Op::Recv, 1).mayFinishAlone(0, false));
  EXPECT_FALSE(fp(Op::AllReduce, -1).mayFinishAlone(0, false));
  EXPECT_FALSE(fp(Op::Broadcast, 1).mayFinishAlone(0, false));
  EXPECT_FALSE(fp(Op::Reduce, 0).mayFinishAlone(0, false));
  // Only sends: a send (the transport may buffer it), a broadcast's root, a reduce's non-root.
  EXPECT_TRUE(fp(Op::Send, 1).mayFinishAlone(0, false));
  EXPECT_TRUE(fp(Op::Broadcast, 0).mayFinishAlone(0, false));
  EXPECT_TRUE(fp(Op::Reduce, 1).mayFinishAlone(0, false));
  EXPECT_TRUE(fp(Op::Gather, 1).mayFinishAlone(0, false));
  // verify and strict hold every collective's result until each rank is known to have issued it.
  EXPECT_FALSE(fp(Op::Broadcast, 0).mayFinishAlone(0, true));
  EXPECT_FALSE(fp(Op::Reduce, 1).mayFinishAlone(0, true));
  EXPECT_TRUE(fp(Op::Send, 1).mayFinishAlone(0, true));
}

}  // namespace test_fingerprint
