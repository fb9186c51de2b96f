#include "guard/modes/verify/Verifier.h"

#include "guard/collective/WorkRetirement.h"

#include "guard/Clock.h"
#include "guard/Errands.h"
#include "guard/Errors.h"
#include "guard/Runtime.h"
#include "guard/collective/CallSite.h"
#include "guard/collective/LabelTable.h"
#include "guard/collective/IssuedWords.h"
#include "guard/report/OpWords.h"
#include "guard/report/History.h"
#include "guard/report/Messages.h"
#include "guard/report/Incident.h"
#include "guard/report/Report.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>

namespace torch_ext {

namespace {

// Collectives whose hashes the slow path compares one by one to find the
// first that differs (the oldest unverified ones).
constexpr uint64_t kMaxScan = 4096;
// Each rank's round values cover its last kWindow collectives, so ranks that
// are up to kWindow - 1 collectives apart (DDP's buckets, issued as backward
// reaches them) agree in one gather instead of two.
constexpr uint64_t kWindow = 4;
// A round row: [target, verified, (rolling, send, recv) x kWindow].
constexpr size_t kRow = 2 + 3 * kWindow;
// Bytes of each rank's description of the differing collective.
constexpr size_t kTextBytes = 2048;

std::vector<int64_t> packText(const std::string& text) {
  std::vector<int64_t> words(kTextBytes / sizeof(int64_t), 0);
  std::memcpy(words.data(), text.data(), std::min(text.size(), kTextBytes - 1));
  return words;
}

std::string unpackText(const int64_t* words) {
  const char* bytes = reinterpret_cast<const char*>(words);
  return std::string(bytes, strnlen(bytes, kTextBytes));
}

// This rank's collectives up to `seq` (as far back as its ledger holds, at most
// kHistoryItems), folded into runs from one call site: how it got to `seq`.
std::vector<HistoryRun> localHistory(Ledger& ledger, uint64_t seq) {
  constexpr uint64_t kHistoryItems = 4096;
  std::vector<HistoryItem> items;
  std::unordered_map<uint32_t, std::string> sites;  // call-site id -> its text, each formatted once
  // A rank that has not issued `seq` yet: how it got to where it is.
  const uint64_t upTo = std::min(seq, ledger.progress().lastSeq);
  for (uint64_t s = upTo; s >= 1 && upTo - s < kHistoryItems; --s) {
    auto e = ledger.bySeq(s);
    if (!e) break;
    auto site = sites.find(e->callSite);
    if (site == sites.end()) site = sites.emplace(e->callSite, CallSites::instance().describePath(e->callSite)).first;
    items.push_back(HistoryItem{s, opName(e->fp.op), site->second});
  }
  std::reverse(items.begin(), items.end());
  return historyRuns(items, kHistoryRuns);
}

}  // namespace

Verifier::Verifier(const std::shared_ptr<GroupState>& state, c10::intrusive_ptr<c10d::Backend> helper, NowNs nowNs)
    : state_(state),
      helper_(std::move(helper)),
      rank_(state->id().rank),
      size_(state->id().size),
      nowNs_(nowNs ? std::move(nowNs) : NowNs(&steadyNs)) {
  pacer_ = std::thread([this] { pacerLoop(); });
}

Verifier::~Verifier() {
  // Still held (never stopped, or a round was in flight at stop()): this may
  // run on one of the helper's own worker threads (a round's callback held the
  // last reference), where the helper's destructor would join the thread it
  // runs on; it is freed by a later sweep instead (WorkRetirement::keep).
  c10::intrusive_ptr<c10d::Backend> helper;
  {
    std::lock_guard<std::mutex> lock(mu_);
    helper = std::move(helper_);
  }
  stop();
  WorkRetirement::instance().keep(std::move(helper));
}

void Verifier::issued(uint64_t seq, uint64_t rolling, uint64_t hash, uint64_t splitSend, uint64_t splitRecv,
                      bool inBand) {
  bool start = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_[seq] = Issued{rolling, hash, splitSend, splitRecv};
    if (inBand) {
      lastCarried_.store(std::max(lastCarried_.load(std::memory_order_relaxed), seq), std::memory_order_relaxed);
      // Its verdict comes with its data (inBandVerdict): no round for it. A
      // round is started only where every rank starts one: from a verdict
      // that does not agree (every rank reads the same words), or for the
      // next collective that does not carry its check. One that never
      // completes (its peers are in another collective, which gloo cannot
      // pair) is found by the status ring (Watchdog::exchange).
      return;
    }
    lastUncarried_ = std::max(lastUncarried_, seq);
    switch (pacing_.issued(nowNs_())) {
      case BurstPacing::OnIssue::StartRound:
        // Started at issue, not only at completion: a mismatch can leave the
        // inner collective pending for good, and its verdict must still come.
      case BurstPacing::OnIssue::EndOfBurst:  // the predicted end of the burst
        wantedSeq_ = std::max(wantedSeq_, seq);
        start = true;
        break;
      case BurstPacing::OnIssue::WaitForBurst:
        start = wantedSeq_ > verifiedSeq_.load(std::memory_order_relaxed);
        if (pacerIdle_) pacerCv_.notify_one();  // it starts the round if the burst goes quiet first
        break;
    }
  }
  if (start) maybeStartRound();
}

