#include "ops/StepSync.h"

#include "guard/TorchCompat.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>

#include <cstring>
#include <functional>
#include <sstream>

namespace torch_ext::ops {
namespace {

// The op's name as users see it, for error messages.
constexpr const char* kOp = "torch.ops.torch_ext.step_sync";

std::string shapeOf(const at::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// Resolves `group_name` with the c10d group registry (the same lookup the
// _c10d_functional ops use), turning "not found" into an error that names the
// fix: the Python API passes group.group_name.
c10::intrusive_ptr<c10d::ProcessGroup> resolveGroup(const std::string& group_name) {
  try {
    return c10d::resolve_process_group(group_name);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, kOp, ": no process group named '", group_name,
                "' is registered in this process. Pass the name of a live group: group.group_name of a group made by "
                "torch.distributed.init_process_group / new_group (dist.group.WORLD.group_name for the default group), "
                "and call it before destroy_process_group. (",
                e.what_without_backtrace(), ")");
  }
}

std::string where(const c10d::ProcessGroup& pg, const std::string& group_name) {
  return c10::str("group '", group_name, "', rank ", pg.getRank(), " of ", pg.getSize());
}

// Both counts share one float64 slot (see StepSync.h), exact while the
// group has fewer than 2^21 ranks.
void checkWorld(const c10d::ProcessGroup& pg, const std::string& group_name) {
  TORCH_CHECK(pg.getSize() < kHasDataUnit, kOp, " (", where(pg, group_name), "): groups of ", kHasDataUnit,
              " ranks or more are not supported (the stop and has-data counts share one float64 slot)");
}

// Launches the SUM all_reduce of `packed` in place and returns its work.
// Errors of the backend itself (a guard timeout or mismatch report, a dead
// peer) pass through untouched so callers can catch their types; only the
// "this group cannot reduce tensors on this device" case gets context.
c10::intrusive_ptr<c10d::Work> launch(c10d::ProcessGroup& pg, at::Tensor& packed, const std::string& group_name) {
  TORCH_CHECK(compat::hasBackendFor(pg, packed.device().type()), kOp, " (", where(pg, group_name),
              "): the group has no backend for device type '",
              c10::DeviceTypeName(packed.device().type(), /*lower_case=*/true),
              "'. Put flags and metrics on a device the group serves (CPU tensors for gloo, CUDA tensors for NCCL; "
              "'guard' serves both), or create the group with a backend for this device.");
  std::vector<at::Tensor> tensors{packed};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  return pg.allreduce(tensors, opts);
}

// Kernels take the group name by value, as the dispatcher passes `str`.
std::tuple<at::Tensor, at::Tensor> stepSyncKernel(const at::Tensor& flags, const at::Tensor& metrics,
                                                  std::string group_name) {
  return step_sync(flags, metrics, group_name);
}

at::Tensor stepSyncStartKernel(const at::Tensor& flags, const at::Tensor& metrics, std::string group_name) {
  return step_sync_start(flags, metrics, group_name);
}

// Autograd kernels: the op is not differentiable (it is a control signal plus
// a detached metric reduction), so run it below autograd; outputs never
// require grad, even when a metric passed in does (a loss, typically).
std::tuple<at::Tensor, at::Tensor> stepSyncAutograd(const at::Tensor& flags, const at::Tensor& metrics,
                                                    std::string group_name) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torch_ext::step_sync", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, std::string)>();
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(flags, metrics, std::move(group_name));
}

at::Tensor stepSyncStartAutograd(const at::Tensor& flags, const at::Tensor& metrics, std::string group_name) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torch_ext::step_sync_start", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, std::string)>();
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(flags, metrics, std::move(group_name));
}

std::tuple<at::Tensor, at::Tensor> stepSyncFinishAutograd(const at::Tensor& packed) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torch_ext::step_sync_finish", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&)>();
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(packed);
}

}  // namespace

