#include "guard/report/OpWords.h"

#include <cstdint>
#include <cstdlib>

namespace torch_ext {

namespace {

constexpr char kField = '\x1f';
constexpr char kName = '\x1e';

std::string plain(std::string s) {
  for (char& c : s) {
    if (c == kField || c == kName || c == '\0') c = ' ';
  }
  return s;
}

std::string encodeWith(const OpWords& w, size_t skipRuns) {
  // The hash first: a cut (a long text) never loses it.
  std::string out = std::to_string(w.hash) + kField + plain(w.text) + kField + plain(w.where) + kName +
                    plain(w.caller) + kField + plain(w.hint) + kField + (w.metricSync ? "1" : "0") + kField;
  for (const auto& m : w.metrics) out += plain(m) + kName;
  out += kField;
  // The op's facts, before the history (which the encoder shortens first).
  const OpFacts& f = w.facts;
  std::string sizes;
  for (auto d : f.sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(d);
  out += plain(f.op) + kName + plain(f.dtype) + kName + sizes + kName + std::to_string(f.tensors) + kName +
         plain(f.reduceOp) + kField;
  const std::vector<HistoryRun> runs(w.history.begin() + static_cast<std::ptrdiff_t>(skipRuns), w.history.end());
  out += plain(encodeHistory(runs));
  return out;
}

std::vector<std::string> split(const std::string& s, char sep, size_t maxParts) {
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    const auto i = s.find(sep, at);
    if (parts.size() + 1 == maxParts || i == std::string::npos) {
      parts.push_back(s.substr(at));
      return parts;
    }
    parts.push_back(s.substr(at, i - at));
    at = i + 1;
  }
}

}  // namespace

std::string OpWords::encode(size_t maxBytes) const {
  for (size_t skip = 0;; ++skip) {
    std::string out = encodeWith(*this, skip);
    if (out.size() <= maxBytes || skip >= history.size()) return out.substr(0, maxBytes);
  }
}

OpWords OpWords::decode(const std::string& bytes) {
  OpWords w;
  auto all = split(bytes, kField, 8);
  all.resize(8);
  w.hash = std::strtoull(all[0].c_str(), nullptr, 10);
  const std::vector<std::string> f(all.begin() + 1, all.end());
  w.text = f[0];
  auto where = split(f[1], kName, 2);
  where.resize(2);
  w.where = where[0];
  w.caller = where[1];
  w.hint = f[2];
  w.metricSync = f[3] == "1";
  for (const auto& m : split(f[4], kName, SIZE_MAX)) {
    if (!m.empty()) w.metrics.push_back(m);
  }
  auto facts = split(f[5], kName, 5);
  facts.resize(5);
  if (!facts[0].empty()) {
    w.facts.text = w.text;
    w.facts.op = facts[0];
    w.facts.dtype = facts[1];
    for (const auto& d : split(facts[2], ',', SIZE_MAX)) {
      if (!d.empty()) w.facts.sizes.push_back(std::strtoll(d.c_str(), nullptr, 10));
    }
    w.facts.tensors = std::strtoll(facts[3].c_str(), nullptr, 10);
    w.facts.reduceOp = facts[4];
  }
  w.history = decodeHistory(f[6]);
  return w;
}

RankOp OpWords::rankOp(int64_t globalRank) const {
  RankOp op;
  op.globalRank = globalRank;
  op.text = text;
  op.where = where;
  op.caller = caller;
  op.hint = hint;
  op.hash = hash;
  op.facts = facts;
  return op;
}

}  // namespace torch_ext
