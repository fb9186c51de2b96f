#pragma once

// TerminateHandler: what a process says when something terminates it (std::terminate).
//
// gloo terminates a process from its transport thread when a peer sends a
// different number of bytes than it expects (an all_gather, gather or
// send/recv whose sizes differ across ranks, an all_reduce of another dtype,
// an extra DDP step whose buckets meet another rank's loss all_reduce): an
// EnforceNotMet that nobody catches. No Python runs after it, and until now the
// only words were gloo's. Installed with the first guarded group, the handler
// first tells gloo's own case apart (its transport thread, a message longer
// than the receive posted for it): while a guarded group with a check is
// alive, it stops that thread instead of the process, and the check fails the
// group on every rank with the mismatch report (the thread stays stopped once
// a guarded group failed; after 60 s without one, the process ends as below).
// Otherwise:
//  - writes to stderr, ahead of the C++ runtime's own "terminate called after
//    throwing ..." text, that torch_ext sees this process being terminated,
//    with its pending collectives and their call sites, and what a byte-count
//    difference means (a collective mismatch); with no exception in flight (a
//    std::thread destroyed while joinable, a direct call), the terminating
//    thread's name and native stack, which nothing else would show;
//  - publishes, per group, this rank's snapshot (its ledger window) under
//    keys::lastWords(rank), so the other ranks' mismatch report describes this
//    rank's call instead of "did not answer";
//  - where this process hosts a group's store (plain env://, rank 0), raises
//    the failure itself and stays until the peers have left (bounded): its
//    threads still run, so the peers answer with their snapshots and get the
//    verdict (CollectiveMismatchError for a byte-count difference) instead of
//    a lost store;
// then hands over to the handler that was installed before (which aborts).
// A process that ends normally with a failed group leaves the same last words
// at exit (Watchdog::atExit), so an analysis that runs after it left still
// knows what it issued.
// Everything it does runs on a helper thread and is bounded (1 s for the
// words, which come first, then 1.5 s for the writes, then, on a store host,
// 15 s at most for the verdict and the peers' leaving): a terminate handler
// that blocks would turn a crash into a hang.

#include <string>

namespace torch_ext {

// Installs the handler once per process (later calls do nothing). The backend
// does, with its first group: the handler finds the groups through the watchdog.
void installTerminateHandler();

// Writes `text` to stderr with write(2): no stream, no lock, no allocation
// (usable while the process ends).
void sayOnStderr(const std::string& text);

}  // namespace torch_ext
