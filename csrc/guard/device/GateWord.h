#pragma once

// GateWord: the 64-bit word a held stream waits on (the stream gate of
// check="verify" on stream-ordered backends; docs/architecture.md, "The device
// path"). Pure: the encoding, the rule a waiting stream applies, and the fill
// a poisoned result gets. The CUDA kernel (GateKernel.h) applies the same rule
// to the same bits, and the host gate (StreamGate.h) calls decide() itself.
//
// The word holds either the last verified seq of its group (a wait for #seq
// passes once the word is >= seq) or, with the top bit set, the first seq that
// will never be verified (a difference, or the group failed): waits for an
// earlier seq pass, waits for that one and later ones pass poisoned. It only
// moves forward: a release never lowers it, and nothing replaces a poison.

#include <c10/core/ScalarType.h>

#include <atomic>
#include <cstdint>

namespace torch_ext::device {

enum class GateVerdict : uint8_t { Wait, Pass, Poison };

struct GateWord {
  static constexpr uint64_t kPoisonBit = uint64_t{1} << 63;

  static constexpr uint64_t released(uint64_t verifiedSeq) {
    return verifiedSeq & ~kPoisonBit;
  }
  static constexpr uint64_t poisoned(uint64_t firstBad) {
    return kPoisonBit | firstBad;
  }
  static constexpr bool isPoison(uint64_t word) {
    return (word & kPoisonBit) != 0;
  }
  // What a wait for collective #seq does when it reads `word`.
  static constexpr GateVerdict decide(uint64_t word, uint64_t seq) {
    if (isPoison(word)) return seq >= (word & ~kPoisonBit) ? GateVerdict::Poison : GateVerdict::Pass;
    return word >= seq ? GateVerdict::Pass : GateVerdict::Wait;
  }
  // Writes `next` into `word` unless that would move it backwards (a smaller
  // release, or anything over a poison; a second poison keeps the first).
  // Returns whether the word changed. Any thread; lock-free.
  static bool publish(std::atomic<uint64_t>& word, uint64_t next);
};

// How a poisoned result is overwritten, element by element: floating types
// (and complex parts) with a quiet NaN, signed integers with their minimum,
// bool with true, other types with all bits set. `width` is 1, 2, 4 or 8
// bytes; `bits` holds the element's pattern in its low `width` bytes.
struct PoisonFill {
  uint32_t width = 0;
  uint64_t bits = 0;
};
PoisonFill poisonFill(c10::ScalarType dtype);

}  // namespace torch_ext::device
