#include "guard/report/DifferenceWords.h"

#include <cstdint>

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

std::string encodeWith(const DifferenceWords& w, size_t skipRuns) {
  std::string out =
      plain(w.text) + kField + plain(w.where) + kField + plain(w.hint) + kField + (w.metricSync ? "1" : "0") + kField;
  for (const auto& m : w.metrics) out += plain(m) + kName;
  out += kField;
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

std::string DifferenceWords::encode(size_t maxBytes) const {
  for (size_t skip = 0;; ++skip) {
    std::string out = encodeWith(*this, skip);
    if (out.size() <= maxBytes || skip >= history.size()) return out.substr(0, maxBytes);
  }
}

DifferenceWords DifferenceWords::decode(const std::string& bytes) {
  DifferenceWords w;
  auto f = split(bytes, kField, 6);
  f.resize(6);
  w.text = f[0];
  w.where = f[1];
  w.hint = f[2];
  w.metricSync = f[3] == "1";
  for (const auto& m : split(f[4], kName, SIZE_MAX)) {
    if (!m.empty()) w.metrics.push_back(m);
  }
  w.history = decodeHistory(f[5]);
  return w;
}

}  // namespace torch_ext
