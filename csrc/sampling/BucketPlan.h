#pragma once

// Bucket batch planning: the global plan of one epoch, computed identically on
// every rank from (bucket ids, batch sizes, seed, epoch) with no communication.
//
// The plan, step by step (the Python reference in benchmarks/sampler.py follows
// the same steps with the same generator; tests check they agree exactly):
//   1. group the sample indices by bucket, ascending within each bucket
//      (a counting sort: one pass to count, one to place);
//   2. if shuffle, shuffle each bucket's indices with stream 1 + bucket;
//   3. cut each bucket into batches of that bucket's batch size; the remainder
//      (count % batch size) is a short last batch under Policy::Pad and is
//      dropped under Policy::Drop;
//   4. order the batches bucket by bucket; if shuffle, shuffle that order with
//      stream 0;
//   5. deal: global batch k goes to rank k % W. Every rank gets the same count
//      by construction: Pad continues cyclically from the first batch to fill
//      the last round (at most W - 1 repeated batches), Drop leaves the last
//      partial round out (at most W - 1 batches unused).
//
// Resumption: the plan does not depend on the world size, so "the first C
// batches of the global order were consumed" is a complete position. Dealing
// the remaining batches [C, T) to a new world size continues the same epoch
// without repeating or skipping a sample (dealBatches' `consumed`).
//
// Memory: the plan is `order` (one index per planned sample, int32 when the
// dataset has fewer than 2^31 samples) plus one int64 offset per batch; the
// peak adds one temporary index array and one index per batch.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace torch_ext::sampling {

enum class Policy : uint8_t {
  Pad,   // every sample at least once per epoch
  Drop,  // every sample at most once per epoch
};

// Parses "pad" / "drop"; throws c10::ValueError naming the bad value otherwise.
Policy parsePolicy(const std::string& policy);
const char* policyName(Policy policy);

struct BucketPlan {
  // Sample indices of all planned batches, batch after batch in global order.
  at::Tensor order;  // int32 if num_samples < 2^31, else int64
  // Batch k is order[offsets[k] : offsets[k + 1]]; numel = num_batches + 1.
  at::Tensor offsets;  // int64

  int64_t numBatches() const {
    return offsets.numel() - 1;
  }
};

// bucket_ids: 1-D int32/int64 CPU tensor, bucket_ids[i] in [0, B) is sample
// i's bucket. batch_sizes: 1-D integer CPU tensor of length B, all >= 1.
// Throws c10::ValueError naming the offending sample, bucket or value.
BucketPlan planBucketBatches(const at::Tensor& bucketIds, const at::Tensor& batchSizes, int64_t seed, int64_t epoch,
                             bool shuffle, Policy policy);

// Batches in the plan, from per-bucket counts, without building it.
int64_t countBucketBatches(const std::vector<int64_t>& counts, const std::vector<int64_t>& batchSizes, Policy policy);

// Batches every rank gets from the batches [consumed, numBatches) dealt to
// numReplicas ranks: floor (Drop) or ceil (Pad) of remaining / numReplicas.
int64_t batchesPerRank(int64_t numBatches, int64_t consumed, int64_t numReplicas, Policy policy);

// Global batch indices rank `rank` gets, in order: (consumed + j * W + rank)
// modulo numBatches for j in [0, batchesPerRank).
std::vector<int64_t> dealBatches(int64_t numBatches, int64_t consumed, int64_t numReplicas, int64_t rank,
                                 Policy policy);

// A 64-bit digest of (bucket ids, batch sizes): a state saved for one dataset
// and bucketing is refused by a sampler built on another.
uint64_t bucketFingerprint(const at::Tensor& bucketIds, const at::Tensor& batchSizes);

}  // namespace torch_ext::sampling
