#pragma once

// Fingerprint: what one rank says a collective is, in a form that is equal on
// every rank of the group when (and only when) the ranks agree.
//
// Only rank-invariant arguments enter the hash: the input of all_gather (outputs
// exist only as a list on some ranks), the output of reduce_scatter and scatter,
// the trailing shape of all_to_all_single (dim 0 may differ legitimately), and so
// on. All-to-all splits do differ per rank; their agreement is checked through two
// additive "pairing" sums (see splitSend/splitRecv) whose totals over the group
// are equal exactly when every rank receives what its peers send.
//
// Building one costs a handful of multiplications per tensor and no allocation for
// up to kInlineMetas tensors (sizes kept inline, Dims): it runs on every collective.

#include "guard/report/Op.h"
#include "guard/report/OpFacts.h"

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

namespace torch_ext {

c10d::OpType toOpType(Op op);

const char* reduceOpName(int reduceOp);    // c10d::ReduceOp::RedOpType, -1: ""
std::string dtypeName(c10::ScalarType t);  // "float32"

// A tensor's sizes, kept inline: a fingerprint then moves into its ledger slot
// as plain bytes, on every collective (issue 70). The hash covers every
// dimension; past kMax the kept copy holds the first kMax and rank() counts all.
class Dims {
 public:
  static constexpr size_t kMax = 8;
  Dims() = default;
  Dims(std::initializer_list<int64_t> dims) {
    assign(dims.begin(), dims.end());
  }
  template <typename It>
  void assign(It first, It last) {
    kept_ = 0;
    rank_ = 0;
    for (; first != last; ++first, ++rank_) {
      if (kept_ < kMax) d_[kept_++] = *first;
    }
  }
  const int64_t* begin() const {
    return d_.data();
  }
  const int64_t* end() const {
    return d_.data() + kept_;
  }
  size_t size() const {  // kept
    return kept_;
  }
  bool empty() const {
    return kept_ == 0;
  }
  int64_t operator[](size_t i) const {
    return d_[i];
  }
  size_t rank() const {  // the tensor's dimensions, kept or not
    return rank_;
  }

 private:
  std::array<int64_t, kMax> d_{};
  uint8_t kept_ = 0;
  uint8_t rank_ = 0;
};

struct TensorMeta {
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  Dims sizes;
  int64_t numel = 0;             // of every dimension
  std::string describe() const;  // "float32[4, 8]"
};
static_assert(std::is_trivially_copyable_v<TensorMeta>, "a fingerprint moves into the ledger as bytes");

namespace detail {
inline uint64_t mix64(uint64_t x) {
  // splitmix64 finaliser: a bijection with good avalanche, cheap enough per field.
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}
inline uint64_t combine(uint64_t h, uint64_t v) {
  return mix64(h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2)));
}
// Key of one (sender, receiver, amount) edge for the all-to-all pairing sums.
inline uint64_t edgeKey(int64_t from, int64_t to, int64_t amount) {
  return mix64(combine(combine(mix64(static_cast<uint64_t>(from) + 1), static_cast<uint64_t>(to)),
                       static_cast<uint64_t>(amount)));
}
}  // namespace detail

struct Fingerprint {
  static constexpr size_t kInlineMetas = 4;

  Op op = Op::Barrier;
  int8_t reduceOp = -1;  // -1: none
  int32_t root = -1;     // group rank of root/src/dst, or the peer of a p2p op; -1: none/any
  int32_t tag = 0;       // p2p tag
  uint32_t numTensors = 0;
  c10::DeviceType device = c10::DeviceType::CPU;
  // The first kInlineMetas rank-invariant tensors; numTensors counts them all.
  c10::SmallVector<TensorMeta, kInlineMetas> metas;
  // All-to-all: elements sent to / received from each peer (first 16 peers kept).
  c10::SmallVector<int64_t, 4> sendSplits, recvSplits;
  bool splitsTruncated = false;
  uint64_t hash = 0;
  // All-to-all pairing sums (0 for other ops): sum over peers j of
  // edgeKey(me, j, sent to j) and edgeKey(j, me, received from j). Summed over
  // the group the two are equal exactly when every send matches its receive.
  uint64_t splitSend = 0;
  uint64_t splitRecv = 0;

  // "all_reduce(float32[10], SUM)", "broadcast(float32[10], src=0)".
  std::string describe() const;
  // describe()'s text and what it says, as values (report/OpFacts.h).
  OpFacts facts() const;
  // Hash used to pair a send with a receive: dtype, element count and tag.
  uint64_t p2pPairHash() const;
  int64_t numel() const;  // of the first tensor, 0 if none
  // Whether group rank `me` can finish this operation before every rank it
  // waits for has issued it: a send (the transport may buffer it), the root
  // of a broadcast or scatter, a non-root of a reduce or gather (they only
  // send), unless `gated` (check="verify"/"strict" hold every collective's
  // result until each rank is known to have issued it).
  bool mayFinishAlone(int me, bool gated) const;
};

// Incremental construction; finish() computes the hash.
class FingerprintBuilder {
 public:
  explicit FingerprintBuilder(Op op);
  FingerprintBuilder& tensor(const at::Tensor& t);
  FingerprintBuilder& tensors(const std::vector<at::Tensor>& ts);
  // A tensor given by metadata only (sparse tensors, per-peer lists).
  FingerprintBuilder& meta(c10::ScalarType dtype, c10::IntArrayRef sizes, c10::DeviceType device);
  // Hash dtype and sizes[1:] only (all_to_all_single: dim 0 may differ per rank).
  FingerprintBuilder& rowShape(const at::Tensor& t);
  FingerprintBuilder& reduceOp(const c10d::ReduceOp& op);
  FingerprintBuilder& root(int64_t rank);
  FingerprintBuilder& peer(int64_t rank, int64_t tag);
  // Element counts sent to / received from each peer; `me` is this group rank.
  FingerprintBuilder& splits(int64_t me, const std::vector<int64_t>& send, const std::vector<int64_t>& recv);
  Fingerprint finish();

 private:
  void addMeta(c10::ScalarType dtype, c10::IntArrayRef sizes, c10::DeviceType device, bool skipDim0);
  Fingerprint fp_;
  uint64_t h_;
};

}  // namespace torch_ext
