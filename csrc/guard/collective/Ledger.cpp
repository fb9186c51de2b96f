#include "guard/collective/Ledger.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace torch_ext {

int64_t wallNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Ledger::Ledger(size_t capacity) : ring_(capacity), rollingRing_(capacity) {
  if (capacity == 0) throw std::invalid_argument("Ledger capacity must be positive");
}

Entry* Ledger::slot(uint64_t id) {
  if (id == 0 || id >= nextId_) return nullptr;
  Entry& e = ring_[id % ring_.size()];
  return e.id == id ? &e : nullptr;
}

uint64_t Ledger::record(Fingerprint&& fp, uint32_t callSite, uint64_t* seq, uint64_t* ordinal, uint64_t* rolling) {
  const int64_t now = wallNs();
  const int64_t nowSteady = steadyNs();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = nextId_++;
  Entry& e = ring_[id % ring_.size()];
  e.id = id;
  e.callSite = callSite;
  e.startNs = now;
  e.endNs = 0;
  e.startSteadyNs = nowSteady;
  e.state = EntryState::Scheduled;
  e.error.clear();
  if (isP2P(fp.op)) {
    e.seq = 0;
    int dir = fp.op == Op::Send ? 0 : 1;
    int32_t peer = fp.op == Op::RecvAnySource ? -1 : fp.root;
    e.p2pOrdinal = ++p2pCounts_[std::make_tuple(peer, fp.tag, dir)];
    e.rolling = rolling_;
  } else {
    e.seq = ++seq_;
    e.p2pOrdinal = 0;
    rolling_ = detail::combine(rolling_, fp.hash);
    e.rolling = rolling_;
    rollingRing_[e.seq % rollingRing_.size()] = {e.seq, rolling_};
  }
  e.fp = std::move(fp);
  if (seq) *seq = e.seq;
  if (ordinal) *ordinal = e.p2pOrdinal;
  if (rolling) *rolling = e.rolling;
  // A record that fell out of the ring can no longer be pending for us.
  if (minPendingId_ + ring_.size() <= id) minPendingId_ = id + 1 - ring_.size();
  return id;
}

c10::intrusive_ptr<c10::ivalue::Future> Ledger::complete(uint64_t id, bool ok, const std::string& error) {
  const int64_t now = wallNs();
  std::lock_guard<std::mutex> lock(mu_);
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  if (!futures_.empty()) {
    auto it = futures_.find(id);
    if (it != futures_.end()) {
      fut = std::move(it->second);
      futures_.erase(it);
    }
  }
  Entry* e = slot(id);
  if (e == nullptr || e->state != EntryState::Scheduled) return fut;
  e->state = ok ? EntryState::Completed : EntryState::Failed;
  e->endNs = now;
  if (!ok) e->error = error;
  if (e->seq > lastCompletedSeq_) lastCompletedSeq_ = e->seq;
  lastCompletedNs_ = now;
  return fut;
}

bool Ledger::track(uint64_t id, c10::intrusive_ptr<c10::ivalue::Future> future) {
  std::lock_guard<std::mutex> lock(mu_);
  // A record no longer in the ring is taken as pending: complete() and
  // failPending() find tracked futures whatever the ring holds.
  const Entry* e = slot(id);
  if (e != nullptr && e->state != EntryState::Scheduled) return false;
  futures_.emplace(id, std::move(future));
  return true;
}

void Ledger::failPending(const std::string& error, std::vector<c10::intrusive_ptr<c10::ivalue::Future>>* futures,
                         std::vector<c10::intrusive_ptr<c10d::Work>>* works) {
  const int64_t now = wallNs();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& kv : futures_) futures->push_back(std::move(kv.second));
  futures_.clear();
  for (auto& p : polled_) works->push_back(p.second);
  for (uint64_t id = minPendingId_; id < nextId_; ++id) {
    Entry* e = slot(id);
    if (e == nullptr || e->state != EntryState::Scheduled) continue;
    e->state = EntryState::Failed;
    e->endNs = now;
    e->error = error;
  }
}

void Ledger::pollLater(uint64_t id, c10::intrusive_ptr<c10d::Work> work) {
  std::lock_guard<std::mutex> lock(mu_);
  polled_.emplace_back(id, std::move(work));
}

void Ledger::forgetPolled(uint64_t id) {
  c10::intrusive_ptr<c10d::Work> dropped;  // released outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  // Newest first: the caller has just waited for a recent one.
  for (auto it = polled_.rbegin(); it != polled_.rend(); ++it) {
    if (it->first == id) {
      dropped = std::move(it->second);
      polled_.erase(std::next(it).base());
      break;
    }
  }
}

void Ledger::pollCompletions() {
  std::vector<std::pair<uint64_t, c10::intrusive_ptr<c10d::Work>>> polled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (polled_.empty()) return;
    polled.swap(polled_);
  }
  std::vector<std::pair<uint64_t, c10::intrusive_ptr<c10d::Work>>> still;
  for (auto& [id, work] : polled) {
    bool done = false;
    bool ok = true;
    std::string err;
    try {
      done = work->isCompleted();
      if (done) ok = work->isSuccess();
      if (done && !ok) {
        if (auto ep = work->exception()) {
          try {
            std::rethrow_exception(ep);
          } catch (const std::exception& inner) {
            err = inner.what();
          } catch (...) {
            err = "unknown error";
          }
        }
      }
    } catch (const std::exception& ex) {
      done = true;
      ok = false;
      err = ex.what();
    }
    if (done) {
      complete(id, ok, err);
    } else {
      still.emplace_back(id, std::move(work));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : still) polled_.push_back(std::move(p));
}

Progress Ledger::progress() {
  std::lock_guard<std::mutex> lock(mu_);
  Progress p;
  p.lastSeq = seq_;
  p.rolling = rolling_;
  p.lastCompletedSeq = lastCompletedSeq_;
  p.lastCompletedNs = lastCompletedNs_;
  p.lastId = nextId_ - 1;
  // Advance the watermark over finished records; amortised O(1) per record.
  while (minPendingId_ < nextId_) {
    Entry* e = slot(minPendingId_);
    if (e != nullptr && e->state == EntryState::Scheduled) {
      p.hasPending = true;
      p.oldestPending = *e;
      break;
    }
    ++minPendingId_;
  }
  return p;
}

std::optional<Entry> Ledger::bySeq(uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& e : ring_) {
    if (e.id != 0 && e.seq == seq) return e;
  }
  return std::nullopt;
}

std::optional<uint64_t> Ledger::rollingAt(uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (seq == 0) return uint64_t{0};
  const auto& r = rollingRing_[seq % rollingRing_.size()];
  if (r.first != seq) return std::nullopt;
  return r.second;
}

std::vector<Entry> Ledger::entries(size_t maxEntries) const {
  return entriesAfter(0, maxEntries);
}

std::vector<Entry> Ledger::entriesAfter(uint64_t afterId, size_t maxEntries) const {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t last = nextId_ - 1;
  const uint64_t keep = std::min<uint64_t>({maxEntries, ring_.size(), last});
  uint64_t first = std::max<uint64_t>(afterId + 1, last - keep + 1);
  std::vector<Entry> out;
  if (first > last) return out;
  out.reserve(last - first + 1);
  for (uint64_t id = first; id <= last; ++id) {
    const Entry& e = ring_[id % ring_.size()];
    if (e.id == id) out.push_back(e);
  }
  return out;
}

} // namespace torch_ext
