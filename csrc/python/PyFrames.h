#pragma once

// PyFrames: Python frames classified (whose code a frame runs: the user's, an
// installed framework's, torch's or the standard library's) and the call site
// of a collective, captured on the thread that issues it (docs/architecture.md,
// "Whose line a call site names"). Only csrc/python includes this.
//
// A capture walks the issuing thread's frames to the first frame of the user's
// code (not torch, torch_ext, the standard library, an installed package or a
// package listed in TORCH_EXT_LIBRARY_PACKAGES), remembering the innermost
// framework frame on the way ("via"), then up to three user frames that called
// it. Each code object's kind is decided once and cached, and so is each site,
// so the strings are built once per call site. A site the thread has captured
// before is found without the GIL on CPython 3.11 (issue 70); the first
// capture of a site, and every capture on other versions, takes it.

#include "guard/report/Frame.h"

#include <Python.h>
#include <frameobject.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace torch_ext::py {

enum class FrameKind : uint8_t {
  User,       // the user's script or a package under development
  Framework,  // an installed package or one the user listed (Lightning, Accelerate, ...)
  Core,       // torch, torch_ext, the standard library: never named as the "via" frame
};

struct Classified {
  FrameKind kind = FrameKind::User;
  std::string library;  // empty for user code
};

// The rule of docs/architecture.md ("Whose line a call site names").
Classified classifyFile(const std::string& file);

// getattr(obj, name) as a string; "" if it is missing or not a string. GIL held.
std::string attrString(PyObject* obj, const char* name);

// A code object's strings and class, cached for good (the cache holds a
// reference to the code object). GIL held.
struct CodeInfo {
  FrameKind kind = FrameKind::User;
  std::string library;
  std::string filename;
  std::string function;
};
const CodeInfo& codeInfo(PyCodeObject* code);
Frame frameOf(PyFrameObject* frame, const CodeInfo& info);

// The library roots (torch's and torch_ext's folders, the standard library's,
// site-packages) and the caches, at install. GIL held.
void installFrames(const std::vector<std::string>& internal, const std::vector<std::string>& stdlib,
                   const std::vector<std::string>& sitePackages);
// The calling thread's call site (CallSites' provider); 0: none. With or without the GIL.
uint32_t captureCallSite();

// With the GIL held: the frame a code object and line name, classified as call
// sites are (the library it belongs to, if any). An empty frame for anything
// but a code object.
Frame frameOfCode(PyObject* code, int line);
// Turns call-site capture on or off process-wide.
void setCallSitesEnabled(bool enabled);
// With the GIL held: (folder prefix, package name) of each package the user
// listed as library code (TORCH_EXT_LIBRARY_PACKAGES). Forgets the decisions
// cached so far, this process's threads' copies included.
void setListedLibraries(const std::vector<std::pair<std::string, std::string>>& roots);

}  // namespace torch_ext::py
