#include "guard/report/RankList.h"

#include <sstream>

namespace torch_ext {

std::string formatRanks(const std::vector<int64_t>& ranks) {
  std::ostringstream os;
  os << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    os << (i ? "," : "");
    if (j - i >= 2) {
      os << ranks[i] << "-" << ranks[j];
    } else {
      for (size_t k = i; k <= j; ++k) os << (k > i ? "," : "") << ranks[k];
    }
    i = j + 1;
  }
  return os.str();
}

}  // namespace torch_ext
