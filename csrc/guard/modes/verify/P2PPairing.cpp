#include "guard/modes/verify/P2PPairing.h"

#include "guard/collective/WorkRetirement.h"

#include "guard/Errors.h"
#include "guard/collective/CallSite.h"
#include "guard/collective/Fingerprint.h"
#include "guard/collective/InnerFuture.h"
#include "guard/collective/LabelTable.h"
#include "guard/collective/StoreExchange.h"

#include <ATen/ATen.h>

#include <sstream>
#include <string>

namespace torch_ext {

namespace {

// The pairing words: what the receiver must have posted, and where the send was.
enum Word : int64_t { kPair, kDtype, kNumel, kTag, kSite, kWords };

at::Tensor wordsOf(const Fingerprint& fp, uint32_t callSite) {
  at::Tensor w = at::empty({static_cast<int64_t>(kWords)}, at::TensorOptions().dtype(at::kLong));
  int64_t* p = w.data_ptr<int64_t>();
  p[kPair] = static_cast<int64_t>(fp.p2pPairHash());
  p[kDtype] = fp.metas.empty() ? -1 : static_cast<int64_t>(fp.metas[0].dtype);
  p[kNumel] = fp.numel();
  p[kTag] = fp.tag;
  p[kSite] = static_cast<int64_t>(CallSites::instance().stableKey(callSite));
  return w;
}

// A receive whose result is handed out once its sender's words pair with it.
class PairedReceiveWork : public c10d::Work, public ForwardsFuture {
 public:
  PairedReceiveWork(std::shared_ptr<GroupState> state, c10::intrusive_ptr<c10d::Work> data,
                    c10::intrusive_ptr<c10d::Work> words, at::Tensor buffer, Fingerprint fp, uint64_t ordinal,
                    uint32_t callSite, uint32_t label)
      : c10d::Work(-1, c10d::OpType::RECV),
        state_(std::move(state)),
        data_(std::move(data)),
        words_(std::move(words)),
        buffer_(std::move(buffer)),
        fp_(std::move(fp)),
        ordinal_(ordinal),
        callSite_(callSite),
        label_(label) {}

  bool wait(std::chrono::milliseconds timeout) override {
    if (!data_->wait(timeout)) return false;  // the guard's own wait: typed errors, group failures
    surfacing([this] { checkWords(); });
    return true;
  }
  bool isCompleted() override {
    // gloo marks a receive complete only in its wait(): the words are waited
    // for here once the data came (they follow it at once), not polled.
    if (!data_->isCompleted()) return false;
    if (state_->failed()) return true;  // as GuardWork: wait() raises the failure
    surfacing([this] { checkWords(); });
    return true;
  }
  bool isSuccess() const override {
    return data_->isSuccess() && !state_->failed();
  }
  std::exception_ptr exception() const override {
    return data_->exception();
  }
  int sourceRank() const override {
    return data_->sourceRank();
  }
  std::vector<at::Tensor> result() override {
    return data_->result();
  }
  void synchronize() override {
    data_->synchronize();
  }
  void abort() override {
    data_->abort();
    words_->abort();
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return data_->getFuture();  // not paired (P2PPairing.h)
  }
  float getDuration() const override {
    return data_->getDuration();
  }
  uint64_t getSequencenumber() const override {
    return data_->getSequencenumber();
  }

