#pragma once

// Op and EntryState: what a record of the flight recorder is (which collective
// or point-to-point operation) and where it stands, as typed values shared by
// the live side (the ledger) and the analysis of snapshots and dumps.

#include "guard/report/EnumNames.h"

#include <cstdint>
#include <optional>
#include <string_view>

namespace torch_ext {

enum class Op : uint8_t {
  Broadcast,
  AllReduce,
  AllReduceCoalesced,
  AllReduceSparse,
  Reduce,
  AllGather,
  AllGatherIntoTensor,
  AllGatherCoalesced,
  AllGatherIntoTensorCoalesced,
  Gather,
  Scatter,
  ReduceScatter,
  ReduceScatterTensor,
  ReduceScatterTensorCoalesced,
  AllToAll,
  AllToAllSingle,
  Barrier,
  Send,
  Recv,
  RecvAnySource,
  NumOps,
};

// torch.distributed's names ("all_reduce", "all_to_all_single", ...).
template <>
struct EnumTable<Op> {
  static constexpr NamedValue<Op> kEntries[] = {
      {Op::Broadcast, "broadcast"},
      {Op::AllReduce, "all_reduce"},
      {Op::AllReduceCoalesced, "all_reduce_coalesced"},
      {Op::AllReduceSparse, "all_reduce_sparse"},
      {Op::Reduce, "reduce"},
      {Op::AllGather, "all_gather"},
      {Op::AllGatherIntoTensor, "all_gather_into_tensor"},
      {Op::AllGatherCoalesced, "all_gather_coalesced"},
      {Op::AllGatherIntoTensorCoalesced, "all_gather_into_tensor_coalesced"},
      {Op::Gather, "gather"},
      {Op::Scatter, "scatter"},
      {Op::ReduceScatter, "reduce_scatter"},
      {Op::ReduceScatterTensor, "reduce_scatter_tensor"},
      {Op::ReduceScatterTensorCoalesced, "reduce_scatter_tensor_coalesced"},
      {Op::AllToAll, "all_to_all"},
      {Op::AllToAllSingle, "all_to_all_single"},
      {Op::Barrier, "barrier"},
      {Op::Send, "send"},
      {Op::Recv, "recv"},
      {Op::RecvAnySource, "recv_any_source"},
  };
};
static_assert(enumCount<Op>() == static_cast<size_t>(Op::NumOps), "EnumTable<Op> must list every Op");

inline const char* opName(Op op) {
  return enumName(op, "unknown");
}
inline std::optional<Op> opFromName(std::string_view name) {
  return enumFromName<Op>(name);
}
inline bool isP2P(Op op) {
  return op == Op::Send || op == Op::Recv || op == Op::RecvAnySource;
}
inline bool isAllToAll(Op op) {
  return op == Op::AllToAll || op == Op::AllToAllSingle;
}
// The op a peer posts to pair with `op` (send <-> recv).
inline Op p2pCounterpart(Op op) {
  return op == Op::Send ? Op::Recv : Op::Send;
}

enum class EntryState : uint8_t { Scheduled, Completed, Failed };

template <>
struct EnumTable<EntryState> {
  static constexpr NamedValue<EntryState> kEntries[] = {
      {EntryState::Scheduled, "scheduled"},
      {EntryState::Completed, "completed"},
      {EntryState::Failed, "failed"},
  };
};

inline const char* entryStateName(EntryState s) {
  return enumName(s);
}

}  // namespace torch_ext
