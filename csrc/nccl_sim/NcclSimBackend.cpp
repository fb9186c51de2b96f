#include "nccl_sim/NcclSimBackend.h"

#include "nccl_sim/SimWork.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <mutex>

namespace torch_ext::nccl_sim {

namespace {

// Transports of communicators that went away with work still pending: gloo
// joins its threads on destruction, and one stuck in an exchange whose peer
// never comes would hang the process. Kept, as NCCL keeps an aborted comm's
// resources until exit.
void keepForever(c10::intrusive_ptr<c10d::Backend> transport) {
  static auto* kept = new std::vector<c10::intrusive_ptr<c10d::Backend>>();
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(transport));
}

std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

}  // namespace

NcclSimBackend::NcclSimBackend(int rank, int size, std::string label, bool faultsApply,
                               c10::intrusive_ptr<c10d::Backend> transport, NcclSimSettings settings)
    : c10d::Backend(rank, size),
      label_(std::move(label)),
      transport_(std::move(transport)),
      stream_(SimStream::start(label_, rank, size, faultsApply, settings)) {
  TORCH_CHECK(transport_, "nccl_sim: no transport backend for communicator ", label_);
}

NcclSimBackend::~NcclSimBackend() {
  const bool busy = stream_->aborted() || stream_->pending() > 0 || !stream_->error().empty();
  stream_->stop();
  if (busy) keepForever(std::move(transport_));
}

