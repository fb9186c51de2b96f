#pragma once

// InnerFuture: a work's future, or none, without an exception per collective.
//
// c10d::Work::getFuture() throws where a work type has none (gloo's
// reduce_scatter, send and recv), and the c10::Error it throws records a
// backtrace: some microseconds on a short stack, tens under a training step's
// (autograd, FSDP2's hooks, the interpreter), paid by every reduce_scatter of
// FSDP2 that the guard observed by asking. futureOf() asks a work type once:
// a type whose getFuture() threw is remembered, and later works of that type
// are answered "none" without the call.
//
// That holds for a type whose answer is the type's: one that overrides
// getFuture() or inherits c10d::Work's, which always throws. The guard's own
// wrappers answer as the work they wrap (a carried reduce_scatter has none, a
// carried all_reduce has one), so they derive from ForwardsFuture and are
// asked every time. A foreign wrapper that answered per instance would, once
// remembered, be taken for a work without a future, as gloo's reduce_scatter
// is: observed in wait() and the watchdog's poll (GuardWork's Blocking).

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

namespace torch_ext {

// A work type of torch_ext's whose getFuture() answers as the work it wraps.
class ForwardsFuture {
 public:
  virtual ~ForwardsFuture() = default;
};

// `work`'s future; null where it has none.
c10::intrusive_ptr<c10::ivalue::Future> futureOf(c10d::Work& work);

}  // namespace torch_ext
