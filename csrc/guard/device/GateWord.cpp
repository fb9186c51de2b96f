#include "guard/device/GateWord.h"

namespace torch_ext::device {

bool GateWord::publish(std::atomic<uint64_t>& word, uint64_t next) {
  uint64_t cur = word.load(std::memory_order_acquire);
  for (;;) {
    if (isPoison(cur)) return false;                   // a poison is final
    if (!isPoison(next) && next <= cur) return false;  // releases only move forward
    if (word.compare_exchange_weak(cur, next, std::memory_order_acq_rel, std::memory_order_acquire)) return true;
  }
}

PoisonFill poisonFill(c10::ScalarType dtype) {
  using S = c10::ScalarType;
  switch (dtype) {
    case S::Float:
    case S::ComplexFloat:
      return {4, 0x7fc00000u};
    case S::Double:
    case S::ComplexDouble:
      return {8, 0x7ff8000000000000ull};
    case S::Half:
    case S::ComplexHalf:
      return {2, 0x7e00u};
    case S::BFloat16:
      return {2, 0x7fc0u};
    case S::Float8_e4m3fn:
    case S::Float8_e5m2:
      return {1, 0x7fu};
    case S::Float8_e4m3fnuz:
    case S::Float8_e5m2fnuz:
      return {1, 0x80u};  // their only NaN
    case S::Char:
      return {1, 0x80u};
    case S::Short:
      return {2, 0x8000u};
    case S::Int:
      return {4, 0x80000000u};
    case S::Long:
      return {8, 0x8000000000000000ull};
    case S::Bool:
      return {1, 0x01u};
    default: {
      const auto size = static_cast<uint32_t>(c10::elementSize(dtype));
      const uint32_t width = size == 1 || size == 2 || size == 4 || size == 8 ? size : 1;
      return {width, ~uint64_t{0}};
    }
  }
}

}  // namespace torch_ext::device
