#pragma once

// The deterministic random numbers behind bucket batch planning.
//
// Every rank must compute the same plan from (seed, epoch) without talking to
// the others, in any process, on any machine, with any torch version. So the
// generator is ours, not torch's (whose global state differs per rank and whose
// algorithms may change), and it is small enough to be re-implemented exactly in
// Python (benchmarks/sampler.py holds that reference; tests compare the two):
//
//   mix64          the splitmix64 finaliser (Steele, Lea, Flood 2014)
//   streamKey      seeds an independent stream per (seed, epoch, stream id);
//                  stream 0 orders the batches, stream 1 + b shuffles bucket b,
//                  so buckets can be shuffled in parallel in any order
//   SplitMix64     the generator: a counter stepped by the golden gamma, mixed
//   bounded(n)     uniform in [0, n) without modulo bias (Lemire 2019)
//   shuffle        Fisher-Yates from the last element down

#include <cstdint>
#include <utility>

namespace torch_ext::sampling {

constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ULL;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Seeds and epochs arrive as int64 (Python ints); negative values are taken
// modulo 2^64, like the Python reference does with `& (2**64 - 1)`.
inline uint64_t streamKey(uint64_t seed, uint64_t epoch, uint64_t stream) {
  uint64_t key = mix64(seed + kGoldenGamma);
  key = mix64(key ^ mix64(epoch + 2 * kGoldenGamma));
  return mix64(key ^ mix64(stream + 3 * kGoldenGamma));
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t key) : state_(key) {}

  uint64_t next() {
    state_ += kGoldenGamma;
    return mix64(state_);
  }

  // Uniform in [0, n), n >= 1. The multiply-shift maps 64 random bits onto
  // [0, n); the rare draws that would over-represent low values are rejected.
  uint64_t bounded(uint64_t n) {
    uint64_t x = next();
    __uint128_t m = static_cast<__uint128_t>(x) * n;
    auto low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = (0 - n) % n;
      while (low < threshold) {
        x = next();
        m = static_cast<__uint128_t>(x) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  uint64_t state_;
};

// Fisher-Yates: for i = n-1 .. 1, swap a[i] with a[bounded(i + 1)].
template <typename T>
void shuffle(T* data, int64_t n, SplitMix64& rng) {
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.bounded(static_cast<uint64_t>(i) + 1));
    std::swap(data[i], data[j]);
  }
}

}  // namespace torch_ext::sampling
