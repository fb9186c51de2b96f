#pragma once

// StoreHealth: whether the cross-rank store answers, as a rank's store
// channel sees it (store/StoreChannel) and as its dump records it (Snapshot).

#include "guard/report/EnumNames.h"

#include <cstdint>

namespace torch_ext {

enum class StoreHealth : uint8_t {
  Healthy,       // calls are answered
  NotAnswering,  // a call went unanswered past its bound (a frozen or overloaded host)
  Lost,          // the connection failed (the store's process exited or was killed)
};
template <>
struct EnumTable<StoreHealth> {
  static constexpr NamedValue<StoreHealth> kEntries[] = {
      {StoreHealth::Healthy, "healthy"},
      {StoreHealth::NotAnswering, "not answering"},
      {StoreHealth::Lost, "lost"},
  };
};
}  // namespace torch_ext
