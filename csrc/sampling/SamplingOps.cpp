// torch.ops.torch_ext bucket planning ops: the only door from Python to
// sampling/BucketPlan. Typed wrappers live in torch_ext/samplers.py.
//
// The kernels are CompositeExplicitAutograd: they only do index bookkeeping on
// CPU tensors (the C++ checks name a CUDA input and say to pass .cpu()), their
// outputs are integer tensors with no gradient, and `bucket_deal` has no tensor
// argument at all, which the dispatcher routes to this key.

#include "sampling/BucketPlan.h"

#include <ATen/Functions.h>
#include <torch/library.h>

#include <tuple>

namespace torch_ext::sampling {
namespace {

std::tuple<at::Tensor, at::Tensor> bucketPlanOp(const at::Tensor& bucketIds, const at::Tensor& batchSizes, int64_t seed,
                                                int64_t epoch, bool shuffle, c10::string_view policy) {
  BucketPlan plan = planBucketBatches(bucketIds, batchSizes, seed, epoch, shuffle, parsePolicy(std::string(policy)));
  return {std::move(plan.order), std::move(plan.offsets)};
}

at::Tensor bucketDealOp(int64_t numBatches, int64_t consumed, int64_t numReplicas, int64_t rank,
                        c10::string_view policy) {
  std::vector<int64_t> batches = dealBatches(numBatches, consumed, numReplicas, rank, parsePolicy(std::string(policy)));
  at::Tensor out = at::empty({static_cast<int64_t>(batches.size())}, at::TensorOptions().dtype(at::kLong));
  std::copy(batches.begin(), batches.end(), out.data_ptr<int64_t>());
  return out;
}

int64_t bucketFingerprintOp(const at::Tensor& bucketIds, const at::Tensor& batchSizes) {
  // Returned as a signed int64 (the schema's int); Python masks it back.
  return static_cast<int64_t>(bucketFingerprint(bucketIds, batchSizes));
}

}  // namespace
}  // namespace torch_ext::sampling

TORCH_LIBRARY_FRAGMENT(torch_ext, m) {
  m.def(
      "bucket_plan(Tensor bucket_ids, Tensor batch_sizes, int seed, int epoch, bool shuffle, str policy) "
      "-> (Tensor order, Tensor batch_offsets)");
  m.def("bucket_deal(int num_batches, int consumed, int num_replicas, int rank, str policy) -> Tensor");
  m.def("bucket_fingerprint(Tensor bucket_ids, Tensor batch_sizes) -> int");
}

TORCH_LIBRARY_IMPL(torch_ext, CompositeExplicitAutograd, m) {
  m.impl("bucket_plan", &torch_ext::sampling::bucketPlanOp);
  m.impl("bucket_deal", &torch_ext::sampling::bucketDealOp);
  m.impl("bucket_fingerprint", &torch_ext::sampling::bucketFingerprintOp);
}