 private:
  void checkWords() {
    std::lock_guard<std::mutex> lock(mu_);
    if (checked_) return;
    if (state_->failed()) state_->throwFailure("recv");  // a peer gone or a verdict: no words to wait for
    const int src = fp_.root;
    try {
      words_->wait(P2PPairing::kWordsWithin);
    } catch (const std::exception& e) {
      if (state_->failed()) state_->throwFailure("recv");
      std::ostringstream os;
      os << "recv from rank " << state_->id().globalRank(src) << " (#" << ordinal_ << ", tag " << fp_.tag
         << ") on group \"" << state_->label() << "\": its data came, but not the pairing words its sender posts "
         << "with it under check=\"verify\" (" << e.what() << "). Does rank " << state_->id().globalRank(src)
         << " run torch_ext with another check mode (TORCH_EXT_CHECK) or another version?";
      state_->incidents().failGroup(*state_, GroupFailure{GuardErrorKind::Failure, os.str()});
      state_->throwFailure("recv");
    }
    const int64_t* w = buffer_.data_ptr<int64_t>();
    if (static_cast<uint64_t>(w[kPair]) != fp_.p2pPairHash()) {
      // Their send as its words tell it (the shape is known to them only: its element count here).
      Fingerprint send;
      send.op = Op::Send;
      send.root = state_->id().rank;
      send.tag = static_cast<int32_t>(w[kTag]);
      if (w[kDtype] >= 0) {
        TensorMeta m;
        m.dtype = static_cast<c10::ScalarType>(w[kDtype]);
        m.sizes = {w[kNumel]};
        m.numel = w[kNumel];
        send.metas.push_back(m);
        send.numTensors = 1;
      }
      // Their line, when this process ran it too (symmetric code); else rank `src`'s own.
      auto& sites = CallSites::instance();
      const uint32_t theirSite = sites.byStableKey(static_cast<uint64_t>(w[kSite]));
      OpWords theirs;
      theirs.text = send.describe();
      theirs.where = theirSite != 0 ? sites.describe(theirSite)
                                    : "a line only rank " + std::to_string(state_->id().globalRank(src)) + " ran";
      theirs.hash = static_cast<uint64_t>(w[kPair]);
      const std::vector<Frame> frames = sites.frames(callSite_);
      const std::string where = describeCallSite(frames) + labelSuffix(LabelTable::instance().get(label_), frames);
      p2pPairsOrFails(state_, theirs, fp_, ordinal_, src, where, /*raise=*/true);
    }
    checked_ = true;
  }

  std::shared_ptr<GroupState> state_;
  c10::intrusive_ptr<c10d::Work> data_;
  c10::intrusive_ptr<c10d::Work> words_;
  at::Tensor buffer_;
  Fingerprint fp_;
  uint64_t ordinal_;
  uint32_t callSite_;
  uint32_t label_;
  std::mutex mu_;
  bool checked_ = false;
};

}  // namespace

P2PPairing::P2PPairing(std::weak_ptr<GroupState> state, c10::intrusive_ptr<c10d::Backend> helper)
    : state_(std::move(state)), helper_(std::move(helper)) {}

void P2PPairing::release() {
  std::lock_guard<std::mutex> lock(mu_);
  sending_.clear();
  helper_.reset();
}

P2PPairing::~P2PPairing() {
  for (auto& w : sending_) WorkRetirement::instance().keep(std::move(w));
  WorkRetirement::instance().keep(std::move(helper_));
}

void P2PPairing::sent(const Fingerprint& fp, uint32_t callSite) {
  std::vector<at::Tensor> words{wordsOf(fp, callSite)};
  auto work = helper_->send(words, fp.root, fp.tag);
  c10::intrusive_ptr<c10d::Work> oldest;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sending_.push_back(std::move(work));
    if (sending_.size() <= kInFlight) return;
    oldest = std::move(sending_.front());
    sending_.pop_front();
  }
  // gloo marks a send complete only in its wait(): the oldest is waited for,
  // long done unless its receiver is kInFlight receives behind.
  try {
    oldest->wait();
  } catch (const std::exception&) {
    // Its receiver is gone: the data's own send reports that.
  }
}

c10::intrusive_ptr<c10d::Work> P2PPairing::received(c10::intrusive_ptr<c10d::Work> data, const Fingerprint& fp,
                                                    uint64_t ordinal, uint32_t callSite) {
  std::vector<at::Tensor> buffer{at::empty({static_cast<int64_t>(kWords)}, at::TensorOptions().dtype(at::kLong))};
  auto words = helper_->recv(buffer, fp.root, fp.tag);
  // The issuing backend holds the group: its state is there.
  return c10::make_intrusive<PairedReceiveWork>(state_.lock(), std::move(data), std::move(words), buffer[0], fp,
                                                ordinal, callSite, LabelTable::current());
}

}  // namespace torch_ext
