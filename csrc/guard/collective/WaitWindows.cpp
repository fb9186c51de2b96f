#include "guard/collective/WaitWindows.h"

#include <algorithm>
#include <limits>

namespace torch_ext {

void WaitWindows::add(uint64_t seq, int64_t startNs, int64_t endNs, uint32_t site) {
  if (seq == 0) return;
  // Time with a collective pending, counted once: overlapping collectives
  // (DDP's bucket all_reduces in flight together) share their time.
  const int64_t waitNs = std::max<int64_t>(0, endNs - std::max(startNs, coveredUntilNs_));
  coveredUntilNs_ = std::max(coveredUntilNs_, endNs);
  // Per collective only the finest level is touched; a closed window feeds
  // the next level (close()), so the coarser levels cost nothing here.
  Open* w = slotFor(levels_[0], (seq - 1) / kSizes[0]);
  if (w == nullptr) return;
  ++w->n;
  w->waitNs += waitNs;
  w->firstStartNs = std::min(w->firstStartNs, startNs);
  w->lastEndNs = std::max(w->lastEndNs, endNs);
  addSite(*w, site, waitNs, 1);
  if (w->n == kSizes[0]) close(0, *w);
}

WaitWindows::Open* WaitWindows::slotFor(Level& lv, uint64_t index) {
  Open& w = lv.open[index % 2];
  if (w.used && w.index != index) {
    if (w.index > index) return nullptr;  // a window already given up: too late
    w = Open{};                           // an older window that never filled (an op not timed)
  }
  if (!w.used) {
    w.used = true;
    w.index = index;
    w.firstStartNs = std::numeric_limits<int64_t>::max();
  }
  return &w;
}

void WaitWindows::addSite(Open& w, uint32_t site, int64_t waitNs, uint32_t count) {
  // The heaviest call sites (space-saving: a new site takes the lightest slot).
  auto* slot = &w.sites[0];
  for (auto& s : w.sites) {
    if (s.id == site) {
      slot = &s;
      break;
    }
    if (s.waitNs < slot->waitNs) slot = &s;
  }
  slot->id = site;
  slot->waitNs += waitNs;
  slot->count += count;
}

void WaitWindows::close(uint8_t level, Open& w) {
  Level& lv = levels_[level];
  WaitWindow c;
  c.level = level;
  c.index = w.index;
  c.waitNs = w.waitNs;
  const int64_t from = lv.hasLast && lv.lastIndex + 1 == w.index ? lv.lastEndNs : w.firstStartNs;
  c.spanNs = std::max<int64_t>(1, w.lastEndNs - from);
  // Completions a little out of order (gloo's two worker threads) can place
  // some pending time before the span's start: a share stays within 100%.
  c.waitNs = std::min(c.waitNs, c.spanNs);
  for (const auto& s : w.sites) {
    if (s.count > 0 && (c.siteCount == 0 || s.waitNs > c.siteWaitNs)) {
      c.site = s.id;
      c.siteWaitNs = s.waitNs;
      c.siteCount = s.count;
    }
  }
  lv.closed[lv.closedCount % kHistory] = c;
  ++lv.closedCount;
  lv.hasLast = true;
  lv.lastIndex = w.index;
  lv.lastEndNs = w.lastEndNs;
  // The next level's window is made of this level's consecutive windows.
  if (static_cast<size_t>(level) + 1 < kSizes.size()) {
    const uint8_t up = static_cast<uint8_t>(level + 1);
    if (Open* p = slotFor(levels_[up], w.index / (kSizes[up] / kSizes[level]))) {
      p->n += w.n;
      p->waitNs += w.waitNs;
      p->firstStartNs = std::min(p->firstStartNs, w.firstStartNs);
      p->lastEndNs = std::max(p->lastEndNs, w.lastEndNs);
      for (const auto& s : w.sites) {
        if (s.count > 0) addSite(*p, s.id, s.waitNs, s.count);
      }
      if (p->n == kSizes[up]) close(up, *p);
    }
  }
  w = Open{};
}

std::vector<WaitWindow> WaitWindows::closed(size_t perLevel) const {
  std::vector<WaitWindow> out;
  for (const Level& lv : levels_) {
    const size_t n = std::min({lv.closedCount, perLevel, kHistory});
    for (size_t i = lv.closedCount - n; i < lv.closedCount; ++i) out.push_back(lv.closed[i % kHistory]);
  }
  return out;
}

}  // namespace torch_ext
