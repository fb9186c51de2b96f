#include "guard/collective/LabelTable.h"

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

} // namespace

uint32_t LabelTable::intern(const Label& label) {
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
  std::lock_guard<std::mutex> lock(mu_);
  auto it = byKey_.find(key);
  if (it != byKey_.end()) return it->second;
  if (labels_.size() >= kMaxLabels) return 0;
  const auto id = static_cast<uint32_t>(labels_.size());
  labels_.push_back(label);
  byKey_.emplace(std::move(key), id);
  return id;
}

Label LabelTable::get(uint32_t id) const {
  if (id == 0) return Label{};
  std::lock_guard<std::mutex> lock(mu_);
  if (id >= labels_.size()) return Label{};
  return labels_[id];
}

} // namespace torch_ext
