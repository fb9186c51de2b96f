#pragma once

// WaitRecord: a rank's collective waits as it publishes them in its status
// record (after the StatusRecord fields), and as the straggler analyst reads
// them: closed windows of consecutive sequence numbers, at several levels.
// The accumulation is WaitWindows (collective/); this is the format.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace torch_ext {

// The levels' window sizes, in collectives: each level's windows are aligned
// to their size and made of the previous level's.
inline constexpr std::array<uint64_t, 4> kWaitWindowSizes{4, 32, 256, 2048};

// One closed window of one level.
struct WaitWindow {
  uint8_t level = 0;     // index into kWaitWindowSizes
  uint64_t index = 0;    // covers seqs index*size + 1 .. (index+1)*size
  int64_t waitNs = 0;    // time with one of its collectives pending (overlaps counted once)
  int64_t spanNs = 0;    // previous window's last completion (or this one's first issue) to its last completion
  uint32_t site = 0;     // this process's call site id where it waited most (0: unknown)
  uint64_t siteKey = 0;  // the same, as CallSites::stableKey (what other ranks read)
  int64_t siteWaitNs = 0;
  uint32_t siteCount = 0;  // its collectives in this window

  uint64_t size() const;
  uint64_t firstSeq() const {
    return index * size() + 1;
  }
  uint64_t lastSeq() const {
    return (index + 1) * size();
  }
};

// What a rank publishes of its waits (after its status record's fields).
struct RankWaits {
  std::string host;
  std::vector<WaitWindow> windows;
  // "<host> <level>:<index>:<wait us>:<span us>:<site key hex>:<site wait us>:<site count> ..."
  std::string encode() const;
  static std::optional<RankWaits> decode(const std::string& text);
  const WaitWindow* find(uint8_t level, uint64_t index) const;
};

}  // namespace torch_ext
