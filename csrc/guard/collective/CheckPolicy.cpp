#include "guard/collective/CheckPolicy.h"

namespace torch_ext {

CheckPolicy CheckPolicy::of(CheckMode mode, CallPathMode callPaths) {
  CheckPolicy p;
  p.mode = mode;
  p.compares = mode != CheckMode::Off;
  p.checksBeforeIssue = mode == CheckMode::Strict;
  p.verifies = mode == CheckMode::Verify;
  p.resultsWaitForTheCheck = mode == CheckMode::Verify || mode == CheckMode::Strict;
  p.comparesInStatusRing = mode == CheckMode::Async;
  p.auditsSplitsAfterIssue = mode == CheckMode::Async;
  p.comparesCallPaths =
      p.compares && (callPaths == CallPathMode::On || (callPaths == CallPathMode::Auto && mode == CheckMode::Strict));
  return p;
}

}  // namespace torch_ext
