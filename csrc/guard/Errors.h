#pragma once

// Typed failures of a guarded process group. They derive from
// c10::DistBackendError, so code that catches torch.distributed.DistBackendError
// keeps working; the bindings translate each one to its torch_ext Python class.

#include "guard/report/EnumNames.h"

#include <c10/util/Exception.h>

#include <string>

namespace torch_ext {

enum class GuardErrorKind : uint8_t {
  Mismatch,  // ranks issued different collectives (CollectiveMismatchError)
  Timeout,   // a collective outlived abort_after (CollectiveTimeoutError)
  Failure,   // the inner backend failed, e.g. a peer died (CollectiveFailureError)
  StoreLost, // the store is gone or does not answer (StoreLostError, a CollectiveFailureError)
};

template <>
struct EnumTable<GuardErrorKind> {
  static constexpr NamedValue<GuardErrorKind> kEntries[] = {
      {GuardErrorKind::Mismatch, "mismatch"},
      {GuardErrorKind::Timeout, "timeout"},
      {GuardErrorKind::Failure, "failure"},
      {GuardErrorKind::StoreLost, "store_lost"},
  };
};
inline const char* guardErrorKindName(GuardErrorKind kind) {
  return enumName(kind);
}

class GuardError : public c10::DistBackendError {
 public:
  GuardError(GuardErrorKind kind, std::string msg)
      : c10::DistBackendError(std::move(msg)), kind_(kind) {}
  GuardErrorKind kind() const {
    return kind_;
  }

 private:
  GuardErrorKind kind_;
};

// Throws the GuardError subclass for `kind` (so catch sites can be specific).
[[noreturn]] void throwGuardError(GuardErrorKind kind, const std::string& msg);

class CollectiveMismatchError : public GuardError {
 public:
  explicit CollectiveMismatchError(std::string msg) : GuardError(GuardErrorKind::Mismatch, std::move(msg)) {}
};

class CollectiveTimeoutError : public GuardError {
 public:
  explicit CollectiveTimeoutError(std::string msg) : GuardError(GuardErrorKind::Timeout, std::move(msg)) {}
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

} // namespace torch_ext
