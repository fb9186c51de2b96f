#pragma once

// BurstPacing: when the verifier (check="verify") starts its rounds, learned
// from the times collectives are issued. Pure: every call is given the time,
// so the rule is tested with a made-up clock (tests/cpp/test_verifier.cpp).
//
// Issuing comes in bursts separated by quiet gaps (DDP's gradient buckets of
// one step, then a forward pass of silence). A gap counts as quiet when it is
// at least half the longest of the last 64 gaps, within [0.5, 20] ms (1 ms
// until 8 gaps are known). Three bursts of one length in a row make a
// prediction: the round then starts with the burst's predicted last
// collective, one round per burst. A burst inside which a result is asked for
// (FSDP2 waits for each layer's all_gather) never counts toward a prediction,
// and a demand ends one: such programs get a round at each issue. A predicted
// burst that goes quiet before its end was mispredicted: the round starts
// then, and the bursts are learned anew.

#include <array>
#include <cstdint>

namespace torch_ext {

class BurstPacing {
 public:
  // What to do about a collective just issued.
  enum class OnIssue : uint8_t {
    StartRound,    // not predicting: a round at each issue
    EndOfBurst,    // predicting, and this is the burst's predicted last collective
    WaitForBurst,  // predicting, inside the burst: its end (or a quiet gap) starts the round
  };

  // A collective was issued at `nowNs` (a steady clock, nanoseconds).
  OnIssue issued(int64_t nowNs);
  // A result was asked for (wait(), is_completed()) before it was verified.
  void demanded();
  // Whether bursts are predicted now.
  bool predicting() const {
    return repeats_ >= 3 && burstLen_ >= 2;  // bursts of one collective: a round at each issue anyway
  }
  // Predicting: when the current burst counts as gone quiet (the last issue
  // plus the quiet gap).
  int64_t quietAtNs() const {
    return lastIssueNs_ + quietGapUs() * 1000;
  }
  // Predicting, the burst went quiet before its predicted end: learn anew.
  void mispredicted();

  int64_t quietGapUs() const;
  // The predicted burst length (0 when not predicting).
  uint64_t burst() const {
    return predicting() ? burstLen_ : 0;
  }
  uint64_t mispredictions() const {
    return mispredictions_;
  }

 private:
  void endBurst();

  int64_t lastIssueNs_ = -1;         // -1: nothing issued yet
  std::array<uint32_t, 64> gaps_{};  // the last gaps between issues, in us
  uint64_t gapCount_ = 0;
  uint64_t burstCount_ = 0;      // collectives issued in the current burst
  uint64_t burstLen_ = 0;        // the length of the last bursts, while it repeats
  uint32_t repeats_ = 0;         // bursts in a row of length burstLen_
  uint64_t mispredictions_ = 0;  // bursts that went quiet before their predicted end
  uint64_t demands_ = 0;         // results asked for in the current burst
};

}  // namespace torch_ext
