#include "guard/Errors.h"

namespace torch_ext {

void throwGuardError(GuardErrorKind kind, const std::string& msg) {
  switch (kind) {
    case GuardErrorKind::Mismatch:
      throw CollectiveMismatchError(msg);
    case GuardErrorKind::Timeout:
      throw CollectiveTimeoutError(msg);
    case GuardErrorKind::Failure:
      throw CollectiveFailureError(msg);
    case GuardErrorKind::StoreLost:
      throw StoreLostError(msg);
  }
  throw GuardError(kind, msg);
}

} // namespace torch_ext
