#include "guard/collective/CallSite.h"

namespace torch_ext {

CallSites& CallSites::instance() {
  // Leaked on purpose: threads of the inner backends may still record call
  // sites while static destructors run at exit.
  static auto* sites = new CallSites();
  return *sites;
}

uint32_t CallSites::intern(const std::vector<Frame>& frames) {
  if (frames.empty()) return 0;
  std::string key;
  for (const auto& f : frames) {
    key += f.filename;
    key += '\x1f';
    key += std::to_string(f.line);
    key += '\x1f';
    key += f.function;
    key += '\x1f';
    key += f.library;
    key += '\x1e';
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = byKey_.find(key);
  if (it != byKey_.end()) return it->second;
  if (sites_.size() >= kMaxSites) return 0;
  auto id = static_cast<uint32_t>(sites_.size());
  sites_.push_back(frames);
  uint64_t stable = 1469598103934665603ull;  // FNV-1a: the same on every rank
  for (unsigned char c : key) stable = (stable ^ c) * 1099511628211ull;
  if (stable == 0) stable = 1;
  stableKeys_.push_back(stable);
  uint64_t path = 1469598103934665603ull;
  for (const auto& f : frames) {
    if (!f.isUser()) continue;  // a library's lines may differ by its version, not by the program
    const std::string part = f.filename.substr(f.filename.find_last_of('/') + 1) + '\x1f' + std::to_string(f.line) +
                             '\x1f' + f.function + '\x1e';
    for (unsigned char c : part) path = (path ^ c) * 1099511628211ull;
  }
  pathKeys_.push_back(path == 0 ? 1 : path);
  byStableKey_.emplace(stable, id);
  byKey_.emplace(std::move(key), id);
  return id;
}

std::vector<Frame> CallSites::frames(uint32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (id >= sites_.size()) return {};
  return sites_[id];
}

uint64_t CallSites::stableKey(uint32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return id < stableKeys_.size() ? stableKeys_[id] : 0;
}

uint64_t CallSites::pathKey(uint32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return id < pathKeys_.size() ? pathKeys_[id] : 0;
}

uint32_t CallSites::byStableKey(uint64_t key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = byStableKey_.find(key);
  return it == byStableKey_.end() ? 0 : it->second;
}

std::string CallSites::describe(uint32_t id) const {
  return describeCallSite(frames(id));
}

std::string CallSites::describePath(uint32_t id) const {
  return describeCallPath(frames(id));
}

}  // namespace torch_ext
