// Bucket batch planning (csrc/sampling): the plan's invariants, determinism,
// the policies' guarantees, dealing equal counts to every rank, resuming on
// another world size, and errors that name the bad value.
#include "sampling/BucketPlan.h"
#include "sampling/Rng.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

using torch_ext::sampling::batchesPerRank;
using torch_ext::sampling::bucketFingerprint;
using torch_ext::sampling::BucketPlan;
using torch_ext::sampling::dealBatches;
using torch_ext::sampling::parsePolicy;
using torch_ext::sampling::planBucketBatches;
using torch_ext::sampling::Policy;

namespace test_bucket_plan {

namespace {

at::Tensor ids(const std::vector<int32_t>& v) {
  return at::tensor(v, at::TensorOptions().dtype(at::kInt));
}

at::Tensor sizes(const std::vector<int64_t>& v) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong));
}

// Skewed buckets: bucket b holds about 1/(b+1) of the samples.
at::Tensor skewedIds(int64_t n, int64_t numBuckets, uint64_t seed) {
  torch_ext::sampling::SplitMix64 rng(seed);
  std::vector<int32_t> out(n);
  for (auto& id : out) {
    int64_t b = static_cast<int64_t>(rng.bounded(static_cast<uint64_t>(numBuckets * numBuckets)));
    id = static_cast<int32_t>(std::min<int64_t>(numBuckets - 1, b / (b / numBuckets + 1) % numBuckets));
  }
  return ids(out);
}

std::vector<std::vector<int64_t>> batchesOf(const BucketPlan& plan) {
  const at::Tensor order = plan.order.to(at::kLong);
  const int64_t* o = order.data_ptr<int64_t>();
  const int64_t* off = plan.offsets.data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> out;
  for (int64_t k = 0; k < plan.numBatches(); ++k) {
    out.emplace_back(o + off[k], o + off[k + 1]);
  }
  return out;
}

std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::ValueError& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace

TEST(BucketPlan, EveryBatchIsOneBucketOfItsSizeAndPadUsesEverySampleOnce) {
  const at::Tensor bucketIds = skewedIds(5000, 7, 1);
  const at::Tensor batchSizes = sizes({3, 8, 5, 1, 16, 7, 2});
  const BucketPlan plan = planBucketBatches(bucketIds, batchSizes, 42, 3, true, Policy::Pad);
  const int32_t* id = bucketIds.data_ptr<int32_t>();
  std::vector<int64_t> seen(5000, 0);
  std::map<int32_t, int64_t> shortBatches;
  for (const auto& batch : batchesOf(plan)) {
    ASSERT_FALSE(batch.empty());
    const int32_t bucket = id[batch[0]];
    for (int64_t s : batch) {
      EXPECT_EQ(id[s], bucket) << "a batch mixes buckets";
      ++seen[s];
    }
    const int64_t size = batchSizes[bucket].item<int64_t>();
    EXPECT_LE(static_cast<int64_t>(batch.size()), size);
    if (static_cast<int64_t>(batch.size()) < size) {
      ++shortBatches[bucket];
    }
  }
  for (int64_t s = 0; s < 5000; ++s) {
    EXPECT_EQ(seen[s], 1) << "sample " << s;
  }
  for (const auto& [bucket, count] : shortBatches) {
    EXPECT_EQ(count, 1) << "bucket " << bucket << " has more than one short batch";
  }
}

TEST(BucketPlan, DropUsesOnlyFullBatchesAndEachSampleAtMostOnce) {
  const at::Tensor bucketIds = skewedIds(3001, 5, 2);
  const at::Tensor batchSizes = sizes({4, 9, 6, 32, 5});
  const BucketPlan plan = planBucketBatches(bucketIds, batchSizes, 0, 0, true, Policy::Drop);
  const at::Tensor counts = at::bincount(bucketIds.to(at::kLong), {}, 5);
  int64_t expectedSamples = 0;
  for (int b = 0; b < 5; ++b) {
    expectedSamples += counts[b].item<int64_t>() / batchSizes[b].item<int64_t>() * batchSizes[b].item<int64_t>();
  }
  EXPECT_EQ(plan.order.numel(), expectedSamples);
  std::set<int64_t> seen;
  const int32_t* id = bucketIds.data_ptr<int32_t>();
  for (const auto& batch : batchesOf(plan)) {
    EXPECT_EQ(static_cast<int64_t>(batch.size()), batchSizes[id[batch[0]]].item<int64_t>());
    for (int64_t s : batch) {
      EXPECT_TRUE(seen.insert(s).second) << "sample " << s << " used twice";
    }
  }
}