std::vector<uint32_t> Verifier::exchange(uint32_t mine, uint64_t seq) {
  c10::intrusive_ptr<c10d::Backend> helper;
  {
    std::lock_guard<std::mutex> lock(mu_);
    helper = helper_;
  }
  auto st = state_.lock();
  TORCH_CHECK(helper && st, "torch_ext: collective #", seq, " could not be read: its group is shut down");
  const int me = helper->getRank();
  const int tag = kExchangeTags | static_cast<int>(seq & 0xFFFFFF);
  at::Tensor own = at::full({1}, static_cast<int64_t>(mine), at::kLong);
  at::Tensor from = at::empty({size_}, at::kLong);
  try {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (int p = 0; p < size_; ++p) {
      if (p == me) continue;
      std::vector<at::Tensor> out{own};
      works.push_back(helper->send(out, p, tag));
      std::vector<at::Tensor> in{from.narrow(0, p, 1)};
      works.push_back(helper->recv(in, p, tag));
    }
    for (auto& w : works) w->wait(kExchangeWithin);
  } catch (const std::exception& e) {
    if (st->failed()) st->throwFailure("all_reduce");  // a peer gone: the group's report says so
    TORCH_CHECK(false, "torch_ext: collective #", seq, " (a one-element MAX/MIN) on group \"", st->label(),
                "\": every rank's element, exchanged to read its result, did not come: ", e.what());
  }
  std::vector<uint32_t> all(size_);
  const int64_t* p = from.data_ptr<int64_t>();
  for (int r = 0; r < size_; ++r) all[r] = r == me ? mine : static_cast<uint32_t>(p[r]);
  return all;
}

void Verifier::inBandVerdict(uint64_t seq, bool agree) {
  if (!agree) {
    want(seq);  // every rank read the same words: the rounds decide, and report a difference
    return;
  }
  uint64_t upTo = seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // All-to-all pairing sums are compared by rounds only: the agreement
    // verifies up to the first uneven all_to_all, and past it once a round has
    // verified that far (verifiedUpTo). Not a round of its own: whether a rank
    // still holds that all_to_all unverified may differ between ranks.
    for (auto it = pending_.upper_bound(verifiedSeq_.load(std::memory_order_relaxed));
         it != pending_.end() && it->first <= seq; ++it) {
      if (it->second.splitSend != 0 || it->second.splitRecv != 0) {
        upTo = it->first - 1;
        agreedPastSplit_ = std::max(agreedPastSplit_, seq);
        break;
      }
    }
  }
  inBandVerified_.fetch_add(1, std::memory_order_relaxed);
  verifiedUpTo(upTo, /*fromRound=*/false, seq);
}

void Verifier::kick() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pacing_.predicting() || pending_.empty()) return;
    if (lastUncarried_ <= verifiedSeq_.load(std::memory_order_relaxed)) return;  // carried: verdicts on their way
    wantedSeq_ = std::max(wantedSeq_, pending_.rbegin()->first);
  }
  maybeStartRound();
}

