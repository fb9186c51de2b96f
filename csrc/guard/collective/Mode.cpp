#include "guard/collective/Mode.h"

#include <c10/util/Exception.h>

namespace torch_ext {

// Only a mode that sets Route::InBand or Route::Deferred is asked for them.
c10::intrusive_ptr<c10d::Work> Mode::carry(const Operation& op, c10d::Backend& /*inner*/,
                                           const InBandRequest& /*inBand*/) {
  TORCH_CHECK(false, "guard: the group's check mode routed ", opName(op.op), " #", op.seq,
              " in band but does not carry checks (a bug in torch_ext)");
}

c10::intrusive_ptr<c10d::Work> Mode::deferReceive(std::function<c10::intrusive_ptr<c10d::Work>()> /*post*/,
                                                  const Operation& op) {
  TORCH_CHECK(false, "guard: the group's check mode deferred ", opName(op.op),
              " but does not defer receives (a bug in torch_ext)");
}

}  // namespace torch_ext
