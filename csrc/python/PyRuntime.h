#pragma once

// PyRuntime: the Python side of guard/Runtime.h. Only csrc/python touches the
// interpreter (call sites and the frames' classes: PyFrames.h).
//
//  - Main-thread stacks for hang reports: a helper thread takes the GIL and
//    reads the main thread's frames. If the GIL cannot be had within the budget,
//    the main thread is holding it in native code, so its frames are not moving
//    and are read without the GIL (as faulthandler does).
//  - Logging: messages are queued and emitted on the helper thread through the
//    `torch_ext` logger, so the watchdog never waits for the GIL.

#include "guard/report/Frame.h"

#include <cstdint>
#include <chrono>
#include <string>
#include <vector>

struct _object;  // PyObject, without including Python.h here

namespace torch_ext::py {

// Call with the GIL held, at import. Frames under `internal` (torch, torch_ext)
// are never user frames; frames under `stdlib` are not either; frames under
// `sitePackages` (which may sit inside the stdlib folder) or any
// site-packages/dist-packages folder are framework frames, named by their
// top-level package. `mainThreadId` is threading.main_thread().ident.
void installRuntime(const std::vector<std::string>& internal, const std::vector<std::string>& stdlib,
                    const std::vector<std::string>& sitePackages, unsigned long mainThreadId);
// Call with the GIL held at interpreter exit: stops the helper thread and
// detaches every hook.
void uninstallRuntime();
// Waits, at most `timeout` and without the GIL, until the log records handed to
// Python's logging so far are written (interpreter exit: a report logged just
// before an uncaught error must not be lost). True if they all were.
bool flushLogs(std::chrono::milliseconds timeout);
// With the GIL held: true if `code` is a code object whose file name and
// (qualified) name can be read later without the GIL (compact ASCII strings,
// as faulthandler reads them); it then takes a reference to it, kept for good,
// so LabelTable can resolve it when a label is first read (see resolveOrigin in
// PyRuntime.cpp, installed as LabelTable's resolver).
bool keepForLazyOrigin(_object* code);

}  // namespace torch_ext::py