void Verifier::want(uint64_t seq) {
  if (verified(seq)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A program that waits inside its bursts (FSDP2 waits for each layer's
    // all_gather) needs each round early, at issue: no prediction for it.
    pacing_.demanded();
    if (wantedSeq_ >= seq && inFlight_) return;  // the round in flight or the next one covers it
    wantedSeq_ = std::max(wantedSeq_, seq);
  }
  maybeStartRound();
}

void Verifier::pacerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopped_) {
    const uint64_t last = pending_.empty() ? 0 : pending_.rbegin()->first;
    const uint64_t done = std::max(wantedSeq_, verifiedSeq_.load(std::memory_order_relaxed));
    if (!pacing_.predicting() || last <= done || blockedFrom_ != 0) {
      pacerIdle_ = true;
      pacerCv_.wait(lock);
      pacerIdle_ = false;
      continue;
    }
    const int64_t quietIn = pacing_.quietAtNs() - nowNs_();
    if (quietIn > 0) {
      pacerCv_.wait_for(lock, std::chrono::nanoseconds(quietIn));
      continue;
    }
    // The burst went quiet before its predicted end: check what it issued
    // now, and learn the bursts anew (three of one length in a row).
    pacing_.mispredicted();
    wantedSeq_ = last;
    lock.unlock();
    maybeStartRound();
    lock.lock();
  }
}

bool Verifier::blocked(uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  return blockedFrom_ != 0 && seq >= blockedFrom_;
}

uint64_t Verifier::contiguousTarget() const {
  uint64_t target = verifiedSeq_.load(std::memory_order_relaxed);
  for (auto it = pending_.upper_bound(target); it != pending_.end() && it->first == target + 1; ++it) {
    target = it->first;
  }
  return target;
}

std::vector<int64_t> Verifier::valuesAt(uint64_t seq) const {
  // [seq, verified, then (rolling, send, recv) at seq, seq-1, ..., seq-kWindow+1];
  // the entries at or below the verified collective stay 0 (never compared).
  std::vector<int64_t> out(kRow, 0);
  out[0] = static_cast<int64_t>(seq);
  out[1] = static_cast<int64_t>(verifiedSeq_.load(std::memory_order_relaxed));
  uint64_t send = baseSend_, recv = baseRecv_;
  for (const auto& [s, v] : pending_) {
    if (s > seq) break;
    send += v.splitSend;
    recv += v.splitRecv;
    if (seq - s < kWindow) {
      int64_t* slot = out.data() + 2 + 3 * (seq - s);
      slot[0] = static_cast<int64_t>(v.rolling);
      slot[1] = static_cast<int64_t>(send);
      slot[2] = static_cast<int64_t>(recv);
    }
  }
  return out;
}

void Verifier::maybeStartRound() {
  std::vector<int64_t> mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (inFlight_ || stopped_ || blockedFrom_ != 0) return;
    const uint64_t verified = verifiedSeq_.load(std::memory_order_relaxed);
    if (wantedSeq_ <= verified) return;
    const uint64_t target = contiguousTarget();
    if (target <= verified) return;
    inFlight_ = true;
    ++rounds_;
    mine = valuesAt(target);
  }
  auto self = shared_from_this();
  gather(std::move(mine), [self](const std::vector<int64_t>& all) { self->onRound(all, false); });
}

void Verifier::gather(std::vector<int64_t> mine, std::function<void(const std::vector<int64_t>&)> then) {
  const auto n = static_cast<int64_t>(mine.size());
  at::Tensor in = at::empty({n}, at::TensorOptions().dtype(at::kLong));
  std::memcpy(in.data_ptr<int64_t>(), mine.data(), mine.size() * sizeof(int64_t));
  at::Tensor out = at::empty({n * size_}, at::TensorOptions().dtype(at::kLong));
  c10::intrusive_ptr<c10d::Backend> helper;
  {
    std::lock_guard<std::mutex> lock(mu_);
    helper = helper_;
  }
  if (!helper) return;  // stopped: the group is shut down
  c10::intrusive_ptr<c10::ivalue::Future> fut;
  try {
    fut = helper->_allgather_base(out, in)->getFuture();
  } catch (const std::exception& e) {
    helperFailed(e.what());
    return;
  }
  auto self = shared_from_this();
  const int64_t started = nowNs_();
  fut->addCallback([self, in, out, started, then = std::move(then)](c10::ivalue::Future& f) {
    self->gatherMicros_.fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, self->nowNs_() - started) / 1000),
                                  std::memory_order_relaxed);
    if (f.hasError()) {
      self->helperFailed(f.tryRetrieveErrorMessage());
      return;
    }
    try {
      const int64_t* p = out.data_ptr<int64_t>();
      then(std::vector<int64_t>(p, p + out.numel()));
    } catch (const std::exception& e) {
      self->helperFailed(e.what());
    }
  });
}

