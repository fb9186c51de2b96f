#pragma once

// LabelTable: the labels of torch_ext.label(...), interned like call sites, and
// the label active on each thread.
//
// A label is interned once (by the Python side, when a `with torch_ext.label(...)`
// is entered; the Python side caches the id), and the thread that enters it sets
// its id as the thread's current label. GuardBackend::run reads the current id
// (one thread_local load, nothing else, whether a label is active or not) and
// the ledger stores it next to the call site: 4 bytes per entry. The strings are
// looked up only when a snapshot, dump or report is made.

#include "guard/report/Label.h"

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace torch_ext {

namespace detail {
inline thread_local uint32_t t_currentLabel = 0;
} // namespace detail

class LabelTable {
 public:
  static constexpr size_t kMaxLabels = 1 << 16;

  static LabelTable& instance();

  // A stable id >= 1 for `label`; 0 for an empty label or when the table is
  // full (kMaxLabels distinct labels: the collective then goes unlabelled).
  uint32_t intern(const Label& label);
  // The label of `id`; empty for 0 or an unknown id.
  Label get(uint32_t id) const;

  // The calling thread's current label id (0: none).
  static uint32_t current() {
    return detail::t_currentLabel;
  }
  // Sets the calling thread's current label; returns the previous one.
  static uint32_t setCurrent(uint32_t id) {
    const uint32_t prev = detail::t_currentLabel;
    detail::t_currentLabel = id;
    return prev;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Label> labels_{Label{}};  // index 0: none
  std::unordered_map<std::string, uint32_t> byKey_;
};

} // namespace torch_ext
