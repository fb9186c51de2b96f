#include "sampling/BucketPlan.h"

#include "sampling/Rng.h"

#include <ATen/Functions.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

namespace torch_ext::sampling {

namespace detail {

constexpr uint64_t kBatchOrderStream = 0;  // bucket b shuffles with stream 1 + b

void checkIds(const at::Tensor& bucketIds) {
  TORCH_CHECK_VALUE(bucketIds.dim() == 1, "bucket_ids must be 1-D (one bucket id per sample), got shape ",
                    bucketIds.sizes());
  TORCH_CHECK_VALUE(bucketIds.scalar_type() == at::kInt || bucketIds.scalar_type() == at::kLong,
                    "bucket_ids must be int32 or int64, got ", bucketIds.scalar_type(),
                    "; map bucket keys to dense ids 0..B-1 first");
  TORCH_CHECK_VALUE(bucketIds.device().is_cpu(), "bucket_ids must be a CPU tensor, got one on ", bucketIds.device(),
                    "; planning is index bookkeeping, pass bucket_ids.cpu()");
}

std::vector<int64_t> batchSizesOf(const at::Tensor& batchSizes) {
  TORCH_CHECK_VALUE(batchSizes.dim() == 1, "batch_sizes must be 1-D (one size per bucket), got shape ",
                    batchSizes.sizes());
  TORCH_CHECK_VALUE(!at::isFloatingType(batchSizes.scalar_type()) && !at::isComplexType(batchSizes.scalar_type()) &&
                        batchSizes.scalar_type() != at::kBool,
                    "batch_sizes must be an integer tensor, got ", batchSizes.scalar_type());
  const at::Tensor sizes = batchSizes.to(at::kCPU, at::kLong).contiguous();
  const int64_t* p = sizes.data_ptr<int64_t>();
  std::vector<int64_t> out(p, p + sizes.numel());
  for (size_t b = 0; b < out.size(); ++b) {
    TORCH_CHECK_VALUE(out[b] >= 1, "batch_sizes[", b, "] = ", out[b], ": every bucket's batch size must be at least 1");
  }
  return out;
}

// One pass: counts per bucket, and the first sample whose id is out of range.
template <typename Id>
std::vector<int64_t> countBuckets(const Id* ids, int64_t n, int64_t numBuckets) {
  std::vector<int64_t> counts(numBuckets, 0);
  for (int64_t i = 0; i < n; ++i) {
    const auto id = static_cast<int64_t>(ids[i]);
    TORCH_CHECK_VALUE(id >= 0 && id < numBuckets, "bucket_ids[", i, "] = ", id, " is outside [0, ", numBuckets,
                      "): there are ", numBuckets, " batch sizes, one per bucket; give every bucket id a batch size");
    ++counts[id];
  }
  return counts;
}

std::vector<int64_t> batchesPerBucket(const std::vector<int64_t>& counts, const std::vector<int64_t>& batchSizes,
                                      Policy policy) {
  std::vector<int64_t> out(counts.size());
  for (size_t b = 0; b < counts.size(); ++b) {
    out[b] = policy == Policy::Drop ? counts[b] / batchSizes[b] : (counts[b] + batchSizes[b] - 1) / batchSizes[b];
  }
  return out;
}

template <typename Id, typename Idx>
BucketPlan plan(const Id* ids, int64_t n, const std::vector<int64_t>& batchSizes, uint64_t seed, uint64_t epoch,
                bool shuffle, Policy policy, at::ScalarType indexType) {
  const auto numBuckets = static_cast<int64_t>(batchSizes.size());
  const std::vector<int64_t> counts = countBuckets(ids, n, numBuckets);

  // 1. Counting sort: bucket b occupies grouped[bucketStart[b] : bucketStart[b + 1]].
  std::vector<int64_t> bucketStart(numBuckets + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), bucketStart.begin() + 1);
  std::vector<Idx> grouped(n);
  {
    std::vector<int64_t> cursor(bucketStart.begin(), bucketStart.end() - 1);
    for (int64_t i = 0; i < n; ++i) {
      grouped[cursor[static_cast<int64_t>(ids[i])]++] = static_cast<Idx>(i);
    }
  }