void Verifier::onRound(const std::vector<int64_t>& all, bool second) {
  const size_t stride = kRow;
  uint64_t low = UINT64_MAX, high = 0, maxVerified = 0;
  for (int r = 0; r < size_; ++r) {
    const auto target = static_cast<uint64_t>(all[stride * r]);
    low = std::min(low, target);
    high = std::max(high, target);
    maxVerified = std::max(maxVerified, static_cast<uint64_t>(all[stride * r + 1]));
  }
  if (low <= maxVerified) {
    // Some rank verified past `low` already (an in-band verdict, which every
    // rank reads from the same reduced words, reaches them at different
    // moments): verified here too, and a rank's zeros there are not compared.
    verifiedUpTo(low, /*fromRound=*/true);
    return;
  }
  if (high - low >= kWindow) {
    if (second) {
      helperFailed("the ranks' second check gather named different collectives (a bug in torch_ext)");
      return;
    }
    // Some rank's values do not reach back to `low`, which every rank has
    // issued: gather everyone's values there.
    std::vector<int64_t> mine;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++rounds_;
      mine = valuesAt(low);
    }
    auto self = shared_from_this();
    gather(std::move(mine), [self](const std::vector<int64_t>& again) { self->onRound(again, true); });
    return;
  }
  // Every rank sent its values at `low` (each sends a window of its last
  // kWindow collectives): compare there.
  std::set<uint64_t> rollings;
  uint64_t send = 0, recv = 0;
  for (int r = 0; r < size_; ++r) {
    const int64_t* row = all.data() + stride * r;
    const int64_t* v = row + 2 + 3 * (static_cast<uint64_t>(row[0]) - low);
    rollings.insert(static_cast<uint64_t>(v[0]));
    send += static_cast<uint64_t>(v[1]);
    recv += static_cast<uint64_t>(v[2]);
  }
  if (rollings.size() == 1 && send == recv) {
    verifiedUpTo(low, /*fromRound=*/true);
  } else {
    differs(low, maxVerified + 1);
  }
}

void Verifier::verifiedUpTo(uint64_t seq, bool fromRound, uint64_t carried) {
  std::vector<Parked> ready;
  bool wake = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t before = verifiedSeq_.load(std::memory_order_relaxed);
    if (fromRound) inFlight_ = false;
    if (blockedFrom_ != 0 && seq >= blockedFrom_) seq = blockedFrom_ - 1;  // never past a difference
    if (seq > verifiedSeq_.load(std::memory_order_relaxed)) {
      for (auto it = pending_.begin(); it != pending_.end() && it->first <= seq;) {
        baseSend_ += it->second.splitSend;
        baseRecv_ += it->second.splitRecv;
        it = pending_.erase(it);
      }
      verifiedSeq_.store(seq, std::memory_order_release);
    }
    // An in-band agreement held back by an uneven all_to_all (inBandVerdict)
    // counts once the rounds have verified past every such all_to_all.
    if (agreedPastSplit_ > verifiedSeq_.load(std::memory_order_relaxed)) {
      uint64_t to = agreedPastSplit_;
      if (blockedFrom_ != 0 && to >= blockedFrom_) to = blockedFrom_ - 1;
      bool split = false;
      for (auto it = pending_.begin(); it != pending_.end() && it->first <= to; ++it) {
        split = split || it->second.splitSend != 0 || it->second.splitRecv != 0;
      }
      if (!split && to > verifiedSeq_.load(std::memory_order_relaxed)) {
        pending_.erase(pending_.begin(), pending_.upper_bound(to));
        verifiedSeq_.store(to, std::memory_order_release);
      }
    }
    // (A round behind an in-band verdict releases nothing new.)
    seq = verifiedSeq_.load(std::memory_order_relaxed);
    auto keep = std::partition(parked_.begin(), parked_.end(), [seq](const Parked& p) { return p.seq > seq; });
    ready.assign(std::make_move_iterator(keep), std::make_move_iterator(parked_.end()));
    parked_.erase(keep, parked_.end());
    // An in-band verdict that released its own collective and nothing else
    // wakes nobody: that collective's waiter is woken by its work's completion,
    // the next callback on the same future (GuardWork::settle). Woken here, it
    // would run into the ledger's and this verifier's locks while that
    // completion still holds them, and sleep a second time per collective.
    const bool onlyItself = carried != 0 && (seq <= before || (seq == carried && before + 1 == carried));
    wake = !onlyItself || !ready.empty();
  }
  for (auto& p : ready) p.release();
  if (auto st = state_.lock()) {
    if (device::StreamGate* gate = st->streamGate()) gate->release(seq);
    if (wake) st->notify();
  }
  maybeStartRound();
}

