#include "guard/report/Label.h"

namespace torch_ext {

std::string Label::describe(const std::vector<Frame>& site) const {
  if (text.empty()) return std::string();
  std::string out = text;
  const bool sameLine =
      !origin.empty() && !site.empty() && origin[0].filename == site[0].filename && origin[0].line == site[0].line;
  if (!origin.empty() && !sameLine) out += " (asked for at " + describeCallSite(origin) + ")";
  return out;
}

std::string labelSuffix(const Label& label, const std::vector<Frame>& site) {
  return label.empty() ? std::string() : " for " + label.describe(site);
}

}  // namespace torch_ext
