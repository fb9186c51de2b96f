#pragma once

// PyErrors: guard errors as Python sees them, on every path out of C++.
//
// Two translators stand between a C++ exception and Python, and torch picks
// which one runs:
//  - pybind11's (a direct call such as work.wait() or dist.all_reduce): ours
//    maps each GuardError kind to its torch_ext class;
//  - torch's HANDLE_TH_ERRORS (the autograd engine, where DDP's reducer waits
//    on gradient all_reduces inside loss.backward(); dispatcher ops), which
//    maps every c10::DistBackendError to torch.distributed.DistBackendError
//    and never asks pybind11. Exceptions deriving from torch::PyTorchError
//    choose their own Python type there (python_type()).
// So the core hands its errors out through an error surface (guard/Errors.h)
// and this one turns each into a SurfacedGuardError: a torch::PyTorchError
// (not a c10::Error, which HANDLE_TH_ERRORS would catch first) whose
// python_type() is the torch_ext class of its kind. Whichever translator
// runs, the program gets that class with the core's message, and the group's
// failure is marked seen (the exit path then keeps the program's own exit
// status).

#include "guard/Errors.h"

#include <pybind11/pybind11.h>

namespace torch_ext::py {

// Installs the Python classes (torch_ext.errors) and the error surface.
// Call with the GIL held, at import.
void installErrors(pybind11::object guard, pybind11::object mismatch, pybind11::object timeout,
                   pybind11::object failure, pybind11::object storeLost, pybind11::object deadlock,
                   pybind11::object join);

// pybind11's translator: sets the Python error for a GuardError or a
// SurfacedGuardError in `p`, and rethrows anything else.
void translateError(std::exception_ptr p);

}  // namespace torch_ext::py
