#include "guard/report/Label.h"

namespace torch_ext {

std::string Label::describe() const {
  if (text.empty()) return std::string();
  std::string out = text;
  if (!origin.empty()) out += " (asked for at " + describeCallSite(origin) + ")";
  return out;
}

std::string labelSuffix(const Label& label) {
  return label.empty() ? std::string() : " for " + label.describe();
}

} // namespace torch_ext
