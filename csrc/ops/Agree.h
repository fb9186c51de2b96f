#pragma once

// agree: a decision the ranks must take together, taken together.
//
// A branch that issues collectives on some ranks only (run the vision tower
// when this rank's batch has images, stop when this rank's loss is small,
// validate when this rank has data) is the classic way ranks part: each rank
// decides from its own data. agree() makes the decision one value every rank
// holds: ONE all_reduce of the ranks' values, reduced as `how` says.
//
//   torch_ext::agree(Tensor value, str how, str group_name) -> Tensor
//
// `value`: 0-d or 1-d, real (bool, integer or floating), on a device the
// group serves. `how`:
//   "any" / "all": bool result, true where any / every rank's value is non-zero
//     (a SUM of 0/1 counts in int64, the one reduction every backend has);
//   "min" / "max": the input's dtype, the smallest / largest value of any rank
//     (MIN / MAX: exact for every dtype, in int64 for integers and bool, in
//     float64 for floating types).
// Every rank of the group must call it, as any collective; under the guard it
// is checked like one, named at the caller's line. The result is made on the
// host after wait(), so a CPU backend that runs collectives on a stream
// (nccl_sim) is refused with an error naming the fix (CUDA over NCCL is fine:
// there the result is made in stream order).

#include <ATen/core/Tensor.h>

#include <string>

namespace torch_ext::ops {

at::Tensor agree(const at::Tensor& value, const std::string& how, const std::string& group_name);

}  // namespace torch_ext::ops