  // 2. Shuffle within buckets. Each bucket has its own stream, so buckets
  // could be shuffled in any order or in parallel with the same result. We stay
  // single-threaded on purpose: planning runs in training processes that may
  // have been forked after OpenMP started, where a parallel region can hang.
  if (shuffle) {
    for (int64_t b = 0; b < numBuckets; ++b) {
      SplitMix64 rng(streamKey(seed, epoch, 1 + static_cast<uint64_t>(b)));
      sampling::shuffle(grouped.data() + bucketStart[b], counts[b], rng);
    }
  }

  // 3. Batches per bucket; batch g of the bucket-major order is batch
  // g - batchStart[b] of bucket b.
  const std::vector<int64_t> perBucket = batchesPerBucket(counts, batchSizes, policy);
  std::vector<int64_t> batchStart(numBuckets + 1, 0);
  std::partial_sum(perBucket.begin(), perBucket.end(), batchStart.begin() + 1);
  const int64_t numBatches = batchStart[numBuckets];

  // 4. Batch order.
  std::vector<Idx> batchOrder(numBatches);
  std::iota(batchOrder.begin(), batchOrder.end(), Idx{0});
  if (shuffle) {
    SplitMix64 rng(streamKey(seed, epoch, kBatchOrderStream));
    sampling::shuffle(batchOrder.data(), numBatches, rng);
  }

  // Where batch g starts in `grouped`, and how long it is.
  auto locate = [&](int64_t g, int64_t& start, int64_t& length) {
    const auto b = std::upper_bound(batchStart.begin(), batchStart.end(), g) - batchStart.begin() - 1;
    const int64_t j = g - batchStart[b];
    start = bucketStart[b] + j * batchSizes[b];
    length = std::min(batchSizes[b], counts[b] - j * batchSizes[b]);
  };

  at::Tensor offsets = at::empty({numBatches + 1}, at::TensorOptions().dtype(at::kLong));
  int64_t* off = offsets.data_ptr<int64_t>();
  off[0] = 0;
  for (int64_t k = 0; k < numBatches; ++k) {
    int64_t start = 0, length = 0;
    locate(static_cast<int64_t>(batchOrder[k]), start, length);
    off[k + 1] = off[k] + length;
  }

  // 5. Materialise the order batch by batch (dealing is index arithmetic on
  // top of it, see dealBatches).
  at::Tensor order = at::empty({off[numBatches]}, at::TensorOptions().dtype(indexType));
  Idx* out = order.data_ptr<Idx>();
  for (int64_t k = 0; k < numBatches; ++k) {
    int64_t start = 0, length = 0;
    locate(static_cast<int64_t>(batchOrder[k]), start, length);
    std::memcpy(out + off[k], grouped.data() + start, static_cast<size_t>(length) * sizeof(Idx));
  }
  return BucketPlan{std::move(order), std::move(offsets)};
}

template <typename Id>
BucketPlan planFor(const at::Tensor& ids, const std::vector<int64_t>& batchSizes, uint64_t seed, uint64_t epoch,
                   bool shuffle, Policy policy) {
  const int64_t n = ids.numel();
  const Id* p = ids.data_ptr<Id>();
  if (n <= std::numeric_limits<int32_t>::max()) {
    return plan<Id, int32_t>(p, n, batchSizes, seed, epoch, shuffle, policy, at::kInt);
  }
  return plan<Id, int64_t>(p, n, batchSizes, seed, epoch, shuffle, policy, at::kLong);
}

void checkDeal(int64_t numBatches, int64_t consumed, int64_t numReplicas) {
  TORCH_CHECK_VALUE(numReplicas >= 1, "num_replicas = ", numReplicas, ": there must be at least one rank");
  TORCH_CHECK_VALUE(numBatches >= 0, "num_batches = ", numBatches, " is negative");
  TORCH_CHECK_VALUE(consumed >= 0 && consumed <= numBatches, "consumed = ", consumed, " is outside [0, ", numBatches,
                    "]: the epoch's plan has ", numBatches,
                    " batches; a position saved for another dataset or batch size does not fit this plan");
}

template <typename Id>
void hashInto(const Id* p, int64_t n, uint64_t (&lane)[4]) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int l = 0; l < 4; ++l) {
      lane[l] = mix64(lane[l] ^ static_cast<uint64_t>(static_cast<int64_t>(p[i + l])));
    }
  }
  for (; i < n; ++i) {
    lane[0] = mix64(lane[0] ^ static_cast<uint64_t>(static_cast<int64_t>(p[i])));
  }
}

}  // namespace detail

