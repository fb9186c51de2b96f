#pragma once

// NcclSimSettings: the nccl_sim test backend's own switches, parsed here and
// nowhere else (the guard's Config knows nothing of them).

#include <cstdint>

namespace torch_ext {

// The switches of the nccl_sim test backend: testing settings (variables
// TORCH_EXT_NCCL_SIM_*, no GuardOptions field, nothing of the guard's), listed
// in the README's testing table. A switch names one rank and one operation of the default group.
struct NcclSimSettings {
  struct Fault {
    int64_t rank = -1;  // -1: off
    int64_t value = 0;  // the Nth operation (from 1), or milliseconds for `slow`
  };
  Fault stall;  // TORCH_EXT_NCCL_SIM_STALL=RANK:N: the stream stops before its Nth op until aborted
  Fault fail;   // TORCH_EXT_NCCL_SIM_FAIL=RANK:N: that op fails on that rank's stream
  Fault slow;   // TORCH_EXT_NCCL_SIM_SLOW=RANK:MS: every op of that rank's stream takes MS longer
  // TORCH_EXT_NCCL_SIM_QUEUE: operations a stream holds before issuing blocks
  // the host (CUDA's launch queue is finite too).
  int64_t queueDepth = 1024;
  // TORCH_EXT_NCCL_SIM_WAIT: what work.wait() does. "stream" (default):
  // returns at once, as on NCCL, and host code reads results after
  // synchronize(). "data": blocks until the data is there, for CPU code that
  // reads results right after wait() (on a GPU such reads are kernels ordered
  // after the collective; on CPU the host is the compute stream): FSDP2's
  // copy-out, torch's object collectives, Lightning.
  bool waitForData = false;

  // Reads TORCH_EXT_NCCL_SIM_*; throws ConfigError naming the variable.
  static NcclSimSettings fromEnv();
};

}  // namespace torch_ext