namespace detail {

at::Tensor pack(const at::Tensor& flags, const at::Tensor& metrics, const std::function<std::string()>& where) {
  // TORCH_CHECK evaluates its message only on failure: where() costs nothing
  // on the hot path.
  TORCH_CHECK(flags.defined() && metrics.defined(), kOp, " (", where(), "): flags and metrics must be tensors");
  TORCH_CHECK(flags.layout() == at::kStrided && metrics.layout() == at::kStrided, kOp, " (", where(),
              "): flags and metrics must be dense (strided) tensors");
  TORCH_CHECK(flags.dim() == 1 && flags.size(0) == 2, kOp, " (", where(),
              "): flags must be a 1-D tensor [stop, has_data] of 2 elements, got shape ", shapeOf(flags),
              "; build it as torch.tensor([stop, has_data])");
  TORCH_CHECK(metrics.dim() == 1, kOp, " (", where(),
              "): metrics must be a 1-D tensor of k values (k may be 0), got shape ", shapeOf(metrics),
              "; flatten it or stack one scalar per metric");
  TORCH_CHECK(!at::isComplexType(flags.scalar_type()) && !at::isComplexType(metrics.scalar_type()), kOp, " (", where(),
              "): complex tensors are not supported (flags ", flags.scalar_type(), ", metrics ", metrics.scalar_type(),
              "); pass real values");
  TORCH_CHECK(flags.device() == metrics.device(), kOp, " (", where(), "): flags are on ", flags.device(),
              " but metrics on ", metrics.device(), "; put both on the same device (the one the group reduces on)");
  // packed = [stop + has_data * 2^21, metrics...] in float64. This runs every
  // step, so it uses as few operations as possible.
  const int64_t k = metrics.size(0);
  auto packed = at::empty({kStepSyncFlagSlots + k}, flags.options().dtype(at::kDouble));
  if (flags.device().is_cpu()) {
    // On the host, read and write the few values directly: a dozen dispatched
    // tensor ops would cost more than the loopback collective itself.
    double* out = packed.data_ptr<double>();
    auto f = flags.contiguous();
    AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, f.scalar_type(), "step_sync_flags", [&] {
      const scalar_t* in = f.data_ptr<scalar_t>();
      out[0] = (static_cast<double>(in[0]) != 0.0 ? 1.0 : 0.0) +
               (static_cast<double>(in[1]) != 0.0 ? static_cast<double>(kHasDataUnit) : 0.0);
    });
    if (k > 0) {
      auto m = metrics.contiguous();
      AT_DISPATCH_ALL_TYPES_AND3(at::kBool, at::kHalf, at::kBFloat16, m.scalar_type(), "step_sync_metrics", [&] {
        const scalar_t* in = m.data_ptr<scalar_t>();
        for (int64_t i = 0; i < k; ++i) {
          out[kStepSyncFlagSlots + i] = static_cast<double>(in[i]);
        }
      });
    }
    return packed;
  }
  // Other devices: tensor ops only (no .item(), no host round trip).
  auto bits = (flags.scalar_type() == at::kBool ? flags : flags.ne(0)).to(at::kDouble);
  // word = bits[0] + 2^21 * bits[1], written straight into slot 0.
  auto word = packed.narrow(0, 0, kStepSyncFlagSlots);
  at::add_out(word, bits.narrow(0, 0, 1), bits.narrow(0, 1, 1), static_cast<double>(kHasDataUnit));
  if (k > 0) {
    packed.narrow(0, kStepSyncFlagSlots, k).copy_(metrics);
  }
  return packed;
}

