#include "guard/device/StreamGate.h"

#include "guard/Runtime.h"
#include "guard/device/CudaGate.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <cstring>

namespace torch_ext::device {

namespace {

// The bytes of a dense tensor, as regions of its poison pattern; false if not dense.
bool regionOf(const at::Tensor& t, GateRegion* out) {
  if (!t.defined() || t.numel() == 0 || !t.is_non_overlapping_and_dense()) return false;
  const PoisonFill fill = poisonFill(t.scalar_type());
  const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
  out->ptr = reinterpret_cast<uint64_t>(t.data_ptr());
  out->count = bytes / fill.width;
  out->bits = fill.bits;
  out->width = fill.width;
  return true;
}

}  // namespace

bool fillPoison(const at::Tensor& t) {
  GateRegion r;
  if (!regionOf(t, &r)) return false;
  auto* p = reinterpret_cast<unsigned char*>(r.ptr);
  for (uint64_t i = 0; i < r.count; ++i) std::memcpy(p + i * r.width, &r.bits, r.width);  // little-endian
  return true;
}

StreamGate::~StreamGate() {
  // A pinned word is left as it is (CudaGate never frees words); CPU holds go with us.
}

void StreamGate::publish(uint64_t value) {
  std::atomic<uint64_t>* w = word_.load(std::memory_order_seq_cst);
  GateWord::publish(*w, value);
  // The word moved to pinned memory meanwhile: write it there too (holdCuda
  // copies the old word after the move, so one of the two sees this value).
  std::atomic<uint64_t>* now = word_.load(std::memory_order_seq_cst);
  if (now != w) GateWord::publish(*now, value);
}

void StreamGate::release(uint64_t verifiedSeq) {
  publish(GateWord::released(verifiedSeq));
  std::vector<HostHold> late;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!host_.empty()) late = settleHost();
  }
  fillAfter(std::move(late));
}

void StreamGate::poison(uint64_t firstBad) {
  publish(GateWord::poisoned(firstBad));
  std::vector<HostHold> late;
  {
    std::lock_guard<std::mutex> lock(mu_);
    late = settleHost();
  }
  cv_.notify_all();
  fillAfter(std::move(late));
}

std::vector<StreamGate::HostHold> StreamGate::settleHost() {
  std::vector<HostHold> late;
  const uint64_t w = word();
  for (auto it = host_.begin(); it != host_.end();) {
    const GateVerdict v = GateWord::decide(w, it->seq);
    if (v == GateVerdict::Wait) {
      ++it;
      continue;
    }
    if (v == GateVerdict::Poison) {
      poisoned_.fetch_add(1, std::memory_order_relaxed);
      if (it->landed && !it->landed->completed()) {
        ++fillsPending_;
        late.push_back(std::move(*it));
      } else {
        for (const auto& t : it->outputs) fillPoison(t);
      }
    }
    it = host_.erase(it);
  }
  return late;
}

void StreamGate::fillAfter(std::vector<HostHold> late) {
  for (auto& h : late) {
    // After the collective's own write (or its failure); at once if it came meanwhile.
    h.landed->addCallback([weak = weak_from_this(), outputs = std::move(h.outputs)](c10::ivalue::Future&) {
      for (const auto& t : outputs) fillPoison(t);
      if (auto self = weak.lock()) {
        std::lock_guard<std::mutex> lock(self->mu_);
        --self->fillsPending_;
        self->cv_.notify_all();
      }
    });
  }
}

bool StreamGate::hold(uint64_t seq, const std::vector<at::Tensor>& outputs,
                      c10::intrusive_ptr<c10::ivalue::Future> landed) {
  const at::Tensor* first = nullptr;
  for (const auto& t : outputs) {
    if (t.defined()) {
      first = &t;
      break;
    }
  }
  if (first == nullptr) return false;
  if (GateWord::decide(word(), seq) == GateVerdict::Pass) {
    passed_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (first->is_cuda()) return cuda_ && holdCuda(seq, outputs);
  if (!first->is_cpu()) return false;
  std::vector<HostHold> late;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Under mu_: a release or poison after this sees it (they publish, then lock).
    host_.push_back(HostHold{seq, outputs, std::move(landed)});
    hostHolds_.fetch_add(1, std::memory_order_relaxed);
    late = settleHost();
  }
  fillAfter(std::move(late));
  return true;
}

bool StreamGate::holdCuda(uint64_t seq, const std::vector<at::Tensor>& outputs) {
  CudaGate& cuda = CudaGate::instance();
  if (!cuda.available()) {
    static std::once_flag once;
    std::call_once(once, [&cuda] {
      logMessage(LogLevel::Warning, "guard: the stream gate is off on CUDA in this process (" + cuda.unavailableWhy() +
                                        "): check=verify does not hold results on NCCL streams, as check=async");
    });
    return false;
  }
  const c10::Device device = outputs.front().device();
  if (word_.load(std::memory_order_acquire) == &heapWord_) {
    std::lock_guard<std::mutex> lock(mu_);
    if (word_.load(std::memory_order_acquire) == &heapWord_) {
      std::atomic<uint64_t>* pinned = cuda.allocateWord(device.index());
      pinned->store(heapWord_.load(std::memory_order_acquire), std::memory_order_release);
      word_.store(pinned, std::memory_order_seq_cst);
      GateWord::publish(*pinned, heapWord_.load(std::memory_order_seq_cst));  // a publish that raced the move
    }
  }
  std::vector<GateRegion> regions;
  regions.reserve(outputs.size());
  for (const auto& t : outputs) {
    GateRegion r;
    if (t.defined() && t.device() == device && regionOf(t, &r)) regions.push_back(r);
  }
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  const c10::Stream stream = impl.getStream(device);
  cuda.hold(device.index(), stream.native_handle(), word_.load(std::memory_order_acquire), seq, regions);
  deviceHolds_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool StreamGate::awaitHostPoison(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout,
                      [this] { return GateWord::isPoison(word()) && host_.empty() && fillsPending_ == 0; });
}

StreamGate::Stats StreamGate::stats() const {
  Stats s;
  s.deviceHolds = deviceHolds_.load(std::memory_order_relaxed);
  s.hostHolds = hostHolds_.load(std::memory_order_relaxed);
  s.passed = passed_.load(std::memory_order_relaxed);
  s.poisoned = poisoned_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace torch_ext::device
