#include "guard/modes/verify/RingCarry.h"

#include <algorithm>
#include <cstring>

namespace torch_ext {

namespace {

bool pairsFor(const c10d::ReduceOp& op) {
  return op == c10d::ReduceOp::MAX || op == c10d::ReduceOp::MIN;
}

// gloo/allreduce.h: kMaxSegmentSize. Above it the ring cuts more segments
// than 2W, which RingCarry does not model (InBandCheck's bounds stay far below).
constexpr int64_t kGlooMaxSegmentBytes = 1024 * 1024;

int64_t bytesPerElement(at::ScalarType t) {
  return (t == at::kFloat || t == at::kInt) ? 4 : 8;
}

int ceilLog2(int w) {
  int l = 0;
  while ((int64_t{1} << l) < w) ++l;
  return l;
}

uint64_t rotl(uint64_t x, int s) {
  s &= 63;
  return s == 0 ? x : (x << s) | (x >> (64 - s));
}

// The user's elements in chunk `j` of plain gloo's layout.
int64_t usersIn(int64_t j, int64_t n, int64_t userChunk) {
  return std::clamp<int64_t>(n - j * userChunk, 0, userChunk);
}

}  // namespace

int64_t RingCarry::segment(int64_t length, int worldSize) {
  // gloo/allreduce.cc: 2W segments (up to its 1 MiB segment bound, far above
  // InBandCheck::kMaxBytes), each ceil(bytes / 2W) rounded up to the element.
  const int64_t segments = 2 * static_cast<int64_t>(worldSize);
  return (length + segments - 1) / segments;
}

int RingCarry::bitsPerWord() const {
  if (pairs_) {
    // One finite, normal value of the type, below 2^53 (exact as a double).
    switch (type_) {
      case at::kFloat:
        return 29;
      case at::kDouble:
        return 61;
      case at::kInt:
        return 30;
      default:
        return 52;
    }
  }
  // W words below 2^exact add up exactly in any order.
  int exact = 53;
  if (type_ == at::kFloat) exact = 24;
  if (type_ == at::kInt) exact = 31;
  return exact - ceilLog2(worldSize_) - 1;
}

std::optional<RingCarry> RingCarry::plan(int64_t n, at::ScalarType dtype, const c10d::ReduceOp& op, int worldSize) {
  const bool floating = dtype == at::kFloat || dtype == at::kDouble;
  if (n < 1 || worldSize < 2 || worldSize > (1 << 16) || !(floating || dtype == at::kInt || dtype == at::kLong)) {
    return std::nullopt;
  }
  // AVG: gloo sums, then divides every element by W (floating types only).
  const bool avg = op == c10d::ReduceOp::AVG && floating;
  if (op != c10d::ReduceOp::SUM && !avg && !pairsFor(op)) return std::nullopt;
  RingCarry c;
  c.n_ = n;
  c.type_ = dtype;
  c.pairs_ = pairsFor(op);
  c.avg_ = avg;
  c.worldSize_ = worldSize;
  const int per = c.bitsPerWord();
  if (per < 1) return std::nullopt;
  const int64_t step = c.pairs_ ? 2 : 1;
  const int64_t want = step * ((kWantBits + per - 1) / per);
  const int64_t need = step * ((kMinBits + per - 1) / per);
  const int64_t m = segment(n, worldSize);
  if ((m + 1) * bytesPerElement(dtype) > kGlooMaxSegmentBytes) return std::nullopt;
  c.userChunk_ = c.chunk_ = 2 * m;
  const int64_t used = (n + c.userChunk_ - 1) / c.userChunk_;  // chunks holding data
  const int64_t room = used * c.userChunk_ - n;
  if (room >= need) return c.appended(room, want, step, m);
  // Too little room in the last chunk: grown segments over the chunks in use
  // where gloo then cuts no more of them (a chunk more costs the most:
  // RingCarry.h); else the words in one chunk more, in its first segment where
  // they fit (each segment holding data costs the ring a step); else, every
  // chunk holding data, grown segments over all of them.
  if (std::optional<RingCarry> g = c.grown(used, want, need, step, m)) return g;
  if (used == worldSize) return std::nullopt;  // that was every chunk
  if ((room + m) / step * step >= need) return c.appended(room + m, want, step, m);
  if (room + c.userChunk_ >= need) return c.appended(room + c.userChunk_, want, step, m);
  return c.grown(worldSize, want, need, step, m);
}

std::optional<RingCarry> RingCarry::appended(int64_t room, int64_t want, int64_t step, int64_t m) const {
  // In the free places behind the user's last element: every chunk stays as it is.
  RingCarry c = *this;
  const int64_t k = std::min(want, room) / step * step;
  for (int64_t i = 0; i < k; ++i) c.wordAt_.push_back(n_ + i);
  c.length_ = n_ + k;
  if (segment(c.length_, worldSize_) != m) return std::nullopt;  // the segments stay gloo's
  return c;
}

std::optional<RingCarry> RingCarry::grown(int64_t chunks, int64_t want, int64_t need, int64_t step, int64_t m) const {
  // One element more per segment, the user's elements of chunk j at the front
  // of the new chunk j: the same chunks hold them, a few bytes longer.
  RingCarry c = *this;
  c.chunk_ = c.userChunk_ + 2;
  c.length_ = chunks * c.chunk_;
  if (segment(c.length_, worldSize_) != m + 1) return std::nullopt;  // gloo would cut other chunks
  for (int64_t j = 0; j < chunks && static_cast<int64_t>(c.wordAt_.size()) < want; ++j) {
    for (int64_t p = usersIn(j, n_, c.userChunk_); p < c.chunk_; ++p) c.wordAt_.push_back(j * c.chunk_ + p);
  }
  const int64_t k = std::min<int64_t>(want, static_cast<int64_t>(c.wordAt_.size())) / step * step;
  c.wordAt_.resize(k);
  if (k < need) return std::nullopt;
  return c;
}

int RingCarry::bits() const {
  const int64_t values = static_cast<int64_t>(wordAt_.size()) / (pairs_ ? 2 : 1);
  return static_cast<int>(std::min<int64_t>(64, values * bitsPerWord()));
}

std::vector<double> RingCarry::words(uint64_t rolling) const {
  const int per = bitsPerWord();
  std::vector<double> w;
  w.reserve(wordAt_.size());
  for (size_t i = 0; w.size() < wordAt_.size(); ++i) {
    const uint64_t x = rotl(rolling, static_cast<int>(i) * per) >> (64 - per);
    if (!pairs_) {
      w.push_back(static_cast<double>((uint64_t{1} << per) | x));  // below 2^53: exact
      continue;
    }
    double v = 0;
    if (type_ == at::kFloat) {
      const uint32_t b = 0x20000000u | static_cast<uint32_t>(x);  // exponent 64..127: normal, finite
      float f = 0;
      std::memcpy(&f, &b, sizeof f);
      v = f;
    } else if (type_ == at::kDouble) {
      const uint64_t b = (uint64_t{1} << 61) | x;  // exponent 512..1023
      std::memcpy(&v, &b, sizeof v);
    } else {
      v = static_cast<double>((uint64_t{1} << per) | x);  // positive, below the type's max and 2^53
    }
    w.push_back(v);
    w.push_back(-v);
  }
  return w;
}

bool RingCarry::agree(const std::vector<double>& reduced, uint64_t rolling) const {
  const std::vector<double> mine = words(rolling);
  if (reduced.size() != mine.size()) return false;
  for (size_t i = 0; i < mine.size(); ++i) {
    // Exact: below 2^53. Under AVG, W times the word divided by W is the word
    // exactly; a sum that differs by d divides to at least 2^-ceil(log2 W)
    // away from it, a whole unit in its last place (W words fit the mantissa).
    const double expected = (pairs_ || avg_) ? mine[i] : mine[i] * worldSize_;
    if (reduced[i] != expected) return false;
  }
  return true;
}

void RingCarry::pack(const at::Tensor& user, const at::Tensor& carried, uint64_t rolling) const {
  const std::vector<double> w = words(rolling);
  forCarriedType(carried, [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    const auto* u = static_cast<const T*>(user.data_ptr());
    // Chunk by chunk: the user's elements, then zeros to the chunk's end (only
    // the places the words do not fill: no pass over the data twice; FSDP2's
    // reduce_scatter inputs are megabytes).
    for (int64_t j = 0; j * chunk_ < length_; ++j) {
      const int64_t users = usersIn(j, n_, userChunk_);
      T* chunk = p + j * chunk_;
      std::memcpy(chunk, u + j * userChunk_, users * sizeof(T));
      std::fill(chunk + users, p + std::min(length_, (j + 1) * chunk_), T(0));
    }
    for (size_t i = 0; i < w.size(); ++i) p[wordAt_[i]] = static_cast<T>(w[i]);
  });
}

std::vector<double> RingCarry::unpack(const at::Tensor& carried, const at::Tensor& out, int64_t from) const {
  std::vector<double> reduced(wordAt_.size());
  const int64_t end = std::min(n_, from + out.numel());
  forCarriedType(carried, [&](auto* p) {
    using T = std::remove_pointer_t<decltype(p)>;
    auto* u = static_cast<T*>(out.data_ptr());
    for (int64_t e = from; e < end;) {  // a run of elements inside one chunk at a time
      const int64_t run = std::min(end - e, userChunk_ - e % userChunk_);
      std::memcpy(u + (e - from), p + at(e), run * sizeof(T));
      e += run;
    }
    for (size_t i = 0; i < wordAt_.size(); ++i) reduced[i] = static_cast<double>(p[wordAt_[i]]);
  });
  return reduced;
}

}  // namespace torch_ext
