#include "guard/collective/LabelTable.h"

#include "guard/collective/Fingerprint.h"

namespace torch_ext {

LabelTable& LabelTable::instance() {
  // Leaked on purpose, as CallSites: threads may still read labels while static
  // destructors run at exit.
  static auto* table = new LabelTable();
  return *table;
}

namespace {

void appendField(std::string& key, const std::string& s) {
  key += std::to_string(s.size());
  key += ':';
  key += s;
}

// FNV-1a over the metric's (or module's) name, finished by mix64; never 0 for one.
uint64_t metricIdentity(const Label& label) {
  const std::string* key = label.identityField();
  if (key == nullptr) return 0;
  uint64_t h = key == label.metric() ? 0xcbf29ce484222325ULL : 0x84222325cbf29ce4ULL;  // a module is no metric
  for (unsigned char ch : *key) h = (h ^ ch) * 0x100000001b3ULL;
  const uint64_t id = detail::mix64(h);
  return id ? id : 1;
}

}  // namespace

uint32_t LabelTable::intern(const Label& label, const std::vector<OriginRef>& lazyOrigin) {
  if (label.empty()) return 0;
  // Length-prefixed parts: no text can be confused with another split.
  std::string key;
  appendField(key, label.text);
  appendField(key, label.hint);
  for (const auto& [k, v] : label.fields) {
    appendField(key, k);
    appendField(key, v);
  }
  key += '|';
  for (const auto& f : label.origin) {
    appendField(key, f.filename);
    appendField(key, std::to_string(f.line));
    appendField(key, f.function);
    appendField(key, f.library);
  }
  key += '|';
  for (const auto& r : lazyOrigin) {
    appendField(key, std::to_string(reinterpret_cast<uintptr_t>(r.code)));
    appendField(key, std::to_string(r.line));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = byKey_.find(key);
  if (it != byKey_.end()) return it->second;
  if (labels_.size() >= kMaxLabels) return 0;
  const auto id = static_cast<uint32_t>(labels_.size());
  labels_.push_back(Stored{label, lazyOrigin, metricIdentity(label)});
  byKey_.emplace(std::move(key), id);
  return id;
}

void LabelTable::resolve(uint32_t id) const {
  std::vector<OriginRef> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending = labels_[id].pending;
  }
  if (pending.empty()) return;
  const Resolver resolver = resolver_.load(std::memory_order_acquire);
  if (resolver == nullptr) return;  // read as "(code object)" until one is installed
  std::vector<Frame> frames;
  for (const auto& r : pending) {
    Frame f;
    if (!resolver(r, &f)) f = Frame{"(code object)", r.line, "", ""};
    frames.push_back(std::move(f));
  }
  std::lock_guard<std::mutex> lock(mu_);
  Stored& s = labels_[id];
  if (s.pending.empty()) return;  // another reader resolved it meanwhile
  for (auto& f : frames) s.label.origin.push_back(std::move(f));
  s.pending.clear();
}

std::optional<std::string> LabelTable::metricOf(uint32_t id) const {
  if (id == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);  // the fields only: no origin to resolve
  if (id >= labels_.size()) return std::nullopt;
  const std::string* metric = labels_[id].label.metric();
  return metric ? std::optional<std::string>(*metric) : std::nullopt;
}

Label LabelTable::get(uint32_t id) const {
  if (id == 0) return Label{};
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (id >= labels_.size()) return Label{};
    if (labels_[id].pending.empty()) return labels_[id].label;
  }
  resolve(id);
  std::lock_guard<std::mutex> lock(mu_);
  Label out = labels_[id].label;
  for (const auto& r : labels_[id].pending) out.origin.push_back(Frame{"(code object)", r.line, "", ""});
  return out;
}

void LabelTable::resolveAll() {
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = labels_.size();
  }
  for (size_t id = 1; id < n; ++id) resolve(static_cast<uint32_t>(id));
}

size_t LabelTable::unresolved() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& s : labels_) n += s.pending.empty() ? 0 : 1;
  return n;
}

uint32_t LabelTable::setCurrent(uint32_t id) {
  const uint32_t prev = detail::t_currentLabel;
  detail::t_currentLabel = id;
  detail::t_currentIdentity = id ? instance().identityOf(id) : 0;
  return prev;
}

uint64_t LabelTable::identityOf(uint32_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return id < labels_.size() ? labels_[id].identity : 0;
}

}  // namespace torch_ext