Policy parsePolicy(const std::string& policy) {
  if (policy == "pad") {
    return Policy::Pad;
  }
  if (policy == "drop") {
    return Policy::Drop;
  }
  TORCH_CHECK_VALUE(
      false, "policy = '", policy,
      "' is not a policy: use 'pad' (every sample at least once, up to num_replicas - 1 repeated batches) "
      "or 'drop' (every sample at most once)");
}

const char* policyName(Policy policy) {
  return policy == Policy::Pad ? "pad" : "drop";
}

BucketPlan planBucketBatches(const at::Tensor& bucketIds, const at::Tensor& batchSizes, int64_t seed, int64_t epoch,
                             bool shuffle, Policy policy) {
  detail::checkIds(bucketIds);
  const std::vector<int64_t> sizes = detail::batchSizesOf(batchSizes);
  TORCH_CHECK_VALUE(bucketIds.numel() == 0 || !sizes.empty(), "batch_sizes is empty but there are ", bucketIds.numel(),
                    " samples: give one batch size per bucket");
  const at::Tensor ids = bucketIds.contiguous();
  const auto useed = static_cast<uint64_t>(seed);
  const auto uepoch = static_cast<uint64_t>(epoch);
  if (ids.scalar_type() == at::kInt) {
    return detail::planFor<int32_t>(ids, sizes, useed, uepoch, shuffle, policy);
  }
  return detail::planFor<int64_t>(ids, sizes, useed, uepoch, shuffle, policy);
}

int64_t countBucketBatches(const std::vector<int64_t>& counts, const std::vector<int64_t>& batchSizes, Policy policy) {
  TORCH_CHECK_VALUE(counts.size() == batchSizes.size(), "got ", counts.size(), " bucket counts but ", batchSizes.size(),
                    " batch sizes: give one batch size per bucket");
  int64_t total = 0;
  for (int64_t nb : detail::batchesPerBucket(counts, batchSizes, policy)) {
    total += nb;
  }
  return total;
}

int64_t batchesPerRank(int64_t numBatches, int64_t consumed, int64_t numReplicas, Policy policy) {
  detail::checkDeal(numBatches, consumed, numReplicas);
  const int64_t remaining = numBatches - consumed;
  return policy == Policy::Drop ? remaining / numReplicas : (remaining + numReplicas - 1) / numReplicas;
}

std::vector<int64_t> dealBatches(int64_t numBatches, int64_t consumed, int64_t numReplicas, int64_t rank,
                                 Policy policy) {
  const int64_t count = batchesPerRank(numBatches, consumed, numReplicas, policy);
  TORCH_CHECK_VALUE(rank >= 0 && rank < numReplicas, "rank = ", rank, " is outside [0, num_replicas = ", numReplicas,
                    ")");
  std::vector<int64_t> out(count);
  for (int64_t j = 0; j < count; ++j) {
    // Only the Pad policy's last round reaches past numBatches; it wraps to the
    // start of the epoch's order (those batches repeat, none is skipped).
    out[j] = (consumed + j * numReplicas + rank) % numBatches;
  }
  return out;
}

uint64_t bucketFingerprint(const at::Tensor& bucketIds, const at::Tensor& batchSizes) {
  detail::checkIds(bucketIds);
  const std::vector<int64_t> sizes = detail::batchSizesOf(batchSizes);
  const at::Tensor ids = bucketIds.contiguous();
  const int64_t n = ids.numel();
  // Four independent lanes keep the multiplier pipelines busy. Values hash the
  // same whether the ids are int32 or int64.
  uint64_t lane[4] = {mix64(1), mix64(2), mix64(3), mix64(4)};
  if (ids.scalar_type() == at::kInt) {
    detail::hashInto(ids.data_ptr<int32_t>(), n, lane);
  } else {
    detail::hashInto(ids.data_ptr<int64_t>(), n, lane);
  }
  uint64_t h = mix64(static_cast<uint64_t>(n) + kGoldenGamma);
  for (uint64_t v : lane) {
    h = mix64(h ^ v);
  }
  h = mix64(h ^ static_cast<uint64_t>(sizes.size()));
  for (int64_t s : sizes) {
    h = mix64(h ^ static_cast<uint64_t>(s));
  }
  return h;
}

}  // namespace torch_ext::sampling