std::shared_ptr<StreamOp> NcclSimBackend::newOp(std::string name) const {
  auto op = std::make_shared<StreamOp>();
  op->name = std::move(name);
  op->transport = transport_;
  op->future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  return op;
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::issue(const char* name, c10d::OpType type,
                                                     std::vector<at::Tensor> outputs, Agreement agreement,
                                                     Launch launch, std::function<void()> finish) {
  TORCH_CHECK(!shutdown_, "nccl_sim: ", name, " on communicator ", label_, ", which was shut down");
  auto transport = transport_;
  auto run = [transport, launch = std::move(launch)]() -> std::vector<c10::intrusive_ptr<c10d::Work>> {
    return {launch(*transport)};
  };
  if (block_) {
    block_->name += block_->launches.empty() ? std::string(" (") + name : std::string(", ") + name;
    block_->launches.push_back(std::move(run));
    block_->agreement.merge(agreement);
    if (finish) block_->finishes.push_back(std::move(finish));
    block_->outputs.insert(block_->outputs.end(), outputs.begin(), outputs.end());
    return c10::make_intrusive<SimWork>(stream_, block_, getRank(), type);
  }
  auto op = newOp(name);
  op->launches.push_back(std::move(run));
  op->agreement = std::move(agreement);
  if (finish) op->finishes.push_back(std::move(finish));
  op->outputs = std::move(outputs);
  stream_->enqueue(op);
  return c10::make_intrusive<SimWork>(stream_, std::move(op), getRank(), type);
}

c10d::ReduceOp NcclSimBackend::transportOp(const c10d::ReduceOp& op, const char* name) const {
  if (op.op_ == c10d::ReduceOp::PREMUL_SUM) {
    throw c10::NotImplementedError(
        {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
        std::string("nccl_sim: ") + name + " with ReduceOp.PREMUL_SUM is not simulated; use SUM and scale the result");
  }
  if (op.op_ == c10d::ReduceOp::AVG) return c10d::ReduceOp(c10d::ReduceOp::SUM);
  return op;
}

std::function<void()> NcclSimBackend::averageOf(const c10d::ReduceOp& op, std::vector<at::Tensor> outputs) const {
  if (op.op_ != c10d::ReduceOp::AVG) return {};
  const int64_t n = getSize();
  return [outputs = std::move(outputs), n]() {
    for (const auto& t : outputs) {
      if (!t.defined()) continue;
      auto tt = t;
      if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false)) {
        tt.div_(n, "trunc");
      } else {
        tt.div_(n);
      }
    }
  };
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                         const c10d::BroadcastOptions& opts) {
  return issue("broadcast", c10d::OpType::BROADCAST, tensors,
               AgreementWord("broadcast").add(opts.rootRank).add(opts.rootTensor).bytes(tensors).collective(),
               [tensors, opts](c10d::Backend& t) mutable { return t.broadcast(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::AllreduceOptions& opts) {
  auto o = opts;
  o.reduceOp = transportOp(opts.reduceOp, "all_reduce");
  return issue(
      "all_reduce", c10d::OpType::ALLREDUCE, tensors, AgreementWord("all_reduce").bytes(tensors).collective(),
      [tensors, o](c10d::Backend& t) mutable { return t.allreduce(tensors, o); }, averageOf(opts.reduceOp, tensors));
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                   const c10d::AllreduceCoalescedOptions& opts) {
  auto o = opts;
  o.reduceOp = transportOp(opts.reduceOp, "all_reduce_coalesced");
  return issue(
      "all_reduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, tensors,
      AgreementWord("all_reduce_coalesced").bytes(tensors).collective(),
      [tensors, o](c10d::Backend& t) mutable { return t.allreduce_coalesced(tensors, o); },
      averageOf(opts.reduceOp, tensors));
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::reduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::ReduceOptions& opts) {
  auto o = opts;
  o.reduceOp = transportOp(opts.reduceOp, "reduce");
  // Only the root's output is defined; only it is averaged.
  auto finish = getRank() == opts.rootRank ? averageOf(opts.reduceOp, tensors) : std::function<void()>();
  return issue(
      "reduce", c10d::OpType::REDUCE, tensors,
      AgreementWord("reduce").add(opts.rootRank).add(opts.rootTensor).bytes(tensors).collective(),
      [tensors, o](c10d::Backend& t) mutable { return t.reduce(tensors, o); }, std::move(finish));
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllgatherOptions& opts) {
  // Rank r's input goes to every rank, which expects outputs[0][r] from it (sizes may differ
  // per rank on NCCL: the agreement checks only that every send meets its receive).
  auto agreement = AgreementWord("all_gather").add(static_cast<int64_t>(inputs.size())).collective();
  agreement.sendTo.assign(getSize(), AgreementWord::total(inputs));
  agreement.recvFrom.assign(getSize(), 0);
  for (const auto& list : outputs) {
    const auto bytes = perRankBytes(list, getSize());
    for (size_t r = 0; r < bytes.size(); ++r) agreement.recvFrom[r] += bytes[r];
  }
  return issue("all_gather", c10d::OpType::ALLGATHER, flat(outputs), std::move(agreement),
               [outputs, inputs, opts](c10d::Backend& t) mutable { return t.allgather(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                               const c10d::AllgatherOptions& opts) {
  return issue("all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE, {output},
               AgreementWord("all_gather_into_tensor").bytes(input).bytes(output).collective(),
               [output, input, opts](c10d::Backend& t) mutable { return t._allgather_base(output, input, opts); });
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                   std::vector<at::Tensor>& inputs,
                                                                   const c10d::AllgatherOptions& opts) {
  return issue(
      "all_gather_coalesced", c10d::OpType::ALLGATHER_COALESCED, flat(outputs),
      AgreementWord("all_gather_coalesced").bytes(inputs).bytes(flat(outputs)).collective(),
      [outputs, inputs, opts](c10d::Backend& t) mutable { return t.allgather_coalesced(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                               std::vector<at::Tensor>& inputs,
                                                                               const c10d::AllgatherOptions& opts) {
  return issue("all_gather_into_tensor_coalesced", c10d::OpType::COALESCED, outputs,
               AgreementWord("all_gather_into_tensor_coalesced").bytes(inputs).bytes(outputs).collective(),
               [outputs, inputs, opts](c10d::Backend& t) mutable {
                 return t.allgather_into_tensor_coalesced(outputs, inputs, opts);
               });
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::GatherOptions& opts) {
  // Each rank sends its input to the root, which expects outputs[r] from rank r.
  auto agreement = rootedAgreement("gather", opts.rootRank, getSize());
  agreement.sendTo[opts.rootRank] = AgreementWord::total(inputs);
  const auto received = flat(outputs);
  agreement.recvFrom = perRankBytes(received, getSize());
  return issue("gather", c10d::OpType::GATHER, received, std::move(agreement),
               [outputs, inputs, opts](c10d::Backend& t) mutable { return t.gather(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::scatter(std::vector<at::Tensor>& outputs,
                                                       std::vector<std::vector<at::Tensor>>& inputs,
                                                       const c10d::ScatterOptions& opts) {
  // The root sends inputs[r] to rank r, which expects its output.
  auto agreement = rootedAgreement("scatter", opts.rootRank, getSize());
  agreement.recvFrom[opts.rootRank] = AgreementWord::total(outputs);
  agreement.sendTo = perRankBytes(flat(inputs), getSize());
  return issue("scatter", c10d::OpType::SCATTER, outputs, std::move(agreement),
               [outputs, inputs, opts](c10d::Backend& t) mutable { return t.scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                              std::vector<std::vector<at::Tensor>>& inputs,
                                                              const c10d::ReduceScatterOptions& opts) {
  auto o = opts;
  o.reduceOp = transportOp(opts.reduceOp, "reduce_scatter");
  return issue(
      "reduce_scatter", c10d::OpType::REDUCE_SCATTER, outputs,
      AgreementWord("reduce_scatter").bytes(outputs).bytes(flat(inputs)).collective(),
      [outputs, inputs, o](c10d::Backend& t) mutable { return t.reduce_scatter(outputs, inputs, o); },
      averageOf(opts.reduceOp, outputs));
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                    const c10d::ReduceScatterOptions& opts) {
  auto o = opts;
  o.reduceOp = transportOp(opts.reduceOp, "reduce_scatter_tensor");
  return issue(
      "reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, {output},
      AgreementWord("reduce_scatter_tensor").bytes(output).bytes(input).collective(),
      [output, input, o](c10d::Backend& t) mutable { return t._reduce_scatter_base(output, input, o); },
      averageOf(opts.reduceOp, {output}));
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                               std::vector<at::Tensor>& inputs,
                                                                               const c10d::ReduceScatterOptions& opts) {
  auto o = opts;
  o.reduceOp = transportOp(opts.reduceOp, "reduce_scatter_tensor_coalesced");
  return issue(
      "reduce_scatter_tensor_coalesced", c10d::OpType::COALESCED, outputs,
      AgreementWord("reduce_scatter_tensor_coalesced").bytes(outputs).bytes(inputs).collective(),
      [outputs, inputs, o](c10d::Backend& t) mutable { return t.reduce_scatter_tensor_coalesced(outputs, inputs, o); },
      averageOf(opts.reduceOp, outputs));
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                             std::vector<int64_t>& outputSplitSizes,
                                                             std::vector<int64_t>& inputSplitSizes,
                                                             const c10d::AllToAllOptions& opts) {
  auto agreement = AgreementWord("all_to_all_single").collective();
  agreement.sendTo = splitBytes(input, inputSplitSizes, getSize());
  agreement.recvFrom = splitBytes(output, outputSplitSizes, getSize());
  return issue("all_to_all_single", c10d::OpType::ALLTOALL_BASE, {output}, std::move(agreement),
               [output, input, outputSplitSizes, inputSplitSizes, opts](c10d::Backend& t) mutable {
                 return t.alltoall_base(output, input, outputSplitSizes, inputSplitSizes, opts);
               });
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                        std::vector<at::Tensor>& inputs,
                                                        const c10d::AllToAllOptions& opts) {
  auto agreement = AgreementWord("all_to_all").add(static_cast<int64_t>(inputs.size())).collective();
  for (size_t j = 0; j < inputs.size() && j < outputs.size(); ++j) {
    agreement.sendTo.push_back(inputs[j].numel() * inputs[j].element_size());
    agreement.recvFrom.push_back(outputs[j].numel() * outputs[j].element_size());
  }
  return issue("all_to_all", c10d::OpType::ALLTOALL, outputs, std::move(agreement),
               [outputs, inputs, opts](c10d::Backend& t) mutable { return t.alltoall(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::barrier(const c10d::BarrierOptions& opts) {
  return issue("barrier", c10d::OpType::BARRIER, {}, AgreementWord("barrier").collective(),
               [opts](c10d::Backend& t) { return t.barrier(opts); });
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  Agreement agreement;
  agreement.p2p.push_back({true, dstRank, tag, AgreementWord::total(tensors)});
  return issue("send", c10d::OpType::SEND, {}, std::move(agreement),
               [tensors, dstRank, tag](c10d::Backend& t) mutable { return t.send(tensors, dstRank, tag); });
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  Agreement agreement;
  agreement.p2p.push_back({false, srcRank, tag, AgreementWord::total(tensors)});
  return issue("recv", c10d::OpType::RECV, tensors, std::move(agreement),
               [tensors, srcRank, tag](c10d::Backend& t) mutable { return t.recv(tensors, srcRank, tag); });
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::recvAnysource(std::vector<at::Tensor>& /*tensors*/, int /*tag*/) {
  // As ProcessGroupNCCL: NCCL has no receive from any source.
  TORCH_CHECK(false, "nccl_sim: recv from any source is not supported (nor by NCCL): name the source rank");
}

void NcclSimBackend::startCoalescing() {
  // An abandoned block (an op inside raised) is dropped: its ops never ran.
  block_ = newOp("coalesced block");
}

c10::intrusive_ptr<c10d::Work> NcclSimBackend::endCoalescing() {
  TORCH_CHECK(block_, "nccl_sim: endCoalescing() without startCoalescing() on communicator ", label_);
  auto block = std::move(block_);
  block_.reset();
  if (!block->launches.empty()) block->name += ")";
  stream_->enqueue(block);
  return c10::make_intrusive<SimWork>(stream_, std::move(block), getRank(), c10d::OpType::COALESCED);
}

void NcclSimBackend::synchronizeStream() {
  stream_->synchronize();
}

void NcclSimBackend::setTimeout(std::chrono::milliseconds timeout) {
  transport_->setTimeout(timeout);
}

void NcclSimBackend::setSequenceNumberForGroup() {
  transport_->setSequenceNumberForGroup();
}

uint64_t NcclSimBackend::getSequenceNumberForGroup() {
  return transport_->getSequenceNumberForGroup();
}

c10d::ErrorType NcclSimBackend::getError() {
  if (stream_->aborted() || !stream_->error().empty()) return c10d::ErrorType::COMM_ERROR;
  return c10d::ErrorType::SUCCESS;
}

void NcclSimBackend::abort() {
  stream_->abort("abort() was called on the process group (ncclCommAbort)");
}

void NcclSimBackend::shutdown() {
  if (shutdown_) return;
  shutdown_ = true;
  // As ProcessGroupNCCL::shutdown(): what was issued is flushed for a bounded
  // time (peers may be waiting for it), then aborted (a stuck peer must not
  // hold the process forever).
  constexpr auto kFlushBound = std::chrono::seconds(10);
  if (!stream_->drain(kFlushBound)) stream_->abort("shutdown() with operations still pending after 10 s");
  stream_->stop();
}

}  // namespace torch_ext::nccl_sim
