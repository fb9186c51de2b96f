#pragma once

// The fused per-step collective: ONE all_reduce answers "does any rank want to
// stop?", "how many ranks still have data?" and "what are the sums of these k
// metrics?", instead of a broadcast for the decision plus one collective per
// metric.
//
// Wire layout (float64, so counts stay exact and metric sums do not lose bits
// to fp16/bf16/fp32 accumulation):
//
//     packed = [stop + has_data * 2^21, metric_0, ..., metric_{k-1}]
//
// Each rank contributes stop and has_data as 0/1, both in ONE slot; after a
// SUM all_reduce the slot holds (ranks that want to stop) + 2^21 * (ranks that
// have data), an exact integer in float64 for any group below 2^21 ranks, and
// is split again on the device (any-stop = count > 0, all-have-data = count ==
// world size). One slot rather than two matters on gloo, whose ring algorithm
// sends one message per non-empty segment and makes at least 2 * world_size
// segments: a 1-element all_reduce costs about half of a 4-element one on
// loopback, so the flag-only sync (even_batches, early stopping) costs what a
// plain 4-byte all_reduce costs. SUM is the only reduction every backend
// supports on every device (SMDDP, for one, supports all_reduce but not
// broadcast), so the op needs nothing else.
//
// On CUDA (and any non-CPU device) packing and unpacking are tensor ops on the
// input's device: the op enqueues kernels and the collective and never waits
// on the host. On CPU it reads and writes the few values directly, which costs
// less than dispatching a dozen tiny tensor ops every step.
//
// Schemas (declared once, in StepSync.cpp):
//   torch_ext::step_sync(Tensor flags, Tensor metrics, str group_name) -> (Tensor counts, Tensor sums)
//   torch_ext::step_sync_start(Tensor flags, Tensor metrics, str group_name) -> Tensor packed
//   torch_ext::step_sync_finish(Tensor packed) -> (Tensor counts, Tensor sums)
// counts is int64 [2] = [ranks that want to stop, ranks that have data];
// sums is float64 [k]; packed is float64 [1 + k]. step_sync_start returns the
// packed buffer with the all_reduce still in flight (registered like a
// functional collective); step_sync_finish waits for it and unpacks, so the
// collective can overlap with the next training step.

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <tuple>

namespace torch_ext::ops {

// Leading slots holding the flags in the packed buffer (both flags in one).
constexpr int64_t kStepSyncFlagSlots = 1;
// has_data is counted in units of 2^21 in the flag slot; stop in units of 1.
constexpr int64_t kHasDataShift = 21;
constexpr int64_t kHasDataUnit = int64_t{1} << kHasDataShift;

// Blocking form: pack, all_reduce(SUM) on the group registered as
// `group_name`, wait (a stream wait on CUDA, not a host wait), unpack.
std::tuple<at::Tensor, at::Tensor> step_sync(const at::Tensor& flags, const at::Tensor& metrics,
                                             const std::string& group_name);

// Non-blocking form: pack and launch the all_reduce; returns the packed buffer,
// whose pending work is registered so that step_sync_finish (or
// torch.ops._c10d_functional.wait_tensor) waits for it.
at::Tensor step_sync_start(const at::Tensor& flags, const at::Tensor& metrics, const std::string& group_name);

// Waits for the all_reduce launched by step_sync_start and unpacks.
std::tuple<at::Tensor, at::Tensor> step_sync_finish(const at::Tensor& packed);

namespace detail {

// Validates the inputs (messages name where(), e.g. "group 'default_pg', rank
// 1 of 4", called only on failure) and builds the float64 packed buffer on
// flags' device. Flags are normalised to 0/1 so a rank passing stop=5 still
// counts once.
at::Tensor pack(const at::Tensor& flags, const at::Tensor& metrics, const std::function<std::string()>& where);

// Splits a reduced packed buffer into (counts int64 [2], sums float64 [k]).
std::tuple<at::Tensor, at::Tensor> unpack(const at::Tensor& packed);

}  // namespace detail
}  // namespace torch_ext::ops
