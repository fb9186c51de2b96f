#include "guard/modes/verify/InBandCheck.h"

#include "guard/modes/verify/PairExchange.h"
#include "guard/modes/verify/RingCarry.h"
#include "guard/TorchCompat.h"
#include "guard/collective/InnerFuture.h"

#include <ATen/ATen.h>

#include <cstring>
#include <mutex>
#include <type_traits>

namespace torch_ext {

namespace {

constexpr int kBits = 64;

bool pairEncoded(const c10d::ReduceOp& op) {
  return op == c10d::ReduceOp::MAX || op == c10d::ReduceOp::MIN;
}

// The carried collective's work. Where the inner work has a future (gloo's
// all_reduce and all_gather), `done` is chained on it and runs `then` (the
// verdict, the copy back) on completion. Where it has none (gloo's
// reduce_scatter), `then` runs once, on the first wait() or isCompleted()
// (the user's or the watchdog's poll) to see the inner work done; the work
// then has no future either, as the inner one.
class InBandWork : public c10d::Work, public ForwardsFuture {
 public:
  InBandWork(c10d::OpType type, c10::intrusive_ptr<c10d::Work> inner, c10::intrusive_ptr<c10::ivalue::Future> done,
             std::function<void()> then, std::vector<at::Tensor> outputs)
      : c10d::Work(-1, type),
        inner_(std::move(inner)),
        done_(std::move(done)),
        then_(std::move(then)),
        outputs_(std::move(outputs)) {}

  bool isCompleted() override {
    if (done_) return done_->completed();
    if (!inner_->isCompleted()) return false;
    if (inner_->isSuccess()) finish();
    return true;
  }
  bool isSuccess() const override {
    if (done_) return done_->completed() && !done_->hasError();
    return inner_->isSuccess();
  }
  std::exception_ptr exception() const override {
    if (done_) return done_->completed() ? done_->exception_ptr() : nullptr;
    return inner_->exception();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    const bool ok = inner_->wait(timeout);
    if (!ok) return false;
    if (!done_) {
      finish();
      return true;
    }
    done_->wait();
    if (done_->hasError()) std::rethrow_exception(done_->exception_ptr());
    return true;
  }
  void synchronize() override {
    inner_->synchronize();
  }
  void abort() override {
    inner_->abort();
  }
  std::vector<at::Tensor> result() override {
    return outputs_;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    if (!done_) return c10d::Work::getFuture();  // throws: none, as the inner work
    return done_;
  }

 private:
  void finish() {
    std::call_once(once_, [this] { then_(); });
  }

