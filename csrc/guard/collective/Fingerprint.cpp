#include "guard/collective/Fingerprint.h"

#include "guard/TorchCompat.h"

#include <c10/util/accumulate.h>

#include <sstream>

namespace torch_ext {

namespace {

// c10d's OpType of each Op, in Op's order.
const c10d::OpType kOpTypes[] = {
    c10d::OpType::BROADCAST,
    c10d::OpType::ALLREDUCE,
    c10d::OpType::ALLREDUCE_COALESCED,
    c10d::OpType::_ALLREDUCE_SPARSE,
    c10d::OpType::REDUCE,
    c10d::OpType::ALLGATHER,
    c10d::OpType::_ALLGATHER_BASE,
    c10d::OpType::ALLGATHER_COALESCED,
    c10d::OpType::COALESCED,
    c10d::OpType::GATHER,
    c10d::OpType::SCATTER,
    c10d::OpType::REDUCE_SCATTER,
    c10d::OpType::_REDUCE_SCATTER_BASE,
    compat::kReduceScatterTensorCoalescedOpType,  // COALESCED before torch 2.12
    c10d::OpType::ALLTOALL,
    c10d::OpType::ALLTOALL_BASE,
    c10d::OpType::BARRIER,
    c10d::OpType::SEND,
    c10d::OpType::RECV,
    c10d::OpType::RECVANYSOURCE,
};
static_assert(sizeof(kOpTypes) / sizeof(kOpTypes[0]) == static_cast<size_t>(Op::NumOps), "kOpTypes must list every Op");

constexpr size_t kMaxSplitsKept = 16;

}  // namespace

c10d::OpType toOpType(Op op) {
  auto i = static_cast<size_t>(op);
  return i < static_cast<size_t>(Op::NumOps) ? kOpTypes[i] : c10d::OpType::UNKNOWN;
}

const char* reduceOpName(int reduceOp) {
  static const char* names[] = {"SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM"};
  if (reduceOp < 0 || reduceOp >= 9) return "";
  return names[reduceOp];
}

std::string dtypeName(c10::ScalarType t) {
  if (t == c10::ScalarType::Undefined) return "undefined";
  return std::string(c10::getDtypeNames(t).first);
}

std::string TensorMeta::describe() const {
  std::ostringstream os;
  os << dtypeName(dtype) << "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    os << (i ? ", " : "") << sizes[i];
  }
  if (sizes.rank() > sizes.size()) os << ", ... (" << sizes.rank() << " dimensions)";
  os << "]";
  return os.str();
}

bool Fingerprint::mayFinishAlone(int me, bool gated) const {
  switch (op) {
    case Op::Send:
      return true;
    case Op::Recv:
    case Op::RecvAnySource:
      return false;
    case Op::Broadcast:
    case Op::Scatter:
      return !gated && root == me;
    case Op::Reduce:
    case Op::Gather:
      return !gated && root != me;
    default:
      return false;
  }
}

int64_t Fingerprint::numel() const {
  if (metas.empty()) return 0;
  return metas[0].numel;
}

uint64_t Fingerprint::p2pPairHash() const {
  uint64_t h = detail::mix64(0x5eed);
  h = detail::combine(h, metas.empty() ? 0 : static_cast<uint64_t>(metas[0].dtype));
  h = detail::combine(h, static_cast<uint64_t>(numel()));
  return detail::combine(h, static_cast<uint64_t>(static_cast<uint32_t>(tag)));
}

OpFacts Fingerprint::facts() const {
  OpFacts f;
  f.text = describe();
  f.op = opName(op);
  if (!metas.empty()) {
    f.dtype = dtypeName(metas.front().dtype);
    f.sizes.assign(metas.front().sizes.begin(), metas.front().sizes.end());
  }
  f.tensors = numTensors;
  f.reduceOp = reduceOpName(reduceOp);
  return f;
}

std::string Fingerprint::describe() const {
  std::ostringstream os;
  os << opName(op) << "(";
  bool first = true;
  auto sep = [&]() -> std::ostream& {
    if (!first) os << ", ";
    first = false;
    return os;
  };
  const bool a2aSingle = op == Op::AllToAllSingle;
  if (numTensors > 1 && !a2aSingle) {
    sep() << numTensors << " tensors: ";
    first = true;
    for (const auto& m : metas) sep() << m.describe();
    if (numTensors > metas.size()) sep() << "...";
  } else if (!metas.empty()) {
    if (a2aSingle) {
      // dim 0 is per-rank; show it as '*' since only the splits must agree.
      TensorMeta m = metas[0];
      std::ostringstream t;
      t << dtypeName(m.dtype) << "[*";
      for (size_t i = 1; i < m.sizes.size(); ++i) t << ", " << m.sizes[i];
      t << "]";
      sep() << t.str();
    } else {
      sep() << metas[0].describe();
    }
  }
  if (reduceOp >= 0) sep() << reduceOpName(reduceOp);
  switch (op) {
    case Op::Broadcast:
    case Op::Scatter:
      sep() << "src=" << root;
      break;
    case Op::Reduce:
    case Op::Gather:
      sep() << "dst=" << root;
      break;
    case Op::Send:
      sep() << "dst=" << root << ", tag=" << tag;
      break;
    case Op::Recv:
      sep() << "src=" << root << ", tag=" << tag;
      break;
    case Op::RecvAnySource:
      sep() << "src=any, tag=" << tag;
      break;
    default:
      break;
  }
  if (op == Op::AllToAll || op == Op::AllToAllSingle) {
    auto list = [&](const c10::SmallVector<int64_t, 4>& v) {
      std::ostringstream t;
      t << "[";
      for (size_t i = 0; i < v.size(); ++i) t << (i ? "," : "") << v[i];
      if (splitsTruncated) t << ",...";
      t << "]";
      return t.str();
    };
    sep() << "send=" << list(sendSplits) << ", recv=" << list(recvSplits);
  }
  os << ")";
  return os.str();
}