TEST(BucketPlan, DeterministicInSeedAndEpochAndDifferentAcrossThem) {
  const at::Tensor bucketIds = skewedIds(2000, 4, 3);
  const at::Tensor batchSizes = sizes({4, 4, 8, 2});
  auto plan = [&](int64_t seed, int64_t epoch) {
    return batchesOf(planBucketBatches(bucketIds, batchSizes, seed, epoch, true, Policy::Pad));
  };
  EXPECT_EQ(plan(7, 1), plan(7, 1));
  EXPECT_NE(plan(7, 1), plan(7, 2));
  EXPECT_NE(plan(7, 1), plan(8, 1));
  EXPECT_EQ(plan(-1, 0), plan(-1, 0));  // negative seeds are taken modulo 2^64
}

TEST(BucketPlan, WithoutShuffleBatchesAreBucketMajorAndAscending) {
  const BucketPlan plan = planBucketBatches(ids({1, 0, 1, 0, 0, 1, 1}), sizes({2, 3}), 5, 5, false, Policy::Pad);
  const std::vector<std::vector<int64_t>> expected = {{1, 3}, {4}, {0, 2, 5}, {6}};
  EXPECT_EQ(batchesOf(plan), expected);
}

TEST(BucketPlan, Int64IdsGiveTheSamePlanAsInt32) {
  const at::Tensor small = skewedIds(777, 3, 4);
  const at::Tensor batchSizes = sizes({5, 3, 4});
  const auto a = batchesOf(planBucketBatches(small, batchSizes, 9, 2, true, Policy::Pad));
  const auto b = batchesOf(planBucketBatches(small.to(at::kLong), batchSizes, 9, 2, true, Policy::Pad));
  EXPECT_EQ(a, b);
  EXPECT_EQ(bucketFingerprint(small, batchSizes), bucketFingerprint(small.to(at::kLong), batchSizes));
}

TEST(BucketPlan, EmptyDatasetAndBucketsSmallerThanABatch) {
  const BucketPlan empty = planBucketBatches(ids({}), sizes({}), 0, 0, true, Policy::Pad);
  EXPECT_EQ(empty.numBatches(), 0);
  EXPECT_EQ(empty.order.numel(), 0);
  // Two samples in a bucket of batch size 4: one short batch under pad, none under drop.
  EXPECT_EQ(planBucketBatches(ids({0, 0}), sizes({4}), 0, 0, true, Policy::Pad).numBatches(), 1);
  EXPECT_EQ(planBucketBatches(ids({0, 0}), sizes({4}), 0, 0, true, Policy::Drop).numBatches(), 0);
  // A bucket with no samples contributes no batch.
  EXPECT_EQ(planBucketBatches(ids({0, 2, 2}), sizes({1, 1, 1}), 0, 0, true, Policy::Pad).numBatches(), 3);
}

TEST(BucketDeal, EveryRankGetsTheSameCountForAnyWorldSize) {
  for (Policy policy : {Policy::Pad, Policy::Drop}) {
    for (int64_t numBatches : {0, 1, 2, 7, 64, 100}) {
      for (int64_t world = 1; world <= 9; ++world) {
        const int64_t count = batchesPerRank(numBatches, 0, world, policy);
        std::vector<int64_t> uses(numBatches, 0);
        for (int64_t rank = 0; rank < world; ++rank) {
          const std::vector<int64_t> mine = dealBatches(numBatches, 0, world, rank, policy);
          ASSERT_EQ(static_cast<int64_t>(mine.size()), count);
          for (int64_t g : mine) {
            ++uses[g];
          }
        }
        const int64_t used = std::count_if(uses.begin(), uses.end(), [](int64_t u) { return u > 0; });
        const int64_t extra = std::accumulate(uses.begin(), uses.end(), int64_t{0}) - used;
        if (policy == Policy::Pad) {
          EXPECT_EQ(used, numBatches) << "pad must use every batch";
          EXPECT_LT(extra, std::max<int64_t>(world, 1)) << "pad repeats at most world - 1 batches";
        } else {
          EXPECT_EQ(extra, 0) << "drop must not repeat a batch";
          EXPECT_GT(used + world, numBatches) << "drop leaves out at most world - 1 batches";
        }
      }
    }
  }
}

