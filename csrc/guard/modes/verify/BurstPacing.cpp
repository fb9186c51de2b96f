#include "guard/modes/verify/BurstPacing.h"

#include <algorithm>

namespace torch_ext {

BurstPacing::OnIssue BurstPacing::issued(int64_t nowNs) {
  if (lastIssueNs_ >= 0) {
    const int64_t gapUs = std::max<int64_t>(0, (nowNs - lastIssueNs_) / 1000);
    // Learning, bursts end at quiet gaps; predicting, at their length (a
    // burst cut short goes quiet first: mispredicted()).
    if (!predicting() && gapUs >= quietGapUs()) endBurst();
    gaps_[gapCount_++ % gaps_.size()] = static_cast<uint32_t>(std::min<int64_t>(gapUs, UINT32_MAX));
  }
  lastIssueNs_ = nowNs;
  ++burstCount_;
  if (!predicting()) return OnIssue::StartRound;
  if (burstCount_ == burstLen_) {
    burstCount_ = 0;
    demands_ = 0;
    return OnIssue::EndOfBurst;
  }
  return OnIssue::WaitForBurst;
}

void BurstPacing::demanded() {
  ++demands_;
  if (predicting()) {
    burstLen_ = 0;
    repeats_ = 0;
  }
}

void BurstPacing::mispredicted() {
  burstCount_ = 0;
  burstLen_ = 0;
  repeats_ = 0;
  demands_ = 0;
  ++mispredictions_;
}

int64_t BurstPacing::quietGapUs() const {
  // Half the longest of the last gaps between issues, within [0.5, 20] ms.
  // Bursts are told apart by their biggest gaps: DDP's steps come a forward
  // pass apart (25-40 ms for the 24-layer benchmark on 2 cores), its buckets
  // about 0.5 ms apart but, on a loaded machine, now and then 5-7 ms: a
  // multiple of the median gap would cut bursts at those.
  const size_t n = static_cast<size_t>(std::min<uint64_t>(gapCount_, gaps_.size()));
  if (n < 8) return 1000;
  const uint64_t longest = *std::max_element(gaps_.begin(), gaps_.begin() + n);
  return static_cast<int64_t>(std::clamp<uint64_t>(longest / 2, 500, 20000));
}

void BurstPacing::endBurst() {
  if (burstCount_ == 0) return;
  if (demands_ > 0) {  // waited inside: does not count toward a prediction
    burstLen_ = 0;
    repeats_ = 0;
  } else if (burstCount_ == burstLen_) {
    ++repeats_;
  } else {
    burstLen_ = burstCount_;
    repeats_ = 1;
  }
  burstCount_ = 0;
  demands_ = 0;
}

}  // namespace torch_ext
