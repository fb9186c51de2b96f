#include "ops/Agree.h"

#include "guard/TorchCompat.h"
#include "guard/backend/GuardBackend.h"
#include "guard/collective/StreamOrdered.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>

#include <sstream>

namespace torch_ext::ops {
namespace {

constexpr const char* kAgreeOp = "torch.ops.torch_ext.agree";

enum class How : uint8_t { Any, All, Min, Max };

How parseHow(const std::string& how) {
  if (how == "any") return How::Any;
  if (how == "all") return How::All;
  if (how == "min") return How::Min;
  if (how == "max") return How::Max;
  TORCH_CHECK(false, kAgreeOp, ": how must be 'any', 'all', 'min' or 'max', got '", how, "'");
}

c10::intrusive_ptr<c10d::ProcessGroup> groupNamed(const std::string& group_name) {
  try {
    return c10d::resolve_process_group(group_name);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, kAgreeOp, ": no process group named '", group_name,
                "' is registered in this process; pass group.group_name of a live group (torch_ext.agree does). (",
                e.what_without_backtrace(), ")");
  }
}

// A backend whose works complete on a stream, itself or as the guard's inner one.
bool onAStream(const c10d::Backend& backend) {
  if (const auto* guard = dynamic_cast<const GuardBackend*>(&backend)) return guard->state()->streamOrdered();
  return isStreamOrdered(backend);
}

at::Tensor agreeKernel(const at::Tensor& value, std::string how, std::string group_name) {
  return agree(value, how, group_name);
}

// Not differentiable (a decision): run below autograd.
at::Tensor agreeAutograd(const at::Tensor& value, std::string how, std::string group_name) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("torch_ext::agree", "")
                       .typed<at::Tensor(const at::Tensor&, std::string, std::string)>();
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(value, std::move(how), std::move(group_name));
}

}  // namespace

at::Tensor agree(const at::Tensor& value, const std::string& how, const std::string& group_name) {
  const How h = parseHow(how);
  TORCH_CHECK(value.defined() && value.layout() == at::kStrided, kAgreeOp, ": value must be a dense tensor");
  TORCH_CHECK(value.dim() <= 1, kAgreeOp, ": value must be 0-d or 1-d (one decision, or a few), got ", value.dim(),
              "-d; flatten it");
  TORCH_CHECK(!at::isComplexType(value.scalar_type()), kAgreeOp, ": complex values cannot be agreed on");
  auto pg = groupNamed(group_name);
  TORCH_CHECK(compat::hasBackendFor(*pg, value.device().type()), kAgreeOp, " (group '", group_name,
              "'): the group has no backend for device type '",
              c10::DeviceTypeName(value.device().type(), /*lower_case=*/true),
              "'; put the value on a device the group serves (CPU for gloo, CUDA for NCCL; 'guard' serves both)");
  // The result is made on the host from the reduced tensor right after wait(): a
  // CPU backend that completes works on a stream (nccl_sim) returns from wait()
  // before the data is there, and the answer would be this rank's own value.
  TORCH_CHECK(!value.device().is_cpu() || !onAStream(*pg->getBackend(c10::DeviceType::CPU)), kAgreeOp, " (group '",
              group_name,
              "'): the group's CPU backend runs collectives on a stream (nccl_sim), so a CPU result is not ready when "
              "agree reads it; agree on a gloo or guard-over-gloo group, or on CUDA tensors over NCCL");
  const bool floating = at::isFloatingType(value.scalar_type());
  // The wire: int64 0/1 counts for any/all; the value itself (int64 or float64) for min/max.
  at::Tensor wire;
  if (h == How::Any || h == How::All) {
    wire = value.ne(0).to(at::kLong);
  } else {
    wire = value.to(floating ? at::kDouble : at::kLong);
  }
  wire = wire.contiguous().clone();  // never the caller's storage
  std::vector<at::Tensor> tensors{wire};
  c10d::AllreduceOptions opts;
  opts.reduceOp = h == How::Min ? c10d::ReduceOp::MIN : h == How::Max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
  pg->allreduce(tensors, opts)->wait();
  if (h == How::Any) return wire.gt(0);
  if (h == How::All) return wire.eq(pg->getSize());
  return wire.to(value.scalar_type());
}

}  // namespace torch_ext::ops

TORCH_LIBRARY_FRAGMENT(torch_ext, m) {
  m.def("agree(Tensor value, str how, str group_name) -> Tensor", {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(torch_ext, CompositeExplicitAutograd, m) {
  m.impl("agree", &torch_ext::ops::agreeKernel);
}

TORCH_LIBRARY_IMPL(torch_ext, Autograd, m) {
  m.impl("agree", &torch_ext::ops::agreeAutograd);
}
