#include "guard/device/CudaGate.h"

#include "guard/device/GateKernel.h"

#include <c10/util/Exception.h>

#include <dlfcn.h>

#include <array>
#include <cstring>
#include <mutex>
#include <sstream>

namespace torch_ext::device {

namespace {

// The few driver types and calls the gate needs (cuda.h's ABI, stable since CUDA 4).
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
using CUdeviceptr = unsigned long long;
constexpr unsigned kHostAllocPortable = 0x01;
constexpr unsigned kHostAllocDeviceMap = 0x02;
constexpr size_t kWordsPerPage = 512;  // 4 KiB of pinned memory per allocation
constexpr int kMaxDevices = 64;
constexpr unsigned kThreads = 256;

struct GateArgs {
  GateRegion r[4];
};
static_assert(sizeof(GateArgs) == 128, "GateArgs must match gate_kernel.cu's GateRegions");

std::mutex mu;  // loading, modules, the word pool

}  // namespace

struct CudaGate::Driver {
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*deviceGet)(CUdevice*, int) = nullptr;
  CUresult (*primaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*ctxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*ctxPush)(CUcontext) = nullptr;
  CUresult (*ctxPop)(CUcontext*) = nullptr;
  CUresult (*moduleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*moduleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*launchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void**, void**) = nullptr;
  CUresult (*memHostAlloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*memHostGetDevicePointer)(CUdeviceptr*, void*, unsigned) = nullptr;
  CUresult (*getErrorString)(CUresult, const char**) = nullptr;

  std::array<CUcontext, kMaxDevices> contexts{};
  std::array<std::atomic<CUfunction>, kMaxDevices> functions{};
  std::atomic<uint64_t>* page = nullptr;
  size_t used = kWordsPerPage;

  std::string error(const char* call, CUresult r) const {
    const char* text = nullptr;
    if (getErrorString != nullptr) getErrorString(r, &text);
    std::ostringstream os;
    os << call << " failed: " << (text != nullptr ? text : "CUDA driver error") << " (" << r << ")";
    return os.str();
  }
  // The primary context of `device` current on this thread while in scope.
  struct Scope {
    const Driver& d;
    bool pushed = false;
    Scope(const Driver& drv, CUcontext ctx) : d(drv) {
      CUcontext cur = nullptr;
      d.ctxGetCurrent(&cur);
      if (cur != ctx) pushed = d.ctxPush(ctx) == 0;
    }
    ~Scope() {
      if (pushed) {
        CUcontext ignored = nullptr;
        d.ctxPop(&ignored);
      }
    }
  };
  CUcontext context(c10::DeviceIndex device) {  // mu held
    if (contexts[device] != nullptr) return contexts[device];
    CUdevice dev = 0;
    CUresult r = deviceGet(&dev, device);
    TORCH_CHECK(r == 0, "stream gate: ", error("cuDeviceGet", r));
    CUcontext ctx = nullptr;
    r = primaryCtxRetain(&ctx, dev);
    TORCH_CHECK(r == 0, "stream gate: ", error("cuDevicePrimaryCtxRetain", r));
    contexts[device] = ctx;
    return ctx;
  }
};

CudaGate& CudaGate::instance() {
  static CudaGate* gate = new CudaGate();  // never destroyed: kernels may outlive exit's destructors
  return *gate;
}

bool CudaGate::available() {
  if (ready_.load(std::memory_order_acquire)) return true;
  std::lock_guard<std::mutex> lock(mu);
  if (!tried_) {
    tried_ = true;
    if (load()) ready_.store(true, std::memory_order_release);
  }
  return ready_.load(std::memory_order_acquire);
}

bool CudaGate::load() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    why_ = std::string("the CUDA driver does not load (") + dlerror() + ")";
    return false;
  }
  auto* d = new Driver();
  bool missing = false;
  auto sym = [&](auto& fn, const char* name) {
    void* p = dlsym(lib, name);
    if (p == nullptr) {
      if (!missing) why_ = std::string("the CUDA driver has no ") + name;
      missing = true;
      return;
    }
    std::memcpy(&fn, &p, sizeof(p));
  };
  sym(d->init, "cuInit");
  sym(d->deviceGet, "cuDeviceGet");
  sym(d->primaryCtxRetain, "cuDevicePrimaryCtxRetain");
  sym(d->ctxGetCurrent, "cuCtxGetCurrent");
  sym(d->ctxPush, "cuCtxPushCurrent_v2");
  sym(d->ctxPop, "cuCtxPopCurrent_v2");
  sym(d->moduleLoadData, "cuModuleLoadData");
  sym(d->moduleGetFunction, "cuModuleGetFunction");
  sym(d->launchKernel, "cuLaunchKernel");
  sym(d->memHostAlloc, "cuMemHostAlloc");
  sym(d->memHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
  sym(d->getErrorString, "cuGetErrorString");
  if (missing) {
    delete d;
    return false;
  }
  const CUresult r = d->init(0);
  if (r != 0) {
    why_ = d->error("cuInit", r);
    delete d;
    return false;
  }
  driver_ = d;
  return true;
}

