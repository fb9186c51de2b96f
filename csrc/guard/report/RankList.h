#pragma once

// RankList: how reports write a set of ranks. A leaf of report/ (Report,
// WaitGraph, History and LocalReport all name ranks; none of them includes
// another for it).

#include <cstdint>
#include <string>
#include <vector>

namespace torch_ext {

// "ranks 0,1,3" / "rank 2", with runs of three or more folded: "ranks 0-30".
std::string formatRanks(const std::vector<int64_t>& ranks);

}  // namespace torch_ext
