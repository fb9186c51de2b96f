#pragma once

// Frame: one Python frame as the reports show it (file, line, function, and the
// library it belongs to), how frames read in a report, and a thread's stack.
// Pure values: the live side captures them (CallSites, the Runtime's stack
// hook), snapshots and dumps carry them.

#include <cstdint>
#include <string>
#include <vector>

namespace torch_ext {

struct Frame {
  std::string filename;
  int line = 0;
  std::string function;
  // Empty for the user's code; otherwise the library the frame belongs to:
  // an installed package ("lightning"), a package the user listed in
  // TORCH_EXT_LIBRARY_PACKAGES, "torch", "torch_ext" or "stdlib".
  std::string library;
  bool isUser() const {
    return library.empty();
  }
  // "train.py:120 in training_step" (basename of the file); a library frame
  // names its library: "lightning .../distributed.py:213 in _sync_ddp".
  std::string describe() const;
};

// Frames innermost first.
std::string describeFrames(const std::vector<Frame>& frames, size_t maxFrames = 3);

// A call site as captured (innermost first): the user's frame, then the
// framework frame it went through, if any, then its path: the user frames that
// called it (a few, innermost first). The site alone:
// "train.py:15 in validation_step (via lightning .../distributed.py:213 in _sync_ddp)".
std::string describeCallSite(const std::vector<Frame>& frames);
// The user frames that called a call site (its path), innermost first.
std::vector<Frame> callersOf(const std::vector<Frame>& site);
// The site and the line that called it, which tells apart collectives issued
// through one helper: "model.py:28 in gather from model.py:37 in step".
std::string describeCallPath(const std::vector<Frame>& site);
// The line that called the site ("model.py:37 in step"; "" when none).
std::string describeCaller(const std::vector<Frame>& site);

// A main-thread stack (innermost first) for reports: the innermost frame (where
// the thread is now), then the user's frames, with each run of library frames
// between them folded ("... 6 lightning frames ..."). At most `maxUser` user
// frames; a user frame is never dropped in favour of a library frame.
std::string describeStack(const std::vector<Frame>& frames, size_t maxUser = 4);

struct MainThreadStack {
  std::vector<Frame> frames;  // innermost first, user frames only where possible
  std::string note;           // e.g. "main thread holds the GIL (blocked in native code?)"
  bool available = false;
};

// Another Python thread's stack (live reports): its ident, its threading name
// ("" when it has none, e.g. a thread started from C), innermost first.
struct ThreadStack {
  uint64_t id = 0;
  std::string name;
  std::vector<Frame> frames;
};

}  // namespace torch_ext
