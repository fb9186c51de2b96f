#pragma once

// Operation: one user operation on its way through the guard, described once.
//
// GuardBackend::issue builds it (CollectiveChecks::record: the call site, the
// label, the ledger record and the route the group's mode picks) and every
// later step reads it: the checks before the inner call, the inner call
// or the route that replaces it, the checks after it and the work the program
// gets. Nothing is computed twice on the way.

#include "guard/collective/Fingerprint.h"

#include <c10/core/DeviceType.h>

#include <cstdint>
#include <optional>

namespace torch_ext {

// How the operation reaches the inner backend.
enum class Route : uint8_t {
  Inner,     // the inner backend's own call, as the user made it
  InBand,    // the collective carries its own check (Mode::carry; verify's InBandCheck)
  Deferred,  // a receive posted later (Mode::deferReceive; strict's, once its sender's print is there)
};

struct Operation {
  Op op = Op::Barrier;
  c10::DeviceType device = c10::DeviceType::CPU;
  bool streamOrdered = false;  // the inner backend's works complete on a stream (StreamOrdered.h)
  uint32_t site = 0;           // CallSites id (0: not captured)
  uint32_t label = 0;          // LabelTable id active on the issuing thread
  // The ledger's record: its id, the group's collective seq (0 for p2p), the
  // pair's ordinal (p2p) and the rolling hash of every collective so far.
  uint64_t id = 0, seq = 0, ordinal = 0, rolling = 0;
  uint64_t hash = 0, splitSend = 0, splitRecv = 0;

  // How it reaches the inner backend: the group's mode decides (Mode.h).
  Route route = Route::Inner;

  // The fingerprint, kept past the ledger record only where the mode needs it
  // after (Mode::keepsFingerprint); the ledger owns the record's own copy.
  std::optional<Fingerprint> kept;
};

}  // namespace torch_ext
