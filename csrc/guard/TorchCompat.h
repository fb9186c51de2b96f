#pragma once

// TorchCompat.h: the one place where the C++ core adapts to the torch release it is
// compiled against (issue 41). Supported: torch 2.11 to 2.15, as pyproject.toml
// declares (torch>=2.11,<2.16); the GPU runners have 2.11, CI 2.13.
//
// Each entry names the torch API it stands in for, the first release that has it,
// and what older releases do instead. Checked with every release's headers by
//   bash scripts/check_torch_headers.sh 2.11.0   (2.12.0, 2.14.1, ...)
// When the floor moves past a release, delete the entries that only served it.
//
// Python-free (the core is built without Python by tests/cpp), and the language
// standard is C++20 everywhere (setup.py passes -std=c++20: torch 2.11's
// BuildExtension would otherwise compile with -std=c++17).

#include <c10/core/DeviceType.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/version.h>  // TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR

// True when compiling against torch major.minor or newer.
#define TORCH_EXT_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

#if !TORCH_EXT_TORCH_AT_LEAST(2, 11)
#error "torch_ext needs torch 2.11 or newer (pyproject.toml: torch>=2.11,<2.16)"
#endif

// c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED: torch 2.12 and newer.
#define TORCH_EXT_HAS_OPTYPE_REDUCE_SCATTER_TENSOR_COALESCED TORCH_EXT_TORCH_AT_LEAST(2, 12)
// c10d::ProcessGroup::hasBackendForDeviceType: torch 2.13 and newer.
#define TORCH_EXT_HAS_PG_HAS_BACKEND_FOR_DEVICE_TYPE TORCH_EXT_TORCH_AT_LEAST(2, 13)

// Backend::setSequenceNumberForGroup() is a deprecated no-op that warns from
// torch 2.15 on (sequence numbers start at 0 on every rank): not forwarded there.
#define TORCH_EXT_SEQUENCE_NUMBERS_START_AT_ZERO TORCH_EXT_TORCH_AT_LEAST(2, 15)
// Backend::supportsAbortHooks/registerAbortHook/unregisterAbortHook (c10d::AbortHook,
// Hooks.hpp): torch 2.15 and newer; GuardBackend implements them there.
#define TORCH_EXT_HAS_ABORT_HOOKS TORCH_EXT_TORCH_AT_LEAST(2, 15)
// ProcessGroupGloo's reduce_scatter_tensor is an all_reduce of a copy of the
// input with the caller's op and timeout, of which each rank keeps its chunk:
// checked bit for bit on 2.13 (tests/python/test_exactness.py). Releases of
// 2024-25 passed no options to that all_reduce (a SUM whatever the op); 2.11
// and 2.12 are not checked here, so InBandCheck::ringScatter leaves their
// floating reduce_scatters to the rounds.
#define TORCH_EXT_GLOO_REDUCE_SCATTER_IS_ITS_ALL_REDUCE TORCH_EXT_TORCH_AT_LEAST(2, 13)

namespace torch_ext::compat {

// The c10d::OpType of a Work for reduce_scatter_tensor_coalesced. Torch 2.11 has
// no OpType of its own for it: its coalesced collectives are COALESCED works (the
// type all_gather_into_tensor_coalesced still has, and nccl_sim's for both).
inline constexpr c10d::OpType kReduceScatterTensorCoalescedOpType =
#if TORCH_EXT_HAS_OPTYPE_REDUCE_SCATTER_TENSOR_COALESCED
    c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED;
#else
    c10d::OpType::COALESCED;
#endif

// Whether `pg` has a backend for tensors of device type `type`, without creating
// one and without throwing (ProcessGroup::getBackend(type) throws for a missing
// type, and may create a backend lazily).
inline bool hasBackendFor(const c10d::ProcessGroup& pg, c10::DeviceType type) {
#if TORCH_EXT_HAS_PG_HAS_BACKEND_FOR_DEVICE_TYPE
  // Only reads a map, but is not const-qualified.
  return const_cast<c10d::ProcessGroup&>(pg).hasBackendForDeviceType(type);
#else
  // Torch 2.11 and 2.12: setBackend() records a device type in deviceTypes_ (what
  // getDeviceTypes() lists) together with deviceTypeToBackendType_ (what
  // hasBackendForDeviceType() looks up from 2.13 on), and nothing removes either:
  // the same answer.
  for (const c10::Device& device : pg.getDeviceTypes()) {
    if (device.type() == type) return true;
  }
  return false;
#endif
}

// What new_group does to each backend before torch 2.15; nothing from 2.15 on.
inline void setSequenceNumber(c10d::Backend& backend) {
#if TORCH_EXT_SEQUENCE_NUMBERS_START_AT_ZERO
  (void)backend;
#else
  backend.setSequenceNumberForGroup();
#endif
}

}  // namespace torch_ext::compat
