#pragma once

// CountAgreement: what one nccl_sim stream operation's exchange expects of its
// peers, agreed on the transport before any of its data moves.
//
// NCCL moves the bytes each rank's kernel was given. When the ranks' counts
// differ (an all_gather of 6 elements against one of 4, a send of 4 floats
// into a recv of 6, another collective altogether), a rank waits for bytes
// that never come, or reads garbage: the job hangs, no process dies. gloo,
// which carries nccl_sim's data, std::terminates a rank that receives more
// bytes than it posted. So ahead of each operation the stream checks that the
// ranks' exchanges fit, with messages of a size every rank knows:
//  - collectives: one all_gather of 1 + 2W int64 per rank: a word that every
//    rank must share (which operation, its root, the bytes each rank puts in
//    and takes out), then the bytes this rank sends to and expects from each
//    peer (all_to_all, whose splits may differ per rank; zeros otherwise);
//  - point to point: one count message per send, on the data's own tag, read
//    by the receiver before it posts the data receive.
// When they do not fit, the stream hangs at the operation as NCCL would, until
// abort(): the guard's verdict then fails it like any stuck collective, and a
// program without the guard hangs, as it would on NCCL. The operation is
// "started" (its kernel runs, waiting for peers).

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace torch_ext::nccl_sim {

struct Agreement {
  // Collectives: every rank gives the same `word` (0 with no collective).
  bool collective = false;
  uint64_t word = 0;
  // all_to_all: bytes this rank sends to / expects from each group rank
  // (empty for other collectives).
  std::vector<int64_t> sendTo, recvFrom;
  // Point to point, in issue order.
  struct PeerCount {
    bool send = false;
    int peer = -1;
    int tag = 0;
    int64_t bytes = 0;
  };
  std::vector<PeerCount> p2p;

  bool empty() const {
    return !collective && p2p.empty();
  }
  // A coalescing block agrees once for all of its operations.
  void merge(const Agreement& o);
};

// Builds a collective's word: the operation's name, then what must be equal
// on every rank (bytes, roots). FNV-1a, so the same inputs give the same word
// in every process.
class AgreementWord {
 public:
  explicit AgreementWord(const std::string& op);
  AgreementWord& add(int64_t v);
  AgreementWord& bytes(const at::Tensor& t);
  AgreementWord& bytes(const std::vector<at::Tensor>& ts);
  Agreement collective() const;
  // The bytes of `ts` together (a send's or a receive's count).
  static int64_t total(const std::vector<at::Tensor>& ts);

 private:
  uint64_t h_;
};

// Bytes per peer of an all_to_all whose splits are `splits` (elements along
// dim 0; empty: equal parts) for tensor `t`, in a group of `size`.
std::vector<int64_t> splitBytes(const at::Tensor& t, const std::vector<int64_t>& splits, int size);

// Bytes of ts[r] at r, for a group of `size` (0 where there is no tensor): what a
// root sends to or expects from each rank.
std::vector<int64_t> perRankBytes(const std::vector<at::Tensor>& ts, int size);
// A rooted collective's agreement (gather, scatter): its word, and per-peer
// vectors of zeros to fill; throws when `root` is not a rank of the group.
Agreement rootedAgreement(const std::string& op, int64_t root, int size);

// The collective part's row for this rank: 1 + 2 * size int64.
std::vector<int64_t> agreementRow(const Agreement& a, int size);
// Given every rank's row (rows[r] from group rank r): "" when they fit, else
// what differs, in words.
std::string compareRows(const std::vector<std::vector<int64_t>>& rows, int size);
// A receive of `expected` bytes from `peer` (tag `tag`) met a send of `sent`:
// "" when equal, else what differs.
std::string compareCounts(const Agreement::PeerCount& recv, int64_t sent);

// The agreement's exchange on the transport (called on the stream's thread):
// launch() issues it and returns the works to wait for; verdict() then says
// "" (the ranks fit) or what differs.
class AgreementRound {
 public:
  AgreementRound(const Agreement& a, int size);
  std::vector<c10::intrusive_ptr<c10d::Work>> launch(c10d::Backend& transport);
  std::string verdict() const;

 private:
  const Agreement& a_;
  const int size_;
  std::vector<at::Tensor> rows_;      // gathered collective rows
  std::vector<at::Tensor> received_;  // one per receive, in order
};

}  // namespace torch_ext::nccl_sim
