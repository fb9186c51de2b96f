#include "python/PyErrors.h"

#include <torch/csrc/Exceptions.h>

#include <atomic>

namespace torch_ext::py {
namespace {

// The torch_ext classes, kept alive for the life of the process: a
// translation may run at exit. Written once at import, with the GIL held,
// before the surface is installed; read from any thread afterwards.
struct Classes {
  PyObject* guard = nullptr;
  PyObject* mismatch = nullptr;
  PyObject* timeout = nullptr;
  PyObject* failure = nullptr;
  PyObject* storeLost = nullptr;
  PyObject* deadlock = nullptr;
  PyObject* join = nullptr;
};
Classes g_classes;

PyObject* classFor(GuardErrorKind kind) {
  switch (kind) {
    case GuardErrorKind::Mismatch:
      return g_classes.mismatch;
    case GuardErrorKind::Timeout:
      return g_classes.timeout;
    case GuardErrorKind::Failure:
      return g_classes.failure;
    case GuardErrorKind::StoreLost:
      return g_classes.storeLost;
    case GuardErrorKind::Deadlock:
      return g_classes.deadlock;
    case GuardErrorKind::Join:
      return g_classes.join;
  }
  return g_classes.guard;
}

// A guard error on its way to Python. No Python object is made until a
// translator asks (python_type(), called with the GIL held): the surface runs
// on any thread, the watchdog's and the inner backend's included, and never
// takes the GIL.
class SurfacedGuardError : public torch::PyTorchError {
 public:
  SurfacedGuardError(GuardErrorKind kind, std::string msg, SeenFlag seen)
      : torch::PyTorchError(std::move(msg)), kind_(kind), seen_(std::move(seen)) {}

  PyObject* python_type() override {
    markSeen();
    return classFor(kind_);
  }
  GuardErrorKind kind() const {
    return kind_;
  }
  void markSeen() const {
    if (seen_) seen_->store(true, std::memory_order_release);
  }

 private:
  GuardErrorKind kind_;
  SeenFlag seen_;
};

std::exception_ptr surface(const GuardError& e) {
  return std::make_exception_ptr(SurfacedGuardError(e.kind(), e.what_without_backtrace(), e.seenFlag()));
}

}  // namespace

void installErrors(pybind11::object guard, pybind11::object mismatch, pybind11::object timeout,
                   pybind11::object failure, pybind11::object storeLost, pybind11::object deadlock,
                   pybind11::object join) {
  g_classes.guard = guard.release().ptr();
  g_classes.mismatch = mismatch.release().ptr();
  g_classes.timeout = timeout.release().ptr();
  g_classes.failure = failure.release().ptr();
  g_classes.storeLost = storeLost.release().ptr();
  g_classes.deadlock = deadlock.release().ptr();
  g_classes.join = join.release().ptr();
  setErrorSurface(&surface);
}

void translateError(std::exception_ptr p) {
  try {
    if (p) std::rethrow_exception(p);
  } catch (SurfacedGuardError& e) {
    PyErr_SetString(e.python_type(), e.what());
  } catch (const GuardError& e) {
    PyObject* cls = classFor(e.kind());
    if (cls == nullptr) throw;
    e.markSeen();
    PyErr_SetString(cls, e.what_without_backtrace());
  }
}

}  // namespace torch_ext::py