void* CudaGate::function(c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "stream gate: CUDA device ", int(device), " is out of range");
  if (CUfunction f = driver_->functions[device].load(std::memory_order_acquire)) return f;
  std::lock_guard<std::mutex> lock(mu);
  if (CUfunction f = driver_->functions[device].load(std::memory_order_acquire)) return f;
  Driver::Scope scope(*driver_, driver_->context(device));
  CUmodule module = nullptr;
  CUresult r = driver_->moduleLoadData(&module, kGateKernelPtx);
  TORCH_CHECK(r == 0, "stream gate: loading its kernel on cuda:", int(device), ": ",
              driver_->error("cuModuleLoadData", r));
  CUfunction f = nullptr;
  r = driver_->moduleGetFunction(&f, module, kGateKernelName);
  TORCH_CHECK(r == 0, "stream gate: ", driver_->error("cuModuleGetFunction", r));
  driver_->functions[device].store(f, std::memory_order_release);
  return f;
}

std::atomic<uint64_t>* CudaGate::allocateWord(c10::DeviceIndex device) {
  TORCH_CHECK(available(), "stream gate: ", why_);
  std::lock_guard<std::mutex> lock(mu);
  Driver& d = *driver_;
  if (d.used == kWordsPerPage) {
    TORCH_CHECK(device >= 0 && device < kMaxDevices, "stream gate: CUDA device ", int(device), " is out of range");
    Driver::Scope scope(d, d.context(device));
    void* p = nullptr;
    CUresult r = d.memHostAlloc(&p, kWordsPerPage * sizeof(uint64_t), kHostAllocPortable | kHostAllocDeviceMap);
    TORCH_CHECK(r == 0, "stream gate: ", d.error("cuMemHostAlloc", r));
    CUdeviceptr dp = 0;
    r = d.memHostGetDevicePointer(&dp, p, 0);
    TORCH_CHECK(r == 0, "stream gate: ", d.error("cuMemHostGetDevicePointer", r));
    // Unified addressing (every 64-bit CUDA platform): the kernel reads the
    // word at its host address, whichever device it runs on.
    TORCH_CHECK(dp == reinterpret_cast<CUdeviceptr>(p),
                "stream gate: pinned memory is mapped at another device address (no unified addressing)");
    d.page = static_cast<std::atomic<uint64_t>*>(p);
    d.used = 0;
  }
  auto* word = new (d.page + d.used++) std::atomic<uint64_t>(0);
  return word;
}

void CudaGate::hold(c10::DeviceIndex device, void* stream, std::atomic<uint64_t>* word, uint64_t seq,
                    const std::vector<GateRegion>& regions) {
  CUfunction f = function(device);
  CUcontext ctx = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    ctx = driver_->context(device);
  }
  Driver::Scope scope(*driver_, ctx);
  const auto* wordPtr = reinterpret_cast<const unsigned long long*>(word);
  size_t next = 0;
  do {  // one launch per four regions (one for none): the first waits, the others pass at once
    GateArgs args{};
    unsigned n = 0;
    for (; n < 4 && next < regions.size(); ++n) args.r[n] = regions[next++];
    unsigned long long s = seq;
    void* params[] = {&wordPtr, &s, &n, &args};
    const CUresult r =
        driver_->launchKernel(f, 1, 1, 1, kThreads, 1, 1, 0, static_cast<CUstream>(stream), params, nullptr);
    TORCH_CHECK(r == 0, "stream gate: ", driver_->error("cuLaunchKernel", r), " on cuda:", int(device));
    launches_.fetch_add(1, std::memory_order_relaxed);
  } while (next < regions.size());
}

}  // namespace torch_ext::device
