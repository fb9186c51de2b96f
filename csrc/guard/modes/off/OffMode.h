#pragma once

// OffMode: check="off". Nothing is compared and nothing waits: every hook is
// Mode's default. The watchdog still names a hang (its deadlines and
// reports), and a verdict only warns.

#include "guard/collective/GroupState.h"
#include "guard/collective/Mode.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <memory>

namespace torch_ext {

class OffMode : public Mode {
 public:
  static std::shared_ptr<Mode> make(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper);
};

}  // namespace torch_ext