void Verifier::differs(uint64_t upTo, uint64_t from) {
  uint64_t last = 0;
  std::vector<int64_t> perSeq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // `from`: one past what any rank verified, the same on every rank (a rank
    // behind an in-band verdict still holds those collectives as pending).
    blockedFrom_ = from;
    inFlight_ = false;
    last = std::min(upTo, from + kMaxScan - 1);
    for (uint64_t s = from; s <= last; ++s) {
      const auto it = pending_.find(s);
      const Issued v = it == pending_.end() ? Issued{} : it->second;
      perSeq.push_back(static_cast<int64_t>(v.hash));
      perSeq.push_back(static_cast<int64_t>(v.splitSend));
      perSeq.push_back(static_cast<int64_t>(v.splitRecv));
    }
  }
  if (auto st = state_.lock()) st->notify();
  // Every rank found the same difference over the same range: find the first
  // collective that differs, together.
  auto self = shared_from_this();
  gather(std::move(perSeq),
         [self, from, last](const std::vector<int64_t>& all) { self->reportDifference(from, last, all); });
}

// Long: one gathered round read the same way on every rank (scan, release
// the agreeing prefix, words, metrics, report); the steps share its locals.
void Verifier::reportDifference(uint64_t from, uint64_t last, const std::vector<int64_t>& all) {
  auto st = state_.lock();
  if (!st) return;
  const uint64_t n = last - from + 1;
  uint64_t first = 0;
  bool splitsOnly = false;
  for (uint64_t k = 0; k < n && first == 0; ++k) {
    std::set<int64_t> hashes;
    uint64_t send = 0, recv = 0;
    for (int r = 0; r < size_; ++r) {
      const int64_t* v = all.data() + 3 * (r * n + k);
      hashes.insert(v[0]);
      send += static_cast<uint64_t>(v[1]);
      recv += static_cast<uint64_t>(v[2]);
    }
    if (hashes.size() > 1 || send != recv) {
      first = from + k;
      splitsOnly = hashes.size() == 1;
    }
  }
  if (first == 0) {
    // Beyond the scanned range: say what is known.
    Difference d;
    d.kind = Difference::Kind::Range;
    d.group = st->label();
    d.groupSize = size_;
    d.seq = from;
    d.last = last;
    failWithReport(*st, std::move(d));
    return;
  }
  // Every rank read the same hashes: all agree up to #first - 1, so the
  // stream gate lets those through (firstUnverifiable) and poisons from #first.
  agreedSeq_.store(first - 1, std::memory_order_release);
  if (auto* gate = st->streamGate()) gate->release(first - 1);
  // Each rank's words for that collective (OpWords), gathered so every rank
  // writes the same report.
  auto& ledger = st->ledger();
  OpWords words;
  if (auto e = ledger.bySeq(first)) words = issuedWords(e->fp, e->callSite, e->label, e->fp.hash);
  // The metrics this rank synced around it: the report compares them across ranks.
  auto metricAt = [&ledger](uint64_t s) -> std::optional<std::string> {
    auto e = ledger.bySeq(s);
    return e ? LabelTable::instance().metricOf(e->label) : std::nullopt;
  };
  words.metricSync = metricAt(first).has_value();
  words.metrics = metricRunAround(first, ledger.progress().lastSeq, UINT64_MAX, metricAt);
  words.history = localHistory(ledger, first);
  std::vector<int64_t> mine = packText(words.encode(kTextBytes - 1));
  auto self = shared_from_this();
  gather(std::move(mine), [self, first, splitsOnly](const std::vector<int64_t>& texts) {
    auto state = self->state_.lock();
    if (!state) return;
    const size_t stride = kTextBytes / sizeof(int64_t);
    Difference d;
    d.group = state->label();
    d.groupSize = self->size_;
    d.seq = first;
    d.note = splitsOnly ? messages::kSplitsDoNotPair : "";
    bool metricSync = false;  // the op at `first` is a metric sync on some rank
    for (int r = 0; r < self->size_; ++r) {
      const int64_t* w = texts.data() + r * stride;
      OpWords words = OpWords::decode(unpackText(w));
      const int64_t globalRank = state->id().globalRank(r);
      d.ops.push_back(words.rankOp(globalRank));
      metricSync = metricSync || words.metricSync;
      d.metrics.push_back(RankMetrics{globalRank, true, std::move(words.metrics), -1});
      d.histories.push_back(RankHistory{globalRank, true, std::move(words.history)});
    }
    if (!metricSync) d.metrics.clear();
    self->failWithReport(*state, std::move(d));
  });
}

