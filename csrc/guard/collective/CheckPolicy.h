#pragma once

// CheckPolicy: what each check mode does, decided here and nowhere else.
//
// Every part of the guard that behaves by mode (the backend, the checks, the
// watchdog, the dumps, the terminate handler) reads one of these answers; no
// other file compares a CheckMode (tests/python/test_layout.py holds it). A
// group's policy is made once, from its settings, by GroupState.

#include "guard/Config.h"

namespace torch_ext {

struct CheckPolicy {
  CheckMode mode = CheckMode::Verify;

  // Any mode but off: the ranks' collectives are compared. A difference fails
  // the group (off: a verdict only warns); a send or receive left unmatched is
  // looked into; gloo's transport thread is parked, not let terminate the
  // process, when it finds two ranks' byte counts differ.
  bool compares = false;
  // strict: each collective's fingerprint is exchanged on the helper group
  // before the inner call, and each send/receive pair is checked through the
  // store before the receive is posted.
  bool checksBeforeIssue = false;
  // verify: a Verifier checks the collectives in rounds next to them (or in
  // band, carried by the collective), and sends are paired with their receives
  // (P2PPairing); a result is released once checked.
  bool verifies = false;
  // verify and strict: a collective's result reaches the program only once
  // every rank is known to have issued the same collective.
  bool resultsWaitForTheCheck = false;
  // async: the collectives are compared after the fact, by the rolling
  // fingerprints each rank's status carries to its ring neighbours; an
  // all-to-all's split sizes are audited on the helper group after issue.
  bool comparesInStatusRing = false;
  bool auditsSplitsAfterIssue = false;
  // strict (and any comparing mode with call_paths=on): each collective's call
  // path is part of what the ranks compare (Config.h, CallPathMode).
  bool comparesCallPaths = false;

  static CheckPolicy of(CheckMode mode, CallPathMode callPaths = CallPathMode::Auto);
};

}  // namespace torch_ext
