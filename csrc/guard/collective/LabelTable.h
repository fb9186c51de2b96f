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
//
// An origin may be interned unresolved (OriginRef: an opaque code object and a
// line, kept alive by the bindings): it is turned into a Frame by the resolver
// the bindings install, the first time the label is read (get()), i.e. when a
// snapshot, dump, report or torch_ext.ledger() needs it, and kept from then on.
// The core never looks inside an OriginRef.

#include "guard/report/Label.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace torch_ext {

namespace detail {
inline thread_local uint32_t t_currentLabel = 0;
// What of the current label every rank must agree on (identityOf), 0: nothing.
inline thread_local uint64_t t_currentIdentity = 0;
}  // namespace detail

// An origin frame not resolved yet: a code object (opaque here) and a line.
struct OriginRef {
  const void* code = nullptr;
  int line = 0;
};

class LabelTable {
 public:
  static constexpr size_t kMaxLabels = 1 << 16;
  // Fills `out` for `ref`; false if it cannot (the frame then reads "(code
  // object)"). Must not block: the watchdog calls it while writing a report.
  using Resolver = bool (*)(const OriginRef& ref, Frame* out);

  static LabelTable& instance();

  // A stable id >= 1 for `label`; 0 for an empty label or when the table is
  // full (kMaxLabels distinct labels: the collective then goes unlabelled).
  // `lazyOrigin`: origin frames to resolve when the label is first read, after
  // `label.origin`'s (the key holds their code objects' identities).
  uint32_t intern(const Label& label, const std::vector<OriginRef>& lazyOrigin = {});
  // The label of `id`, its origin resolved; empty for 0 or an unknown id.
  Label get(uint32_t id) const;
  // The metric label `id` is for (Label::metric); nullopt for none (id 0 included).
  std::optional<std::string> metricOf(uint32_t id) const;

  void setResolver(Resolver resolver) {
    resolver_.store(resolver, std::memory_order_release);
  }
  // Resolves every origin not resolved yet (the bindings call it before the
  // resolver can no longer read code objects: at interpreter exit).
  void resolveAll();
  // How many labels still hold unresolved origins (tests).
  size_t unresolved() const;

  // The calling thread's current label id (0: none).
  static uint32_t current() {
    return detail::t_currentLabel;
  }
  // The calling thread's current label's identity (identityOf), 0: none.
  static uint64_t currentIdentity() {
    return detail::t_currentIdentity;
  }
  // Sets the calling thread's current label; returns the previous one.
  static uint32_t setCurrent(uint32_t id);
  // What every rank must agree on for a collective issued under label `id`: a
  // hash of its "metric" field (the metric a sync is for: ranks syncing
  // different metrics of the same shape at the same step would otherwise mix
  // their values silently, Lightning#19106), else of its "module" field (FSDP2's
  // parameter groups: two modules' shards of one shape), 0 for a label without either. The
  // guard mixes it into the collective's fingerprint, so the checks compare it.
  uint64_t identityOf(uint32_t id) const;

 private:
  struct Stored {
    Label label;
    std::vector<OriginRef> pending;  // origin frames still to resolve (appended to label.origin)
    uint64_t identity = 0;           // identityOf
  };
  // Resolves `id`'s pending origin (outside the lock) and keeps it.
  void resolve(uint32_t id) const;

  mutable std::mutex mu_;
  mutable std::vector<Stored> labels_{Stored{}};  // index 0: none
  std::unordered_map<std::string, uint32_t> byKey_;
  std::atomic<Resolver> resolver_{nullptr};
};

}  // namespace torch_ext