TEST(BucketDeal, ResumingOnAnotherWorldSizeNeitherRepeatsNorSkips) {
  // 4 ranks consume 3 rounds (12 batches) of 50, then 3 ranks finish the epoch.
  const int64_t numBatches = 50;
  std::vector<int64_t> uses(numBatches, 0);
  for (int64_t rank = 0; rank < 4; ++rank) {
    auto mine = dealBatches(numBatches, 0, 4, rank, Policy::Drop);
    for (int64_t j = 0; j < 3; ++j) {
      ++uses[mine[j]];
    }
  }
  for (int64_t rank = 0; rank < 3; ++rank) {
    for (int64_t g : dealBatches(numBatches, 12, 3, rank, Policy::Drop)) {
      ++uses[g];
    }
  }
  // 12 consumed + 3 * floor(38 / 3) = 48: the last 2 are the drop policy's partial round.
  for (int64_t g = 0; g < numBatches; ++g) {
    EXPECT_EQ(uses[g], g < 48 ? 1 : 0) << "batch " << g;
  }
  // On the same world size, resuming continues exactly where the uninterrupted deal was.
  const auto full = dealBatches(numBatches, 0, 4, 1, Policy::Pad);
  const auto rest = dealBatches(numBatches, 12, 4, 1, Policy::Pad);
  EXPECT_EQ(std::vector<int64_t>(full.begin() + 3, full.end()), rest);
}

TEST(BucketPlan, ErrorsNameTheBadValueAndTheFix) {
  EXPECT_NE(errorOf([] {
              planBucketBatches(ids({0, 3, 1}), sizes({2, 2}), 0, 0, true, Policy::Pad);
            }).find("bucket_ids[1] = 3 is outside [0, 2)"),
            std::string::npos);
  EXPECT_NE(
      errorOf([] { planBucketBatches(ids({0, -1}), sizes({2}), 0, 0, true, Policy::Pad); }).find("bucket_ids[1] = -1"),
      std::string::npos);
  EXPECT_NE(errorOf([] {
              planBucketBatches(ids({0, 1}), sizes({2, 0}), 0, 0, true, Policy::Pad);
            }).find("batch_sizes[1] = 0"),
            std::string::npos);
  EXPECT_NE(
      errorOf([] { planBucketBatches(ids({0}), sizes({}), 0, 0, true, Policy::Pad); }).find("batch_sizes is empty"),
      std::string::npos);
  EXPECT_NE(errorOf([] { parsePolicy("padd"); }).find("policy = 'padd'"), std::string::npos);
  EXPECT_NE(errorOf([] { dealBatches(10, 11, 2, 0, Policy::Pad); }).find("consumed = 11"), std::string::npos);
  EXPECT_NE(errorOf([] { dealBatches(10, 0, 2, 2, Policy::Pad); }).find("rank = 2"), std::string::npos);
  EXPECT_NE(errorOf([] { batchesPerRank(10, 0, 0, Policy::Pad); }).find("num_replicas = 0"), std::string::npos);
  EXPECT_NE(errorOf([] {
              planBucketBatches(at::zeros({2, 2}, at::kInt), sizes({1}), 0, 0, true, Policy::Pad);
            }).find("must be 1-D"),
            std::string::npos);
}

TEST(BucketPlan, FingerprintSeesAssignmentAndBatchSizes) {
  const uint64_t base = bucketFingerprint(ids({0, 1, 1, 0}), sizes({2, 3}));
  EXPECT_EQ(base, bucketFingerprint(ids({0, 1, 1, 0}), sizes({2, 3})));
  EXPECT_NE(base, bucketFingerprint(ids({1, 0, 1, 0}), sizes({2, 3})));
  EXPECT_NE(base, bucketFingerprint(ids({0, 1, 1, 0}), sizes({2, 4})));
  EXPECT_NE(base, bucketFingerprint(ids({0, 1, 1, 0, 0}), sizes({2, 3})));
}

TEST(Rng, BoundedIsUniformEnoughAndInRange) {
  torch_ext::sampling::SplitMix64 rng(torch_ext::sampling::streamKey(1, 2, 3));
  std::vector<int64_t> hist(6, 0);
  for (int i = 0; i < 60000; ++i) {
    const uint64_t v = rng.bounded(6);
    ASSERT_LT(v, 6u);
    ++hist[v];
  }
  for (int64_t h : hist) {
    EXPECT_NEAR(h, 10000, 500);  // ~5 sigma
  }
}

}  // namespace test_bucket_plan
