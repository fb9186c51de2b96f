#include "guard/Errors.h"

namespace torch_ext {

namespace {

template <class E>
[[noreturn]] void throwWith(E err, SeenFlag seen) {
  err.setSeenFlag(std::move(seen));
  throw err;
}

std::atomic<ErrorSurface> g_surface{nullptr};

}  // namespace

void throwGuardError(GuardErrorKind kind, const std::string& msg, SeenFlag seen) {
  switch (kind) {
    case GuardErrorKind::Mismatch:
      throwWith(CollectiveMismatchError(msg), std::move(seen));
    case GuardErrorKind::Timeout:
      throwWith(CollectiveTimeoutError(msg), std::move(seen));
    case GuardErrorKind::Failure:
      throwWith(CollectiveFailureError(msg), std::move(seen));
    case GuardErrorKind::StoreLost:
      throwWith(StoreLostError(msg), std::move(seen));
    case GuardErrorKind::Deadlock:
      throwWith(DeadlockError(msg), std::move(seen));
    case GuardErrorKind::Join:
      throwWith(GroupJoinError(msg), std::move(seen));
  }
  throwWith(GuardError(kind, msg), std::move(seen));
}

void setErrorSurface(ErrorSurface surface) {
  g_surface.store(surface, std::memory_order_release);
}

std::exception_ptr surfaced(std::exception_ptr err) {
  if (!err) return err;
  try {
    std::rethrow_exception(err);
  } catch (const GuardError& e) {
    if (ErrorSurface surface = g_surface.load(std::memory_order_acquire)) return surface(e);
    e.markSeen();
    return err;
  } catch (...) {
    return err;
  }
}

}  // namespace torch_ext
