#pragma once

// CudaGate: the CUDA half of the stream gate (StreamGate.h), for the whole
// process. It talks to the CUDA driver, loaded at run time (dlopen of
// libcuda.so.1, which a CUDA build of torch has loaded already), so that the
// extension builds and runs without CUDA: nothing here is touched before a
// CUDA stream is held.
//
//  - The gate word of a group lives in pinned host memory mapped into the
//    device (cuMemHostAlloc, DEVICEMAP | PORTABLE): the verifier's thread
//    writes it with a plain atomic store, the kernel reads it with volatile
//    loads. Words are carved from pinned pages and never freed: a kernel
//    may still be reading one while its group goes away.
//  - The kernel (GateKernel.h, PTX) is loaded once per device, into its
//    primary context (torch's), and launched with one block on the stream
//    the caller holds: the stream's later work runs only after the verdict.
//  - cuStreamWaitValue is not used: it was reported to block host-side driver
//    calls while parked on driver 580 (issue 40).
//
// Any failure (no driver, a PTX the driver cannot load) is reported once by
// available()'s text; the gate is then off for CUDA in this process.

#include "guard/device/GateWord.h"

#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace torch_ext::device {

// One region of a result for the poison fill (see gate_kernel.cu).
struct GateRegion {
  uint64_t ptr = 0;
  uint64_t count = 0;
  uint64_t bits = 0;
  uint32_t width = 0;
  uint32_t pad = 0;
};
static_assert(sizeof(GateRegion) == 32, "GateRegion must match gate_kernel.cu");

class CudaGate {
 public:
  static CudaGate& instance();

  // Whether the gate can run on CUDA in this process; "" or why not.
  bool available();
  const std::string& unavailableWhy() const {
    return why_;
  }
  // A fresh gate word (value 0) readable by every device; `device` is the one
  // whose context allocates it (the first to hold a stream). Throws if unavailable.
  std::atomic<uint64_t>* allocateWord(c10::DeviceIndex device);
  // Enqueues on `stream` (a CUstream; the current stream of `device`) the wait
  // for collective #seq on `word`, with `regions` to fill if it is poisoned.
  // Throws c10::Error with the driver's words if the launch fails.
  void hold(c10::DeviceIndex device, void* stream, std::atomic<uint64_t>* word, uint64_t seq,
            const std::vector<GateRegion>& regions);
  uint64_t launches() const {
    return launches_.load(std::memory_order_relaxed);
  }

 private:
  CudaGate() = default;
  struct Driver;
  bool load();  // once, under mu_
  void* function(c10::DeviceIndex device);

  std::string why_;
  Driver* driver_ = nullptr;
  bool tried_ = false;
  std::atomic<bool> ready_{false};
  std::atomic<uint64_t> launches_{0};
};

}  // namespace torch_ext::device
