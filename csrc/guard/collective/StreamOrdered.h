#pragma once

// StreamOrdered: how an inner backend's works complete, as the guard needs to
// know it to observe them (GuardWork's modes).
//
// NCCL-like backends complete works on a device stream: a collective returns
// at once, wait() only orders the caller's stream after it and does not block
// the host, completion is seen by polling isCompleted(), and a stuck operation
// is released only by the backend's abort(). The guard must then never block
// the host where the inner backend would not (GuardWork::Completion::Device).
// Host backends (gloo, mpi, ucc on CPU, and gloo on CUDA tensors) complete a
// work when its data is ready, and wait() blocks until then.
//
// The guard asks the backend, not the tensors' device: ProcessGroupNCCL is
// recognised by its name, and any backend of ours that runs on a stream
// (nccl_sim, the CPU stand-in that runs this path in CI) says so by deriving
// from this interface.

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace torch_ext {

class StreamOrdered {
 public:
  virtual ~StreamOrdered() = default;
};

// A work of a stream backend that can tell whether its stream has begun it.
// When every rank of a group is inside the same collective and one stalls,
// this is what tells them apart: the others' streams run the collective and
// wait for data, the stalled rank's stream never began it (an operation
// ahead of it on that stream did not finish). nccl_sim knows; on NCCL it
// takes start events (TORCH_NCCL_ENABLE_TIMING=1), not read here yet.
class StreamStartAware {
 public:
  virtual ~StreamStartAware() = default;
  virtual bool streamStarted() const = 0;
};

// The names of stream-ordered backends that do not derive from StreamOrdered.
// NCCL's: "nccl" (up to torch 2.14, and 2.15's nccl-legacy), "nccl2" and
// "nccl-lazy" (torch 2.15's c10d::nccl2 backends: kBackendName in
// nccl2/ProcessGroupNCCL*.hpp).
inline bool isStreamOrderedName(const std::string& name) {
  return name == "nccl" || name == "nccl2" || name == "nccl-lazy" || name == "xccl";
}

// True when `backend` completes its works on a stream (see above).
inline bool isStreamOrdered(const c10d::Backend& backend) {
  if (dynamic_cast<const StreamOrdered*>(&backend) != nullptr) return true;
  return isStreamOrderedName(backend.getBackendName());
}

}  // namespace torch_ext
