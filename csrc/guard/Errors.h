#pragma once

// Typed failures of a guarded process group. They derive from
// c10::DistBackendError, so code that catches torch.distributed.DistBackendError
// keeps working; the bindings translate each one to its torch_ext Python class.

#include "guard/report/EnumNames.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <exception>
#include <memory>
#include <string>

namespace torch_ext {

enum class GuardErrorKind : uint8_t {
  Mismatch,   // ranks issued different collectives (CollectiveMismatchError)
  Timeout,    // a collective outlived abort_after (CollectiveTimeoutError)
  Failure,    // the inner backend failed, e.g. a peer died (CollectiveFailureError)
  StoreLost,  // the store is gone or does not answer (StoreLostError, a CollectiveFailureError)
  Deadlock,   // a wait-for cycle whose ranks all block in it (DeadlockError, a CollectiveTimeoutError)
  Join,       // the group could not be created: ranks missing or incompatible (GroupJoinError)
};

template <>
struct EnumTable<GuardErrorKind> {
  static constexpr NamedValue<GuardErrorKind> kEntries[] = {
      {GuardErrorKind::Mismatch, "mismatch"}, {GuardErrorKind::Timeout, "timeout"},
      {GuardErrorKind::Failure, "failure"},   {GuardErrorKind::StoreLost, "store_lost"},
      {GuardErrorKind::Deadlock, "deadlock"}, {GuardErrorKind::Join, "join"},
  };
};
inline const char* guardErrorKindName(GuardErrorKind kind) {
  return enumName(kind);
}
// The Python class a failure of `kind` raises (torch_ext.errors).
inline const char* guardErrorClassName(GuardErrorKind kind) {
  switch (kind) {
    case GuardErrorKind::Mismatch:
      return "CollectiveMismatchError";
    case GuardErrorKind::Timeout:
      return "CollectiveTimeoutError";
    case GuardErrorKind::Failure:
      return "CollectiveFailureError";
    case GuardErrorKind::StoreLost:
      return "StoreLostError";
    case GuardErrorKind::Deadlock:
      return "DeadlockError";
    case GuardErrorKind::Join:
      return "GroupJoinError";
  }
  return "GuardError";
}

// Set once the program was handed a group's failure (see GuardError::markSeen).
using SeenFlag = std::shared_ptr<std::atomic<bool>>;

class GuardError : public c10::DistBackendError {
 public:
  GuardError(GuardErrorKind kind, std::string msg) : c10::DistBackendError(std::move(msg)), kind_(kind) {}
  GuardErrorKind kind() const {
    return kind_;
  }
  // A group's failure carries its group's flag: whoever hands the error to
  // the program marks it (the Python bindings when they make the Python
  // exception), so an exit path does not raise again a verdict the program
  // saw and handled (its own exit status stays its own).
  void setSeenFlag(SeenFlag flag) {
    seen_ = std::move(flag);
  }
  const SeenFlag& seenFlag() const {
    return seen_;
  }
  void markSeen() const {
    if (seen_) seen_->store(true, std::memory_order_release);
  }

 private:
  GuardErrorKind kind_;
  SeenFlag seen_;
};

// Throws the GuardError subclass for `kind` (so catch sites can be specific).
[[noreturn]] void throwGuardError(GuardErrorKind kind, const std::string& msg, SeenFlag seen = nullptr);

// How a guard error leaves the guard: the form it takes where a Work's wait(),
// a future's error or a collective call hands it to torch and so to the
// program. Inside the core, errors are the C++ types above. torch translates
// C++ exceptions to Python itself on some paths (the autograd engine running
// DDP's reducer, dispatcher ops), where a c10::DistBackendError becomes
// torch.distributed.DistBackendError whatever its subclass; so the Python
// bindings install a surface that keeps the torch_ext type there
// (docs/architecture.md, "One error, whatever the path"). Without one (C++
// programs, the GoogleTest suite) an error leaves as itself.
using ErrorSurface = std::exception_ptr (*)(const GuardError&);
void setErrorSurface(ErrorSurface surface);
// `err` as it leaves the guard: a GuardError through the installed surface
// (marked seen when there is none: the C++ caller gets it as is), anything
// else unchanged.
std::exception_ptr surfaced(std::exception_ptr err);
// Runs `body`; a GuardError it throws leaves through the surface.
template <class F>
decltype(auto) surfacing(F&& body) {
  try {
    return body();
  } catch (const GuardError&) {
    std::rethrow_exception(surfaced(std::current_exception()));
  }
}

class CollectiveMismatchError : public GuardError {
 public:
  explicit CollectiveMismatchError(std::string msg) : GuardError(GuardErrorKind::Mismatch, std::move(msg)) {}
};

class CollectiveTimeoutError : public GuardError {
 public:
  explicit CollectiveTimeoutError(std::string msg) : GuardError(GuardErrorKind::Timeout, std::move(msg)) {}

 protected:
  CollectiveTimeoutError(GuardErrorKind kind, std::string msg) : GuardError(kind, std::move(msg)) {}
};

// A wait that can never end: the ranks of a wait-for cycle (across groups, or
// send/recv) each block in their wait for another of them. Raised as soon as
// the cycle is certain (TORCH_EXT_END_DEADLOCKS), not at abort_after. A
// CollectiveTimeoutError, so code that catches hangs catches this too.
class DeadlockError : public CollectiveTimeoutError {
 public:
  explicit DeadlockError(std::string msg) : CollectiveTimeoutError(GuardErrorKind::Deadlock, std::move(msg)) {}
};

class CollectiveFailureError : public GuardError {
 public:
  explicit CollectiveFailureError(std::string msg) : GuardError(GuardErrorKind::Failure, std::move(msg)) {}

 protected:
  CollectiveFailureError(GuardErrorKind kind, std::string msg) : GuardError(kind, std::move(msg)) {}
};

// The store the guard exchanges its checks through (torchrun's agent, or rank
// 0's process under plain env://) is gone or stopped answering: no cross-rank
// check or report can be made, so every guarded group on it fails. A
// CollectiveFailureError, so code that catches peer failures catches this too.
class StoreLostError : public CollectiveFailureError {
 public:
  explicit StoreLostError(std::string msg) : CollectiveFailureError(GuardErrorKind::StoreLost, std::move(msg)) {}
};

// A guard group could not be created: ranks that did not join it within
// join_timeout (or are known to have created another backend there), or
// ranks whose torch_ext cannot work together (store/JoinHandshake.h). Raised
// by init_process_group / new_group on every rank that joined, before any
// collective; the message names the ranks and what is known of each.
class GroupJoinError : public GuardError {
 public:
  explicit GroupJoinError(std::string msg) : GuardError(GuardErrorKind::Join, std::move(msg)) {}
};

}  // namespace torch_ext