FingerprintBuilder::FingerprintBuilder(Op op) : h_(detail::mix64(static_cast<uint64_t>(op) + 1)) {
  fp_.op = op;
}

void FingerprintBuilder::addMeta(c10::ScalarType dtype, c10::IntArrayRef sizes, c10::DeviceType device, bool skipDim0) {
  h_ = detail::combine(h_, static_cast<uint64_t>(dtype));
  h_ = detail::combine(h_, sizes.size());
  for (size_t i = skipDim0 ? 1 : 0; i < sizes.size(); ++i) {
    h_ = detail::combine(h_, static_cast<uint64_t>(sizes[i]));
  }
  if (fp_.numTensors == 0) fp_.device = device;
  if (fp_.metas.size() < Fingerprint::kInlineMetas) {
    // Built in place: no temporary to copy on the hot path.
    TensorMeta& m = fp_.metas.emplace_back();
    m.dtype = dtype;
    m.sizes.assign(sizes.begin(), sizes.end());
    m.numel = c10::multiply_integers(sizes);
  }
  ++fp_.numTensors;
}

FingerprintBuilder& FingerprintBuilder::tensor(const at::Tensor& t) {
  if (!t.defined()) {
    h_ = detail::combine(h_, 0xdead);
    ++fp_.numTensors;
    return *this;
  }
  addMeta(t.scalar_type(), t.sizes(), t.device().type(), false);
  return *this;
}

FingerprintBuilder& FingerprintBuilder::tensors(const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) tensor(t);
  return *this;
}

FingerprintBuilder& FingerprintBuilder::meta(c10::ScalarType dtype, c10::IntArrayRef sizes, c10::DeviceType device) {
  addMeta(dtype, sizes, device, false);
  return *this;
}

FingerprintBuilder& FingerprintBuilder::rowShape(const at::Tensor& t) {
  addMeta(t.scalar_type(), t.sizes(), t.device().type(), true);
  return *this;
}

FingerprintBuilder& FingerprintBuilder::reduceOp(const c10d::ReduceOp& op) {
  fp_.reduceOp = static_cast<int8_t>(op.op_);
  h_ = detail::combine(h_, 0x100 + static_cast<uint64_t>(op.op_));
  return *this;
}

FingerprintBuilder& FingerprintBuilder::root(int64_t rank) {
  fp_.root = static_cast<int32_t>(rank);
  h_ = detail::combine(h_, 0x200 + static_cast<uint64_t>(rank));
  return *this;
}

FingerprintBuilder& FingerprintBuilder::peer(int64_t rank, int64_t tag) {
  // Peers differ per rank by nature: kept for pairing and text, not hashed.
  fp_.root = static_cast<int32_t>(rank);
  fp_.tag = static_cast<int32_t>(tag);
  return *this;
}

FingerprintBuilder& FingerprintBuilder::splits(int64_t me, const std::vector<int64_t>& send,
                                               const std::vector<int64_t>& recv) {
  uint64_t s = 0, r = 0;
  for (size_t j = 0; j < send.size(); ++j) s += detail::edgeKey(me, static_cast<int64_t>(j), send[j]);
  for (size_t j = 0; j < recv.size(); ++j) r += detail::edgeKey(static_cast<int64_t>(j), me, recv[j]);
  fp_.splitSend = s;
  fp_.splitRecv = r;
  const size_t keep = std::min(kMaxSplitsKept, std::max(send.size(), recv.size()));
  fp_.splitsTruncated = send.size() > keep || recv.size() > keep;
  fp_.sendSplits.assign(send.begin(), send.begin() + std::min(keep, send.size()));
  fp_.recvSplits.assign(recv.begin(), recv.begin() + std::min(keep, recv.size()));
  // The number of peers is rank-invariant.
  h_ = detail::combine(h_, 0x300 + send.size());
  return *this;
}

Fingerprint FingerprintBuilder::finish() {
  fp_.hash = detail::combine(h_, fp_.numTensors);
  return std::move(fp_);
}

}  // namespace torch_ext