  c10::intrusive_ptr<c10d::Work> inner_;
  c10::intrusive_ptr<c10::ivalue::Future> done_;
  std::function<void()> then_;  // without a future only
  std::once_flag once_;
  std::vector<at::Tensor> outputs_;
};

// The words in front of a carried buffer: `mine`, then zeros up to kWordSlots.
template <typename T>
void putWords(T* p, const std::vector<double>& mine) {
  const auto k = static_cast<int64_t>(mine.size());
  for (int64_t i = 0; i < k; ++i) p[i] = static_cast<T>(mine[i]);
  for (int64_t i = k; i < InBandCheck::kWordSlots; ++i) p[i] = T(0);
}

// The reduced words in front of a carried buffer, as doubles (`words` sized).
template <typename T>
void takeWords(const T* p, std::vector<double>* words) {
  for (size_t i = 0; i < words->size(); ++i) (*words)[i] = static_cast<double>(p[i]);
}

// A reduced carried buffer: its `n` data elements go back to `user` first
// (whoever the verdict releases reads them), then its `k` words say whether
// the ranks agree.
bool readBack(const at::Tensor& carried, const at::Tensor& user, int64_t k, int64_t n, const c10d::ReduceOp& op,
              int worldSize);

// The four dtypes whose sums of W ones stay exact in the words.
bool reducible(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
    case at::kDouble:
    case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

// Whether the inner backend's reduction of every element comes out the same
// whatever order and grouping it combines the ranks' operands in. A carry
// changes the buffer's length and layout (words in front, padding, a widened
// element), and with them which rank combines which element in which order
// (gloo's ring segments follow the byte count): it may take a reduction only
// where that cannot show in the result. Integer sums wrap and MAX/MIN pick, in
// any order; floating sums round at each step, and a floating MAX/MIN keeps the
// first operand of a NaN and a number, or of 0 and -0 (issue 56: a float32
// sum at world 3 differed from plain gloo's in the last bit).
bool orderFree(const at::Tensor& t) {
  return !at::isFloatingType(t.scalar_type());
}

bool denseCpu(const at::Tensor& t) {
  return t.defined() && t.is_cpu() && t.layout() == c10::kStrided && t.is_contiguous() && t.numel() > 0;
}

int64_t bytesOf(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

// Hands out `inner`'s work as one that completes once `then` (which copies the
// data back and reads whether the ranks agree) ran on the inner work's
// completion; `verdict` gets that answer. With a future, the verdict is the
// first callback of the work's completed future, not part of completing it:
// the verdict can wake the group's waiters (Verifier: those of the other
// collectives it releases), and a waiter woken before the future completed
// would find its work pending and sleep again, a context switch per
// collective (docs/performance.md). Callbacks run in the order they were
// added, so the guard's own (GuardWork, which wakes this work's waiter) run
// after the verdict.
c10::intrusive_ptr<c10d::Work> finishing(c10d::OpType type, c10::intrusive_ptr<c10d::Work> inner, at::Tensor user,
                                         std::function<bool()> then, InBandCheck::Verdict verdict) {
  // gloo's reduce_scatter has none: `then` runs in wait() / isCompleted().
  c10::intrusive_ptr<c10::ivalue::Future> future = futureOf(*inner);
  if (!future) {
    return c10::make_intrusive<InBandWork>(
        type, std::move(inner), nullptr, [then = std::move(then), verdict = std::move(verdict)] { verdict(then()); },
        std::vector<at::Tensor>{user});
  }
  auto agree = std::make_shared<bool>(false);
  auto done = future->then(
      [user, agree, then = std::move(then)](c10::ivalue::Future& f) -> c10::IValue {
        (void)f.value();  // rethrows the inner failure: no verdict, no copy
        *agree = then();
        return c10::IValue(std::vector<at::Tensor>{user});
      },
      c10::ListType::ofTensors());
  done->addCallback([agree, verdict = std::move(verdict)](c10::ivalue::Future& f) {
    if (!f.hasError()) verdict(*agree);
  });
  return c10::make_intrusive<InBandWork>(type, std::move(inner), std::move(done), nullptr,
                                         std::vector<at::Tensor>{user});
}

}  // namespace

int64_t InBandCheck::words(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op, int worldSize) {
  if (tensors.size() != 1 || worldSize < 2 || worldSize >= (1 << 24)) return 0;
  const at::Tensor& t = tensors[0];
  if (!denseCpu(t) || !reducible(t) || !orderFree(t) || bytesOf(t) > kMaxBytes) return 0;
  // gloo reduces fewer elements than ranks on a cheaper path, which the carried
  // words would leave (world 4, one float32: 0.86 ms, carried 4.5 ms; a round
  // costs less). One element under SUM carries one word instead (compact), and
  // at world 2 under MAX/MIN the words still cost less than a round.
  if (worldSize > 2 && t.numel() < worldSize) return 0;
  if (op == c10d::ReduceOp::SUM) return kBits;
  if (pairEncoded(op)) return 2 * kBits;
  return 0;
}

int64_t InBandCheck::carriedLength(int64_t n) {
  int64_t len = 256;
  while (len < kWordSlots + n) len *= 2;
  return len;
}

std::vector<double> InBandCheck::encode(uint64_t rolling, const c10d::ReduceOp& op) {
  const bool pairs = pairEncoded(op);
  std::vector<double> w(pairs ? 2 * kBits : kBits);
  for (int b = 0; b < kBits; ++b) {
    const double bit = static_cast<double>((rolling >> b) & 1u);
    w[b] = bit;
    if (pairs) w[kBits + b] = 1.0 - bit;
  }
  return w;
}

bool InBandCheck::agree(const std::vector<double>& reduced, const c10d::ReduceOp& op, int worldSize) {
  if (pairEncoded(op)) {
    if (reduced.size() != 2 * kBits) return false;
    for (int b = 0; b < kBits; ++b) {
      if (reduced[b] + reduced[kBits + b] != 1.0) return false;
    }
    return true;
  }
  if (reduced.size() != kBits) return false;
  // SUM: W ranks' bits add up to 0 or W.
  const double all = static_cast<double>(worldSize);
  for (double v : reduced) {
    if (v != 0.0 && v != all) return false;
  }
  return true;
}

namespace {

bool readBack(const at::Tensor& carried, const at::Tensor& user, int64_t k, int64_t n, const c10d::ReduceOp& op,
              int worldSize) {
  std::vector<double> words(k);
  forCarriedType(carried, [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    std::memcpy(user.data_ptr(), p + InBandCheck::kWordSlots, n * sizeof(T));
    takeWords(p, &words);
  });
  return InBandCheck::agree(words, op, worldSize);
}

}  // namespace

bool InBandCheck::carriesAllGather(const at::Tensor& output, const at::Tensor& input, int worldSize) {
  return worldSize >= 2 && denseCpu(input) && denseCpu(output) && output.scalar_type() == input.scalar_type() &&
         output.numel() == worldSize * input.numel() && bytesOf(output) <= kMaxCopyBytes;
}

bool InBandCheck::carriesReduceScatter(const at::Tensor& output, const at::Tensor& input, const c10d::ReduceOp& op,
                                       int worldSize) {
  if (worldSize < 2 || worldSize >= (1 << 24) || !denseCpu(input) || !denseCpu(output) || !reducible(output) ||
      !orderFree(output) || output.scalar_type() != input.scalar_type() ||
      input.numel() != worldSize * output.numel() || bytesOf(input) > kMaxCopyBytes) {
    return false;
  }
  return op == c10d::ReduceOp::SUM || pairEncoded(op);
}

c10::intrusive_ptr<c10d::Work> InBandCheck::allreduce(c10d::Backend& inner, std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts, uint64_t rolling,
                                                      int worldSize, Verdict verdict, const Reading& reading) {
  at::Tensor user = tensors[0];
  // Between two ranks on gloo, an exchange carried by summed words; else one
  // element summed beside a word, the ring's cheap path; else the words.
  if (exchanges(tensors, opts.reduceOp, worldSize, inner)) {
    return exchangeAllreduce(inner, user, opts, rolling, std::move(verdict));
  }
  if (compact(tensors, opts.reduceOp, worldSize)) {
    return compactAllreduce(inner, user, opts, rolling, worldSize, std::move(verdict));
  }
  if (reading.exchange) {
    if (std::optional<KeyedPick> keyed = keyedPick(tensors, opts.reduceOp, worldSize, inner)) {
      return keyedAllreduce(inner, user, opts, rolling, *keyed, std::move(verdict), reading);
    }
  }
  if (std::optional<RingCarry> ring = ringCarry(tensors, opts.reduceOp, worldSize, inner)) {
    at::Tensor buffer = at::empty({ring->length()}, user.options());
    ring->pack(user, buffer, rolling);
    std::vector<at::Tensor> carried{buffer};
    return finishing(
        c10d::OpType::ALLREDUCE, inner.allreduce(carried, opts), user,
        [buffer, user, rolling, plan = *std::move(ring)] { return plan.agree(plan.unpack(buffer, user), rolling); },
        std::move(verdict));
  }
  const std::vector<double> mine = encode(rolling, opts.reduceOp);
  const auto k = static_cast<int64_t>(mine.size());
  const int64_t n = user.numel();
  at::Tensor buffer = at::empty({carriedLength(n)}, user.options());
  forCarriedType(buffer, [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    putWords(p, mine);
    std::memcpy(p + kWordSlots, user.data_ptr(), n * sizeof(T));
    for (int64_t i = kWordSlots + n; i < buffer.numel(); ++i) p[i] = T(0);
  });
  std::vector<at::Tensor> carried{buffer};
  const c10d::ReduceOp op = opts.reduceOp;
  return finishing(
      c10d::OpType::ALLREDUCE, inner.allreduce(carried, opts), user,
      [buffer, user, k, n, op, worldSize] { return readBack(buffer, user, k, n, op, worldSize); }, std::move(verdict));
}

bool InBandCheck::exchanges(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op, int worldSize,
                            const c10d::Backend& inner) {
  if (worldSize != 2 || tensors.size() != 1 || !denseCpu(tensors[0]) || !reducible(tensors[0]) ||
      bytesOf(tensors[0]) > PairExchange::kMaxDataBytes || inner.getBackendName() != "gloo") {
    return false;
  }
  // MAX/MIN too (an early-stop flag): reduced in gloo's operand order, which
  // decides between a NaN and a number, or 0 and -0 (PairExchange.cpp).
  return op == c10d::ReduceOp::SUM || pairEncoded(op);
}

c10::intrusive_ptr<c10d::Work> InBandCheck::exchangeAllreduce(c10d::Backend& inner, at::Tensor user,
                                                              const c10d::AllreduceOptions& opts, uint64_t rolling,
                                                              Verdict verdict) {
  // The two ranks' words summed: an exchange (PairExchange.h).
  at::Tensor summed = PairExchange::words(user, rolling);
  c10d::AllreduceOptions sum = opts;
  sum.reduceOp = c10d::ReduceOp::SUM;
  std::vector<at::Tensor> carried{summed};
  const int rank = inner.getRank();
  const PairExchange::Combine combine = PairExchange::combineOf(opts.reduceOp);
  return finishing(
      c10d::OpType::ALLREDUCE, inner.allreduce(carried, sum), user,
      [summed, user, rolling, rank, combine] { return PairExchange::finish(user, summed, rolling, rank, combine); },
      std::move(verdict));
}

std::optional<RingCarry> InBandCheck::ringCarry(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op,
                                                int worldSize, const c10d::Backend& inner) {
  // The layout follows gloo's ring (RingCarry.h): gloo's only.
  if (tensors.size() != 1 || !denseCpu(tensors[0]) || bytesOf(tensors[0]) > kMaxBytes ||
      inner.getBackendName() != "gloo") {
    return std::nullopt;
  }
  return RingCarry::plan(tensors[0].numel(), tensors[0].scalar_type(), op, worldSize);
}

std::optional<KeyedPick> InBandCheck::keyedPick(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op,
                                                int worldSize, const c10d::Backend& inner) {
  // The order of gloo's ring (KeyedPick.h): gloo's only.
  if (tensors.size() != 1 || !denseCpu(tensors[0]) || tensors[0].numel() != 1 || inner.getBackendName() != "gloo") {
    return std::nullopt;
  }
  return KeyedPick::plan(tensors[0].scalar_type(), op, worldSize);
}

c10::intrusive_ptr<c10d::Work> InBandCheck::keyedAllreduce(c10d::Backend& inner, at::Tensor user,
                                                           const c10d::AllreduceOptions& opts, uint64_t rolling,
                                                           const KeyedPick& plan, Verdict verdict,
                                                           const Reading& reading) {
  uint32_t mine = 0;
  std::memcpy(&mine, user.data_ptr(), sizeof mine);
  const KeyedPick::Words own = plan.words(mine, inner.getRank(), rolling);
  at::Tensor carried = at::empty({2}, user.options().dtype(at::kLong));
  std::memcpy(carried.data_ptr(), own.data(), sizeof own);
  c10d::AllreduceOptions max = opts;
  max.reduceOp = c10d::ReduceOp::MAX;  // an integer MAX of the keys, whatever the user's op
  std::vector<at::Tensor> words{carried};
  return finishing(
      c10d::OpType::ALLREDUCE, inner.allreduce(words, max), user,
      [carried, user, rolling, mine, plan, reading] {
        KeyedPick::Words reduced{};
        std::memcpy(reduced.data(), carried.data_ptr(), sizeof reduced);
        if (!plan.agree(reduced, rolling)) return false;  // the rounds report it; nothing is released
        std::optional<uint32_t> bits = plan.result(reduced);
        if (!bits) bits = plan.fold((*reading.exchange)(mine, reading.seq));  // a NaN ahead of the largest number
        std::memcpy(user.data_ptr(), &*bits, sizeof *bits);
        return true;
      },
      std::move(verdict));
}

bool InBandCheck::compact(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op, int worldSize) {
  // A floating element only between two ranks: there the ring adds the two
  // operands once, and their sum in float64 rounds to the element type's own
  // sum (float64's 53 bits hold twice float32's 24 and two more; a float64
  // element is not widened at all).
  return tensors.size() == 1 && worldSize >= 2 && worldSize <= (1 << 20) && op == c10d::ReduceOp::SUM &&
         denseCpu(tensors[0]) && reducible(tensors[0]) && (orderFree(tensors[0]) || worldSize == 2) &&
         tensors[0].numel() == 1;
}

int InBandCheck::compactBits(int worldSize) {
  int log2W = 0;
  while ((int64_t{1} << log2W) < worldSize) ++log2W;
  return 53 - log2W;  // W words below 2^bits sum below 2^53
}

uint64_t InBandCheck::compactWord(uint64_t rolling, int worldSize) {
  const int bits = compactBits(worldSize);
  return (rolling >> (64 - (bits - 1))) | (uint64_t{1} << (bits - 1));
}

bool InBandCheck::compactAgree(int64_t reduced, uint64_t word, int worldSize) {
  return static_cast<uint64_t>(reduced) == word * static_cast<uint64_t>(worldSize);
}

c10::intrusive_ptr<c10d::Work> InBandCheck::compactAllreduce(c10d::Backend& inner, at::Tensor user,
                                                             const c10d::AllreduceOptions& opts, uint64_t rolling,
                                                             int worldSize, Verdict verdict) {
  // [the element widened, compactWord]: two elements, gloo's cheap path
  // (InBandCheck.h). Widened to int64 (an integer) or float64 (a floating
  // element, world 2 only: compact()); the word is exact in both.
  const bool floating = at::isFloatingType(user.scalar_type());
  at::Tensor buffer = at::empty({2}, user.options().dtype(floating ? at::kDouble : at::kLong));
  const uint64_t word = compactWord(rolling, worldSize);
  forCarriedType(user, [&](auto* u) {
    if (floating) {
      buffer.data_ptr<double>()[0] = static_cast<double>(u[0]);
      buffer.data_ptr<double>()[1] = static_cast<double>(word);
    } else {
      buffer.data_ptr<int64_t>()[0] = static_cast<int64_t>(u[0]);
      buffer.data_ptr<int64_t>()[1] = static_cast<int64_t>(word);
    }
  });
  std::vector<at::Tensor> carried{buffer};
  return finishing(
      c10d::OpType::ALLREDUCE, inner.allreduce(carried, opts), user,
      [buffer, user, word, worldSize, floating] {
        int64_t reducedWord = 0;
        forCarriedType(user, [&](auto* u) {
          using T = std::remove_pointer_t<decltype(u)>;
          if (floating) {
            const double* p = buffer.data_ptr<double>();
            u[0] = static_cast<T>(p[0]);  // rounds as T's own sum of the two
            reducedWord = static_cast<int64_t>(p[1]);
          } else {
            const int64_t* p = buffer.data_ptr<int64_t>();
            u[0] = static_cast<T>(static_cast<uint64_t>(p[0]));  // wraps as T's own sum would
            reducedWord = p[1];
          }
        });
        return compactAgree(reducedWord, word, worldSize);
      },
      std::move(verdict));
}

c10::intrusive_ptr<c10d::Work> InBandCheck::allgather(c10d::Backend& inner, at::Tensor& output, at::Tensor& input,
                                                      const c10d::AllgatherOptions& opts, uint64_t rolling,
                                                      int worldSize, Verdict verdict) {
  constexpr int64_t kHead = sizeof(uint64_t);
  // Typed: a bool's bytes other than 0 and 1 (a hash's) need not survive a bool copy.
  if (inner.getBackendName() == "gloo" && kHead % input.element_size() == 0 && input.scalar_type() != at::kBool) {
    return gatherBeside(inner, output, input, rolling, worldSize, std::move(verdict));
  }
  // As bytes: [rolling (8), input] from each rank, whatever the dtype.
  const int64_t nb = bytesOf(input);
  at::Tensor in = at::empty({kHead + nb}, input.options().dtype(at::kByte));
  at::Tensor out = at::empty({worldSize * (kHead + nb)}, in.options());
  auto* p = in.data_ptr<uint8_t>();
  std::memcpy(p, &rolling, kHead);
  std::memcpy(p + kHead, input.data_ptr(), nb);
  at::Tensor user = output;
  return finishing(
      c10d::OpType::_ALLGATHER_BASE, inner._allgather_base(out, in, opts), user,
      [out, user, nb, worldSize, rolling] {
        const auto* q = out.data_ptr<uint8_t>();
        auto* dst = static_cast<uint8_t*>(user.data_ptr());
        bool same = true;
        for (int r = 0; r < worldSize; ++r) {
          const uint8_t* block = q + r * (kHead + nb);
          uint64_t theirs = 0;
          std::memcpy(&theirs, block, kHead);
          same = same && theirs == rolling;
          std::memcpy(dst + r * nb, block + kHead, nb);
        }
        return same;
      },
      std::move(verdict));
}

c10::intrusive_ptr<c10d::Work> InBandCheck::gatherBeside(c10d::Backend& inner, at::Tensor& output, at::Tensor& input,
                                                         uint64_t rolling, int worldSize, Verdict verdict) {
  // gloo's coalesced all_gather flattens [input, head] into one buffer, gathers
  // it and copies each rank's input to its place in the user's output and its
  // head beside, as its all_gather copies the inputs out of its own flat
  // buffer: the same bytes where plain gloo puts them, and no copy of the
  // output here. The head is this rank's rolling hash in the input's dtype
  // (8 bytes: its bits are moved, never combined).
  constexpr int64_t kHead = sizeof(uint64_t);
  const int64_t n = input.numel();
  const int64_t per = kHead / static_cast<int64_t>(input.element_size());
  const auto bytes = input.options().dtype(at::kByte);
  at::Tensor head = at::empty({kHead}, bytes);
  std::memcpy(head.data_ptr<uint8_t>(), &rolling, kHead);
  at::Tensor heads = at::empty({worldSize * kHead}, bytes);
  std::vector<at::Tensor> inputs{input.view({n}), head.view(input.scalar_type())};
  const at::Tensor flat = output.view({-1});
  const at::Tensor headsTyped = heads.view(input.scalar_type());
  std::vector<std::vector<at::Tensor>> outputs(worldSize);
  for (int r = 0; r < worldSize; ++r) {
    outputs[r] = {flat.narrow(0, r * n, n), headsTyped.narrow(0, r * per, per)};
  }
  at::Tensor user = output;
  return finishing(
      c10d::OpType::_ALLGATHER_BASE, inner.allgather_coalesced(outputs, inputs), user,
      [heads, worldSize, rolling] {
        const auto* q = heads.data_ptr<uint8_t>();
        bool same = true;
        for (int r = 0; r < worldSize; ++r) {
          uint64_t theirs = 0;
          std::memcpy(&theirs, q + r * kHead, kHead);
          same = same && theirs == rolling;
        }
        return same;
      },
      std::move(verdict));
}

std::optional<RingCarry> InBandCheck::ringScatter(const at::Tensor& output, const at::Tensor& input,
                                                  const c10d::ReduceOp& op, int worldSize, const c10d::Backend& inner) {
  // gloo's reduce_scatter_tensor is an all_reduce of a copy of the input,
  // from which each rank takes its chunk (ProcessGroupGloo,
  // reduce_scatter_tensor_coalesced): the same all_reduce, carried, gives the
  // same bits (TorchCompat.h: the releases where it is so).
  if (!TORCH_EXT_GLOO_REDUCE_SCATTER_IS_ITS_ALL_REDUCE || !denseCpu(input) || !denseCpu(output) ||
      output.scalar_type() != input.scalar_type() || input.numel() != worldSize * output.numel() ||
      bytesOf(input) > kMaxCopyBytes || inner.getBackendName() != "gloo") {
    return std::nullopt;
  }
  return RingCarry::plan(input.numel(), input.scalar_type(), op, worldSize);
}

c10::intrusive_ptr<c10d::Work> InBandCheck::reduceScatter(c10d::Backend& inner, at::Tensor& output, at::Tensor& input,
                                                          const c10d::ReduceScatterOptions& opts, uint64_t rolling,
                                                          int worldSize, Verdict verdict) {
  if (std::optional<RingCarry> ring = ringScatter(output, input, opts.reduceOp, worldSize, inner)) {
    at::Tensor buffer = at::empty({ring->length()}, input.options());
    ring->pack(input, buffer, rolling);
    std::vector<at::Tensor> carried{buffer};
    c10d::AllreduceOptions all;
    all.reduceOp = opts.reduceOp;
    all.timeout = opts.timeout;
    const int64_t from = inner.getRank() * output.numel();
    at::Tensor user = output;
    return finishing(
        c10d::OpType::_REDUCE_SCATTER_BASE, inner.allreduce(carried, all), user,
        [buffer, user, rolling, from, plan = *std::move(ring)] {
          return plan.agree(plan.unpack(buffer, user, from), rolling);
        },
        std::move(verdict));
  }
  // Each rank's chunk gets the words in front: [words, chunk] x W, reduced to
  // [words, this rank's chunk].
  const std::vector<double> mine = encode(rolling, opts.reduceOp);
  const auto k = static_cast<int64_t>(mine.size());
  const int64_t n = output.numel();
  at::Tensor in = at::empty({worldSize * (kWordSlots + n)}, input.options());
  at::Tensor out = at::empty({kWordSlots + n}, output.options());
  forCarriedType(in, [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    const auto* src = static_cast<const T*>(input.data_ptr());
    for (int r = 0; r < worldSize; ++r) {
      T* chunk = p + r * (kWordSlots + n);
      putWords(chunk, mine);
      std::memcpy(chunk + kWordSlots, src + r * n, n * sizeof(T));
    }
  });
  at::Tensor user = output;
  const c10d::ReduceOp op = opts.reduceOp;
  return finishing(
      c10d::OpType::_REDUCE_SCATTER_BASE, inner._reduce_scatter_base(out, in, opts), user,
      [out, user, k, n, op, worldSize] { return readBack(out, user, k, n, op, worldSize); }, std::move(verdict));
}

bool InBandCheck::carries(const InBandRequest& r, const c10d::Backend& inner, int worldSize) {
  switch (r.kind) {
    case InBandRequest::Kind::AllReduce:
      return InBandCheck::exchanges(*r.tensors, r.allreduce->reduceOp, worldSize, inner) ||
             InBandCheck::compact(*r.tensors, r.allreduce->reduceOp, worldSize) ||
             InBandCheck::keyedPick(*r.tensors, r.allreduce->reduceOp, worldSize, inner).has_value() ||
             InBandCheck::ringCarry(*r.tensors, r.allreduce->reduceOp, worldSize, inner).has_value() ||
             InBandCheck::words(*r.tensors, r.allreduce->reduceOp, worldSize) > 0;
    case InBandRequest::Kind::AllGather:
      return InBandCheck::carriesAllGather(*r.output, *r.input, worldSize);
    case InBandRequest::Kind::ReduceScatter:
      return InBandCheck::ringScatter(*r.output, *r.input, r.reduceScatter->reduceOp, worldSize, inner).has_value() ||
             InBandCheck::carriesReduceScatter(*r.output, *r.input, r.reduceScatter->reduceOp, worldSize);
  }
  return false;
}

c10::intrusive_ptr<c10d::Work> InBandCheck::issue(const InBandRequest& r, c10d::Backend& inner, uint64_t rolling,
                                                  int worldSize, Verdict verdict, const Reading& reading) {
  switch (r.kind) {
    case InBandRequest::Kind::AllReduce:
      return InBandCheck::allreduce(inner, *r.tensors, *r.allreduce, rolling, worldSize, std::move(verdict), reading);
    case InBandRequest::Kind::AllGather:
      return InBandCheck::allgather(inner, *r.output, *r.input, *r.allgather, rolling, worldSize, std::move(verdict));
    case InBandRequest::Kind::ReduceScatter:
      return InBandCheck::reduceScatter(inner, *r.output, *r.input, *r.reduceScatter, rolling, worldSize,
                                        std::move(verdict));
  }
  return {};
}

}  // namespace torch_ext
