#pragma once

// Errands: the guard's short background tasks, each on a thread of its own,
// owned here instead of detached.
//
// Some work cannot run on the thread that starts it: a strict receive posted
// once its sender's print is there (CollectiveChecks), a group failed a
// moment after its check backend broke (Verifier). Each is an errand: it is
// named, it ends by itself (its group failing ends it at the latest), and the
// process joins it at exit (Watchdog::atExit) instead of leaving a detached
// thread nobody can name. Ended errands are joined as new ones start, so
// threads never pile up.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace torch_ext {

class Errands {
 public:
  static Errands& instance();

  // Runs `task` on a new thread, as the errand `name`. An exception it throws
  // is logged, never lost in a thread nobody joins.
  void run(std::string name, std::function<void()> task);

  // Joins every errand that ended; waits up to `bound` for the others. The
  // names of those still running after it (left to the process's exit: an
  // errand stuck in a transport that never returns must not hold the exit).
  std::vector<std::string> finish(std::chrono::milliseconds bound);

  // Errands started and not yet ended.
  size_t running() const;

 private:
  struct Errand {
    std::string name;
    std::thread thread;
    bool ended = false;
  };
  // Joins the ended errands; called with mu_ held (an ended errand takes
  // no lock again: joining it waits only for its thread to return).
  void joinEnded();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<Errand> errands_;
};

}  // namespace torch_ext
