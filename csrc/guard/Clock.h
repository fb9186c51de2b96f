#pragma once

// Clock: the two clocks of the guard, in nanoseconds since their epochs.
// wallNs (system clock): what records carry across processes and machines
// (status records, snapshots, dumps). steadyNs (monotonic): durations and
// deadlines inside this process.

#include <cstdint>

namespace torch_ext {

int64_t wallNs();
int64_t steadyNs();

}  // namespace torch_ext
