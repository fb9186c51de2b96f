#pragma once

// The fused per-step collective: ONE all_reduce answers "does any rank want to
// stop?", "how many ranks still have data?" and "what are the sums of these k
// metrics?", instead of a broadcast for the decision plus one collective per
// metric.
//
// Wire layout (float64, so counts stay exact and metric sums do not lose bits
// to fp16/bf16/fp32 accumulation):
//
//     packed = [stop, has_data, metric_0, ..., metric_{k-1}]
//
// Each rank contributes stop and has_data as 0/1; after a SUM all_reduce
// packed[0] is the number of ranks that want to stop (any-stop = packed[0] > 0)
// and packed[1] the number of ranks that have data (all-have-data =
// packed[1] == world size). SUM is the only reduction every backend supports
// on every device (SMDDP, for one, supports all_reduce but not broadcast or MAX
// on every path), so the op needs nothing else.
//
// Packing and unpacking are tensor ops on the input's device: on CUDA the op
// enqueues kernels and the collective and never waits on the host.
//
// Schemas (declared once, in StepSync.cpp):
//   torch_ext::step_sync(Tensor flags, Tensor metrics, str group_name) -> (Tensor counts, Tensor sums)
//   torch_ext::step_sync_start(Tensor flags, Tensor metrics, str group_name) -> Tensor packed
//   torch_ext::step_sync_finish(Tensor packed) -> (Tensor counts, Tensor sums)
// counts is int64 [2] = [ranks that want to stop, ranks that have data];
// sums is float64 [k]. step_sync_start returns the packed buffer with the
// all_reduce still in flight (registered like a functional collective);
// step_sync_finish waits for it and unpacks, so the collective can overlap
// with the next training step.

#include <ATen/core/Tensor.h>

#include <string>
#include <tuple>

namespace torch_ext::ops {

// Number of leading flag slots in the packed buffer.
constexpr int64_t kStepSyncFlags = 2;

// Blocking form: pack, all_reduce(SUM) on the group registered as
// `group_name`, wait (a stream wait on CUDA, not a host wait), unpack.
std::tuple<at::Tensor, at::Tensor> step_sync(
    const at::Tensor& flags,
    const at::Tensor& metrics,
    const std::string& group_name);

// Non-blocking form: pack and launch the all_reduce; returns the packed buffer,
// whose pending work is registered so that step_sync_finish (or
// torch.ops._c10d_functional.wait_tensor) waits for it.
at::Tensor step_sync_start(
    const at::Tensor& flags,
    const at::Tensor& metrics,
    const std::string& group_name);

// Waits for the all_reduce launched by step_sync_start and unpacks.
std::tuple<at::Tensor, at::Tensor> step_sync_finish(const at::Tensor& packed);

namespace detail {

// Validates the inputs (messages name `where`, e.g. "group 'default_pg', rank 1
// of 4") and builds the float64 packed buffer on flags' device. Flags are
// normalised to 0/1 so a rank passing stop=5 still counts once.
at::Tensor pack(const at::Tensor& flags, const at::Tensor& metrics, const std::string& where);

// Splits a reduced packed buffer into (counts int64 [2], sums float64 [k]).
std::tuple<at::Tensor, at::Tensor> unpack(const at::Tensor& packed);

} // namespace detail
} // namespace torch_ext::ops
