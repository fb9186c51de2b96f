#include "guard/collective/InnerFuture.h"

#include <array>
#include <atomic>
#include <exception>
#include <typeinfo>

namespace torch_ext {

namespace {

// The work types known to have no future. A handful exist (gloo's
// reduce_scatter, send and recv works, strict's deferred receive); past the
// slots, a type is asked every time, as before.
constexpr size_t kSlots = 16;
std::array<std::atomic<const std::type_info*>, kSlots> futureless{};

bool knownFutureless(const std::type_info& type) {
  for (auto& slot : futureless) {
    const std::type_info* t = slot.load(std::memory_order_acquire);
    if (t == nullptr) return false;
    if (*t == type) return true;
  }
  return false;
}

void rememberFutureless(const std::type_info& type) {
  for (auto& slot : futureless) {
    const std::type_info* expected = nullptr;
    if (slot.compare_exchange_strong(expected, &type, std::memory_order_acq_rel)) return;
    if (*expected == type) return;  // another thread remembered it first
  }
}

}  // namespace

c10::intrusive_ptr<c10::ivalue::Future> futureOf(c10d::Work& work) {
  const std::type_info& type = typeid(work);
  if (knownFutureless(type)) return {};
  try {
    return work.getFuture();
  } catch (const std::exception&) {
    if (dynamic_cast<const ForwardsFuture*>(&work) == nullptr) rememberFutureless(type);
    return {};
  }
}

}  // namespace torch_ext