std::tuple<at::Tensor, at::Tensor> unpack(const at::Tensor& packed) {
  TORCH_CHECK(packed.dim() == 1 && packed.size(0) >= kStepSyncFlagSlots && packed.scalar_type() == at::kDouble,
              "torch.ops.torch_ext.step_sync_finish: expected the float64 buffer returned by step_sync_start "
              "(1-D, at least 1 element), got ",
              packed.scalar_type(), " of shape ", shapeOf(packed));
  const int64_t k = packed.size(0) - kStepSyncFlagSlots;
  if (packed.device().is_cpu()) {
    auto p = packed.contiguous();
    const double* in = p.data_ptr<double>();
    const auto word = static_cast<int64_t>(in[0]);
    auto counts = at::empty({2}, packed.options().dtype(at::kLong));
    int64_t* c = counts.data_ptr<int64_t>();
    c[0] = word & (kHasDataUnit - 1);
    c[1] = word >> kHasDataShift;
    auto sums = at::empty({k}, packed.options());
    if (k > 0) {
      std::memcpy(sums.data_ptr<double>(), in + kStepSyncFlagSlots, static_cast<size_t>(k) * sizeof(double));
    }
    return {counts, sums};
  }
  // The reduced word is an exact integer in float64: split it on the device.
  auto word = packed.narrow(0, 0, kStepSyncFlagSlots).to(at::kLong);
  auto counts = at::cat({at::bitwise_and(word, kHasDataUnit - 1), at::bitwise_right_shift(word, kHasDataShift)});
  // A fresh tensor, not a view into the wire buffer: the outputs' metadata
  // must match the fake kernel's (torch.compile), and a caller must not be
  // able to scribble on a buffer that has a collective registered on it.
  auto sums = packed.narrow(0, kStepSyncFlagSlots, k).clone();
  return {counts, sums};
}

}  // namespace detail

std::tuple<at::Tensor, at::Tensor> step_sync(const at::Tensor& flags, const at::Tensor& metrics,
                                             const std::string& group_name) {
  auto pg = resolveGroup(group_name);
  checkWorld(*pg, group_name);
  auto packed = detail::pack(flags, metrics, [&] { return where(*pg, group_name); });
  auto work = launch(*pg, packed, group_name);
  // For gloo this blocks until the reduction is done; for NCCL it makes the
  // current stream wait for the collective (no host synchronisation).
  work->wait();
  return detail::unpack(packed);
}

at::Tensor step_sync_start(const at::Tensor& flags, const at::Tensor& metrics, const std::string& group_name) {
  auto pg = resolveGroup(group_name);
  checkWorld(*pg, group_name);
  auto packed = detail::pack(flags, metrics, [&] { return where(*pg, group_name); });
  auto work = launch(*pg, packed, group_name);
  // Same contract as the _c10d_functional collectives: the work is looked up
  // by the tensor when someone waits on it (step_sync_finish / wait_tensor).
  c10d::register_work(packed, work);
  return packed;
}

std::tuple<at::Tensor, at::Tensor> step_sync_finish(const at::Tensor& packed) {
  c10d::wait_tensor(packed);
  return detail::unpack(packed);
}

}  // namespace torch_ext::ops

TORCH_LIBRARY_FRAGMENT(torch_ext, m) {
  m.def("step_sync(Tensor flags, Tensor metrics, str group_name) -> (Tensor, Tensor)", {at::Tag::pt2_compliant_tag});
  m.def("step_sync_start(Tensor flags, Tensor metrics, str group_name) -> Tensor", {at::Tag::pt2_compliant_tag});
  m.def("step_sync_finish(Tensor packed) -> (Tensor, Tensor)", {at::Tag::pt2_compliant_tag});
}

// Device-agnostic: the kernels only use tensor ops and c10d, which dispatch on
// the tensors' device (CPU, CUDA, or any device the group has a backend for).
TORCH_LIBRARY_IMPL(torch_ext, CompositeExplicitAutograd, m) {
  m.impl("step_sync", &torch_ext::ops::stepSyncKernel);
  m.impl("step_sync_start", &torch_ext::ops::stepSyncStartKernel);
  m.impl("step_sync_finish", TORCH_FN(torch_ext::ops::step_sync_finish));
}

TORCH_LIBRARY_IMPL(torch_ext, Autograd, m) {
  m.impl("step_sync", &torch_ext::ops::stepSyncAutograd);
  m.impl("step_sync_start", &torch_ext::ops::stepSyncStartAutograd);
  m.impl("step_sync_finish", &torch_ext::ops::stepSyncFinishAutograd);
}
