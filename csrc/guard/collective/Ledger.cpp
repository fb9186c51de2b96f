#include "guard/collective/Ledger.h"

#include "guard/Clock.h"

#include "guard/collective/StreamOrdered.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace torch_ext {

Ledger::Ledger(size_t capacity) : ring_(capacity), rollingRing_(capacity) {
  if (capacity == 0) throw std::invalid_argument("Ledger capacity must be positive");
}

Entry* Ledger::slot(uint64_t id) {
  if (id == 0 || id >= nextId_) return nullptr;
  Entry& e = ring_[id % ring_.size()];
  return e.id == id ? &e : nullptr;
}

uint64_t Ledger::record(Fingerprint&& fp, uint32_t callSite, uint64_t* seq, uint64_t* ordinal, uint64_t* rolling,
                        uint32_t label) {
  const int64_t now = wallNs();
  const int64_t nowSteady = steadyNs();
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = nextId_++;
  Entry& e = ring_[id % ring_.size()];
  if (e.id != 0 && e.state == EntryState::Scheduled && evicted_.size() < kMaxEvicted && stillPending(e, now)) {
    evicted_.emplace(e.id, e);  // a pending record is about to be overwritten
  }
  e.id = id;
  e.callSite = callSite;
  e.label = label;
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

bool Ledger::stillPending(Entry& e, int64_t now) {
  // Polled works complete in the ledger only at the watchdog's next poll: a
  // host far ahead overwrites records whose work is done already. Ask the work
  // now (polled_ is in record order), so that what is kept is really pending.
  auto it =
      std::lower_bound(polled_.begin(), polled_.end(), e.id, [](const Polled& p, uint64_t id) { return p.id < id; });
  if (it == polled_.end() || it->id != e.id) return true;
  bool done = false, ok = true;
  std::string err;
  try {
    done = it->work->isCompleted();
    // exception(), not isSuccess(): WorkNCCL::isSuccess() throws "deprecated".
    ok = !done || !it->work->exception();
    if (done && !ok) err = "the operation failed";
  } catch (const std::exception& ex) {
    done = true;
    ok = false;
    err = ex.what();
  }
  if (!done) return true;
  e.state = ok ? EntryState::Completed : EntryState::Failed;
  e.endNs = now;
  if (!ok) e.error = err;
  if (e.seq > lastCompletedSeq_) lastCompletedSeq_ = e.seq;
  if (!ok && it->reportFailure && polledFailures_.size() < kMaxPolledFailures) polledFailures_.emplace_back(e.id, err);
  polled_.erase(it);
  return false;
}

c10::intrusive_ptr<c10::ivalue::Future> Ledger::complete(uint64_t id, bool ok, const std::string& error, bool timed,
                                                         int64_t streamNs) {
  const int64_t now = wallNs();
  timed = timed && timeWaits_;
  const bool streamTimed = !timed && streamNs >= 0 && timeWaits_;
  const int64_t nowSteady = timed || streamTimed ? steadyNs() : 0;
  // The wait of a finished entry, on this rank's clock.
  auto timeWait = [&](const Entry& e) {
    if (timed) {
      waits_.add(e.seq, e.startSteadyNs, nowSteady, e.callSite);
    } else if (streamTimed && e.seq > 0) {
      const int64_t end = std::max(nowSteady, streamCursorNs_ + streamNs);
      streamCursorNs_ = end;
      waits_.add(e.seq, end - streamNs, end, e.callSite);
    }
  };
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
  if (e == nullptr && !evicted_.empty()) {
    auto it = evicted_.find(id);
    if (it != evicted_.end()) {
      if (it->second.state != EntryState::Scheduled) return fut;
      if (it->second.seq > lastCompletedSeq_) lastCompletedSeq_ = it->second.seq;
      lastCompletedNs_ = now;
      if (ok) {
        timeWait(it->second);
        evicted_.erase(it);  // done: no longer kept outside the ring
      } else {
        // Kept, failed, for the failure's report (byId).
        it->second.state = EntryState::Failed;
        it->second.endNs = now;
        it->second.error = error;
      }
      return fut;
    }
  }
  if (e == nullptr || e->state != EntryState::Scheduled) return fut;
  e->state = ok ? EntryState::Completed : EntryState::Failed;
  e->endNs = now;
  if (!ok) e->error = error;
  if (ok) timeWait(*e);
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
  for (auto& p : polled_) works->push_back(p.work);
  for (auto& kv : evicted_) {
    kv.second.state = EntryState::Failed;
    kv.second.endNs = now;
    kv.second.error = error;
  }
  for (uint64_t id = minPendingId_; id < nextId_; ++id) {
    Entry* e = slot(id);
    if (e == nullptr || e->state != EntryState::Scheduled) continue;
    e->state = EntryState::Failed;
    e->endNs = now;
    e->error = error;
  }
}

void Ledger::pollLater(uint64_t id, c10::intrusive_ptr<c10d::Work> work, bool reportFailure) {
  bool full = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    polled_.push_back({id, std::move(work), reportFailure});
    // Every kMaxPolled/4 works past the bound (amortised: a stream stuck with
    // thousands queued is not rescanned at every issue).
    full = polled_.size() >= kMaxPolled && polled_.size() % (kMaxPolled / 4) == 0;
  }
  // A host far ahead of its stream: completions are not left for the next tick.
  if (full) pollCompletions();
}

