#include "guard/modes/Modes.h"

#include "guard/modes/async/AsyncMode.h"
#include "guard/modes/off/OffMode.h"
#include "guard/modes/strict/StrictMode.h"
#include "guard/modes/verify/VerifyMode.h"

#include <c10/util/Exception.h>

namespace torch_ext {

namespace {

using MakeMode = std::shared_ptr<Mode> (*)(const std::shared_ptr<GroupState>&, c10::intrusive_ptr<c10d::Backend>);

struct Registered {
  CheckMode mode;
  MakeMode make;
};

// One line per mode.
constexpr Registered kModes[] = {
    {CheckMode::Off, &OffMode::make},
    {CheckMode::Async, &AsyncMode::make},
    {CheckMode::Strict, &StrictMode::make},
    {CheckMode::Verify, &VerifyMode::make},
};

}  // namespace

std::shared_ptr<Mode> makeMode(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper) {
  const CheckMode wanted = state->config().check;
  for (const Registered& r : kModes) {
    if (r.mode == wanted) return r.make(state, std::move(helper));
  }
  TORCH_CHECK(false, "guard: no check mode is registered for check='", enumName(wanted),
              "' (csrc/guard/modes/Modes.cpp)");
}

void installMode(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper) {
  state->setMode(makeMode(state, std::move(helper)));
}

}  // namespace torch_ext
