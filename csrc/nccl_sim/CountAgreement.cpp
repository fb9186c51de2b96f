#include "nccl_sim/CountAgreement.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace torch_ext::nccl_sim {

namespace {

constexpr uint64_t kFnvOffset = 1469598103934665603ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

int64_t bytesOf(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()) : 0;
}

at::Tensor longs(const std::vector<int64_t>& v) {
  auto t = at::empty({static_cast<int64_t>(v.size())}, at::kLong);
  auto* p = t.data_ptr<int64_t>();
  for (size_t i = 0; i < v.size(); ++i) p[i] = v[i];
  return t;
}

std::string describeMatrix(const std::vector<std::vector<int64_t>>& rows, int size) {
  // rows[i][1 + j]: bytes i sends to j; rows[j][1 + size + i]: bytes j expects from i.
  for (int i = 0; i < size; ++i) {
    for (int j = 0; j < size; ++j) {
      const int64_t sent = rows[i][1 + j];
      const int64_t expected = rows[j][1 + size + i];
      if (sent != expected) {
        std::ostringstream os;
        os << "rank " << i << " sends " << sent << " bytes to rank " << j << ", which expects " << expected;
        return os.str();
      }
    }
  }
  return "";
}

}  // namespace

void Agreement::merge(const Agreement& o) {
  if (o.collective) {
    if (collective) {
      // Order matters: the block's collectives run one after the other.
      for (int i = 0; i < 8; ++i) word = (word ^ ((o.word >> (8 * i)) & 0xff)) * kFnvPrime;
    } else {
      word = o.word;
    }
    collective = true;
  }
  if (!o.sendTo.empty()) {
    if (sendTo.empty()) {
      sendTo.assign(o.sendTo.size(), 0);
      recvFrom.assign(o.recvFrom.size(), 0);
    }
    for (size_t i = 0; i < sendTo.size() && i < o.sendTo.size(); ++i) sendTo[i] += o.sendTo[i];
    for (size_t i = 0; i < recvFrom.size() && i < o.recvFrom.size(); ++i) recvFrom[i] += o.recvFrom[i];
  }
  p2p.insert(p2p.end(), o.p2p.begin(), o.p2p.end());
}

AgreementWord::AgreementWord(const std::string& op) : h_(kFnvOffset) {
  for (unsigned char c : op) h_ = (h_ ^ c) * kFnvPrime;
}

AgreementWord& AgreementWord::add(int64_t v) {
  for (int i = 0; i < 8; ++i) h_ = (h_ ^ ((static_cast<uint64_t>(v) >> (8 * i)) & 0xff)) * kFnvPrime;
  return *this;
}

AgreementWord& AgreementWord::bytes(const at::Tensor& t) {
  return add(bytesOf(t));
}

AgreementWord& AgreementWord::bytes(const std::vector<at::Tensor>& ts) {
  add(static_cast<int64_t>(ts.size()));
  for (const auto& t : ts) bytes(t);
  return *this;
}

int64_t AgreementWord::total(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += bytesOf(t);
  return n;
}

Agreement AgreementWord::collective() const {
  Agreement a;
  a.collective = true;
  a.word = h_;
  return a;
}

std::vector<int64_t> splitBytes(const at::Tensor& t, const std::vector<int64_t>& splits, int size) {
  std::vector<int64_t> out(static_cast<size_t>(size), 0);
  if (!t.defined() || size <= 0) return out;
  const int64_t rowBytes = t.dim() == 0 || t.size(0) == 0 ? 0 : bytesOf(t) / t.size(0);
  for (int j = 0; j < size; ++j) {
    if (splits.empty()) {
      out[j] = bytesOf(t) / size;
    } else if (static_cast<size_t>(j) < splits.size()) {
      out[j] = splits[j] * rowBytes;
    }
  }
  return out;
}

std::vector<int64_t> perRankBytes(const std::vector<at::Tensor>& ts, int size) {
  std::vector<int64_t> out(static_cast<size_t>(size), 0);
  for (size_t r = 0; r < ts.size() && r < out.size(); ++r) out[r] = bytesOf(ts[r]);
  return out;
}

Agreement rootedAgreement(const std::string& op, int64_t root, int size) {
  TORCH_CHECK(root >= 0 && root < size, "nccl_sim: ", op, " with root ", root, " in a group of ", size);
  Agreement a = AgreementWord(op).add(root).collective();
  a.sendTo.assign(static_cast<size_t>(size), 0);
  a.recvFrom.assign(static_cast<size_t>(size), 0);
  return a;
}

std::vector<int64_t> agreementRow(const Agreement& a, int size) {
  std::vector<int64_t> row(1 + 2 * static_cast<size_t>(size), 0);
  row[0] = static_cast<int64_t>(a.word);
  for (int j = 0; j < size; ++j) {
    if (static_cast<size_t>(j) < a.sendTo.size()) row[1 + j] = a.sendTo[j];
    if (static_cast<size_t>(j) < a.recvFrom.size()) row[1 + size + j] = a.recvFrom[j];
  }
  return row;
}

std::string compareRows(const std::vector<std::vector<int64_t>>& rows, int size) {
  std::vector<int> differing;
  for (int r = 0; r < size; ++r) {
    if (rows[r][0] != rows[0][0]) differing.push_back(r);
  }
  if (!differing.empty()) {
    std::ostringstream os;
    os << "the ranks' collectives do not fit (another operation, root or byte count on rank";
    os << (differing.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < differing.size(); ++i) os << (i ? "," : "") << differing[i];
    os << " than on rank 0)";
    return os.str();
  }
  return describeMatrix(rows, size);
}

std::string compareCounts(const Agreement::PeerCount& recv, int64_t sent) {
  if (sent == recv.bytes) return "";
  std::ostringstream os;
  os << "rank " << recv.peer << " sends " << sent << " bytes (tag " << recv.tag << ") into a receive of " << recv.bytes
     << " bytes";
  return os.str();
}

AgreementRound::AgreementRound(const Agreement& a, int size) : a_(a), size_(size) {}

std::vector<c10::intrusive_ptr<c10d::Work>> AgreementRound::launch(c10d::Backend& transport) {
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  if (a_.collective) {
    std::vector<at::Tensor> in{longs(agreementRow(a_, size_))};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int r = 0; r < size_; ++r) out[0].push_back(at::empty_like(in[0]));
    rows_ = out[0];
    works.push_back(transport.allgather(out, in, c10d::AllgatherOptions()));
  }
  for (const auto& pc : a_.p2p) {
    std::vector<at::Tensor> t{longs({pc.send ? pc.bytes : 0})};
    if (pc.send) {
      works.push_back(transport.send(t, pc.peer, pc.tag));
    } else {
      received_.push_back(t[0]);
      works.push_back(transport.recv(t, pc.peer, pc.tag));
    }
  }
  return works;
}

std::string AgreementRound::verdict() const {
  if (a_.collective) {
    std::vector<std::vector<int64_t>> rows;
    for (const auto& t : rows_) {
      const auto* p = t.data_ptr<int64_t>();
      rows.emplace_back(p, p + t.numel());
    }
    if (auto diff = compareRows(rows, size_); !diff.empty()) return diff;
  }
  size_t k = 0;
  for (const auto& pc : a_.p2p) {
    if (pc.send) continue;
    if (auto diff = compareCounts(pc, received_[k++].data_ptr<int64_t>()[0]); !diff.empty()) return diff;
  }
  return "";
}

}  // namespace torch_ext::nccl_sim
