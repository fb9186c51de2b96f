#pragma once

// Modes: the registry of check modes, the one place that turns a group's
// `check` setting into the object that does it (collective/Mode.h). Each mode
// lives in its own folder here (off/, async/, strict/, verify/) and is
// registered by one line of Modes.cpp.

#include "guard/collective/GroupState.h"
#include "guard/collective/Mode.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <memory>

namespace torch_ext {

// The mode the group's config names, made for `state` (`helper`: the group's
// helper backend for the checks' own collectives; null where the group has
// none). Throws where the mode cannot run so (strict without a helper).
std::shared_ptr<Mode> makeMode(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper);

// makeMode, set on the group (GroupState::setMode).
void installMode(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper);

}  // namespace torch_ext
