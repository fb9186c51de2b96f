#pragma once

// LauncherStop: what a rank leaves behind when its launcher stops it, and the
// launcher's error file.
//
// torchrun's agent ends the surviving workers with SIGTERM as soon as one
// worker's process ends (0.05-0.6 s later), then prints its failure summary:
// for each worker the exit code and the "error file" that worker wrote
// (torchelastic's TORCHELASTIC_ERROR_FILE, a JSON the @record decorator
// writes). A rank gone is named by the guard about a second after it went (the
// inner backend's transport fails, the ranks compare what they saw), so under
// torchrun the survivors died before they could say it, and the summary read
// "Signal 15 (SIGTERM) received" for every one of them.
//
// Installed by the Python front with the first guarded group when the process
// runs under torchelastic (it names the error file) and SIGTERM still has its
// default action (a program's or framework's own handler is left alone).
// The handler only posts a semaphore (async-signal-safe); a thread of its own
// then, bounded by a few seconds (torchrun waits 30 s before SIGKILL):
//  - waits for a verdict on this rank's pending collectives, where one is
//    coming (kVerdictBound); a group that failed gives its report;
//  - otherwise describes what this rank waits in and what each peer of that
//    group last published (exited, left, its last heartbeat);
//  - writes the report to stderr (unless the program was already handed the
//    failure), publishes this rank's last words, writes a dump where dumps
//    are configured, and the error file (unless one exists), so torchrun's
//    summary prints the guard's report under this rank;
//  - restores SIGTERM's default action and raises it again: the process ends
//    as the launcher asked, with the status it expects (-15).

#include <string>

namespace torch_ext {

// Installs the SIGTERM handler and its thread once per process; `errorFile`
// is where the launcher reads this worker's error (TORCHELASTIC_ERROR_FILE).
// Returns false when SIGTERM already has a handler (left as it is).
bool installLauncherStop(const std::string& errorFile);

// Writes torchelastic's error file at `path` unless one is there already (the
// first error of a process is its story): {"message": {"message": `message`,
// "extraInfo": {"py_callstack": `details`, "timestamp": "<s>"}}}, which the
// agent's summary prints as the worker's traceback. Returns false when it
// could not be written (or existed).
bool writeLauncherErrorFile(const std::string& path, const std::string& message, const std::string& details);

}  // namespace torch_ext