void Verifier::failWithReport(GroupState& st, Difference difference) {
  // Told as an incident's verdict is (dumps, rank 0's log line, then the failure).
  st.incidents().failGroup(st, GroupFailure::of(std::move(difference), Telling{Telling::Who::GroupRankZero}));
}

void Verifier::helperFailed(const std::string& what) {
  uint64_t from = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inFlight_ = false;
    if (stopped_) return;
    from = verifiedSeq_.load(std::memory_order_relaxed) + 1;
    if (blockedFrom_ == 0) blockedFrom_ = from;
  }
  auto st = state_.lock();
  if (!st || st->failed()) return;
  logMessage(LogLevel::Debug, "guard: the check backend of group \"" + st->label() + "\" failed: " + what);
  // Results after #from-1 can no longer be verified. The watchdog usually
  // fails the group first with a better report (a peer is gone); if not,
  // this does, so no wait is left holding results it may not release.
  std::ostringstream os;
  os << "the check of collectives from #" << from << " on group \"" << st->label()
     << "\" could not run (its helper backend failed: " << what.substr(0, what.find('\n'))
     << "); their results are not released, since they cannot be verified";
  std::weak_ptr<GroupState> weak = st;
  Errands::instance().run("check backend failure of group " + st->label(), [weak, text = os.str()] {
    if (auto s = weak.lock()) {
      s->waitUntil([] { return false; }, std::chrono::milliseconds(2000));
      s->incidents().failGroup(*s, GroupFailure{GuardErrorKind::Failure, text});
    }
  });
}

void Verifier::whenVerified(uint64_t seq, std::function<void()> release,
                            std::function<void(std::exception_ptr)> onFailure) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!verified(seq)) {
      parked_.push_back(Parked{seq, std::move(release), std::move(onFailure)});
      return;
    }
  }
  release();
}

void Verifier::failParked(std::exception_ptr err) {
  std::vector<Parked> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all.swap(parked_);
  }
  for (auto& p : all) p.onFailure(err);
}

bool Verifier::drain(std::chrono::milliseconds timeout) {
  auto st = state_.lock();
  if (!st) return true;
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    target = pending_.empty() ? verifiedSeq_.load() : pending_.rbegin()->first;
  }
  want(target);
  st->waitUntil([this, target] { return verified(target) || blocked(target); }, timeout);
  return verified(target);
}

void Verifier::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    // Let the helper backend go with the group (its threads end with it),
    // unless a round still runs on it: then it stays, as failed groups' do.
    if (!inFlight_) helper_.reset();
  }
  pacerCv_.notify_all();
  if (pacer_.joinable()) {
    // The pacer waits only on pacerCv_: it ends at once. (It may hold the last
    // reference for a moment, in maybeStartRound: then it must not join itself.)
    if (pacer_.get_id() == std::this_thread::get_id()) {
      pacer_.detach();
    } else {
      pacer_.join();
    }
  }
}

Verifier::Stats Verifier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.rounds = rounds_;
  s.gatherMicros = gatherMicros_.load(std::memory_order_relaxed);
  s.burst = pacing_.burst();
  s.mispredictions = pacing_.mispredictions();
  s.quietMicros = static_cast<uint64_t>(pacing_.quietGapUs());
  s.verifiedSeq = verifiedSeq_.load();
  s.issuedSeq = pending_.empty() ? s.verifiedSeq : pending_.rbegin()->first;
  s.inBand = inBandVerified_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace torch_ext