std::optional<bool> Ledger::streamStarted(uint64_t id) const {
  c10::intrusive_ptr<c10d::Work> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it =
        std::lower_bound(polled_.begin(), polled_.end(), id, [](const Polled& p, uint64_t v) { return p.id < v; });
    if (it == polled_.end() || it->id != id) return std::nullopt;
    work = it->work;
  }
  const auto* aware = dynamic_cast<const StreamStartAware*>(work.get());
  if (aware == nullptr) return std::nullopt;
  return aware->streamStarted();
}

void Ledger::forgetPolled(uint64_t id) {
  c10::intrusive_ptr<c10d::Work> dropped;  // released outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  // Newest first: the caller has just waited for a recent one.
  for (auto it = polled_.rbegin(); it != polled_.rend(); ++it) {
    if (it->id == id) {
      dropped = std::move(it->work);
      polled_.erase(std::next(it).base());
      break;
    }
  }
}

void Ledger::pollCompletions() {
  // Polled outside the lock, on copies: polled_ stays in place meanwhile, so
  // that record() can still ask an overwritten record's work (stillPending).
  std::vector<Polled> polled;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (polled_.empty()) return;
    polled = polled_;
  }
  std::vector<uint64_t> done;
  std::vector<std::pair<uint64_t, std::string>> failures;
  for (auto& p : polled) {
    bool finished = false;
    bool ok = true;
    std::string err;
    try {
      finished = p.work->isCompleted();
      if (finished) ok = !p.work->exception();
      if (finished && !ok) {
        err = "the operation failed";
        if (auto ep = p.work->exception()) {
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
      finished = true;
      ok = false;
      err = ex.what();
    }
    if (!finished) continue;
    int64_t streamNs = -1;
    if (ok && timeWaits_) {
      try {
        streamNs = static_cast<int64_t>(static_cast<double>(p.work->getDuration()) * 1e6);
      } catch (const std::exception&) {
        // No stream timing (NCCL without TORCH_NCCL_ENABLE_TIMING=1, gloo's send/recv): not timed.
      }
    }
    complete(p.id, ok, err, /*timed=*/false, streamNs);
    done.push_back(p.id);
    if (!ok && p.reportFailure) failures.emplace_back(p.id, err);
  }
  std::vector<Polled> dropped;  // released outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (!done.empty()) {
    std::sort(done.begin(), done.end());
    std::vector<Polled> still;
    still.reserve(polled_.size());
    for (auto& p : polled_) {
      (std::binary_search(done.begin(), done.end(), p.id) ? dropped : still).push_back(std::move(p));
    }
    polled_.swap(still);
  }
  for (auto& f : failures) {
    if (polledFailures_.size() < kMaxPolledFailures) polledFailures_.push_back(std::move(f));
  }
}

std::vector<std::pair<uint64_t, std::string>> Ledger::takePolledFailures() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uint64_t, std::string>> out;
  out.swap(polledFailures_);
  return out;
}

std::vector<WaitWindow> Ledger::waitWindows(size_t perLevel) const {
  std::lock_guard<std::mutex> lock(mu_);
  return waits_.closed(perLevel);
}

Progress Ledger::progress() {
  std::lock_guard<std::mutex> lock(mu_);
  Progress p;
  p.lastSeq = seq_;
  p.rolling = rolling_;
  p.lastCompletedSeq = lastCompletedSeq_;
  p.lastCompletedNs = lastCompletedNs_;
  p.lastId = nextId_ - 1;
  for (const auto& kv : evicted_) {
    if (kv.second.state != EntryState::Scheduled) continue;  // failed with the group
    p.hasPending = true;
    p.oldestPending = kv.second;
    return p;
  }
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

std::optional<Entry> Ledger::byId(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = evicted_.find(id); it != evicted_.end()) return it->second;
  if (id == 0 || id >= nextId_) return std::nullopt;
  const Entry& e = ring_[id % ring_.size()];
  if (e.id == id) return e;
  return std::nullopt;
}

std::optional<Entry> Ledger::bySeq(uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& kv : evicted_) {
    if (seq != 0 && kv.second.seq == seq) return kv.second;
  }
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
  // The oldest pending record goes first when the ring overwrote it: every
  // report and dump names what the stream is stuck in.
  for (const auto& kv : evicted_) {
    if (maxEntries == 0) break;
    if (kv.first <= afterId || kv.first >= first || kv.second.state != EntryState::Scheduled) continue;
    out.push_back(kv.second);
    break;
  }
  if (first > last) return out;
  out.reserve(out.size() + last - first + 1);
  for (uint64_t id = first; id <= last; ++id) {
    const Entry& e = ring_[id % ring_.size()];
    if (e.id == id) out.push_back(e);
  }
  return out;
}

}  // namespace torch_ext
