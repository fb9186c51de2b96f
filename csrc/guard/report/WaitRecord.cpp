#include "guard/report/WaitRecord.h"

#include <algorithm>
#include <sstream>

namespace torch_ext {

uint64_t WaitWindow::size() const {
  return kWaitWindowSizes[std::min<size_t>(level, kWaitWindowSizes.size() - 1)];
}

const WaitWindow* RankWaits::find(uint8_t level, uint64_t index) const {
  for (const auto& w : windows) {
    if (w.level == level && w.index == index) return &w;
  }
  return nullptr;
}

std::string RankWaits::encode() const {
  std::ostringstream os;
  os << (host.empty() ? "-" : host);
  for (const auto& w : windows) {
    os << ' ' << int(w.level) << ':' << w.index << ':' << w.waitNs / 1000 << ':' << w.spanNs / 1000 << ':' << std::hex
       << w.siteKey << std::dec << ':' << w.siteWaitNs / 1000 << ':' << w.siteCount;
  }
  return os.str();
}

std::optional<RankWaits> RankWaits::decode(const std::string& text) {
  std::istringstream is(text);
  RankWaits r;
  if (!(is >> r.host)) return std::nullopt;
  if (r.host == "-") r.host.clear();
  std::string item;
  while (is >> item) {
    WaitWindow w;
    int level = 0;
    int64_t waitUs = 0, spanUs = 0, siteWaitUs = 0;
    char c1, c2, c3, c4, c5, c6;
    std::istringstream f(item);
    f >> level >> c1 >> w.index >> c2 >> waitUs >> c3 >> spanUs >> c4 >> std::hex >> w.siteKey >> std::dec >> c5 >>
        siteWaitUs >> c6 >> w.siteCount;
    char extra;
    if (!f || f >> extra /* trailing garbage */ || c1 != ':' || c2 != ':' || c3 != ':' || c4 != ':' || c5 != ':' ||
        c6 != ':' || level < 0 || level >= static_cast<int>(kWaitWindowSizes.size())) {
      return std::nullopt;
    }
    w.level = static_cast<uint8_t>(level);
    w.waitNs = waitUs * 1000;
    w.spanNs = spanUs * 1000;
    w.siteWaitNs = siteWaitUs * 1000;
    r.windows.push_back(w);
  }
  return r;
}

}  // namespace torch_ext
