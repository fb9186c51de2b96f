#pragma once

// InBandRequest: one collective that may carry its own check, as GuardBackend
// hands it to the group's mode: which kind, and pointers to the caller's
// arguments (valid during issue). Whether and how it carries a check is the
// mode's (verify: modes/verify/InBandCheck.h).

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>
#include <vector>

namespace torch_ext {

struct InBandRequest {
  enum class Kind : uint8_t { AllReduce, AllGather, ReduceScatter };
  Kind kind;
  std::vector<at::Tensor>* tensors = nullptr;  // AllReduce
  at::Tensor* output = nullptr;                // AllGather, ReduceScatter
  at::Tensor* input = nullptr;
  const c10d::AllreduceOptions* allreduce = nullptr;
  const c10d::AllgatherOptions* allgather = nullptr;
  const c10d::ReduceScatterOptions* reduceScatter = nullptr;
};

}  // namespace torch_ext
