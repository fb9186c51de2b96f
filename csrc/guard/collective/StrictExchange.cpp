#include "guard/collective/StrictExchange.h"

#include "guard/Errors.h"
#include "guard/store/StoreKeys.h"
#include "guard/report/Json.h"
#include "guard/report/Messages.h"

#include <sstream>

namespace torch_ext {

namespace {

// One slice of a wait: short, so a group failure ends it quickly.
constexpr std::chrono::milliseconds kSlice{100};

// The store stopped answering: the watchdog fails the group within a tick;
// raise that failure, or say so plainly if it has not come yet.
[[noreturn]] void storeFailed(GroupState& st, const std::string& op) {
  st.waitUntil([] { return false; },
               std::chrono::milliseconds(static_cast<int64_t>(std::max(1.0, 4 * st.exchangeIntervalS()) * 1000)));
  if (st.failed()) st.throwFailure(op);
  throw StoreLostError(st.store().channel().describeLoss() + " (during " + op + " on group \"" + st.label() + "\")");
}

// Waits for `keys` in slices until they exist or the group fails.
void awaitKeys(GroupState& st, const std::vector<std::string>& keys, const std::string& op) {
  while (true) {
    if (st.failed()) st.throwFailure(op);
    auto r = st.store().waitFor(keys, kSlice);
    if (!r.ok()) {
      if (r.status == CallStatus::Failed) {  // the store answered with an error: try again shortly
        st.waitUntil([] { return false; }, kSlice);
        continue;
      }
      storeFailed(st, op);
    }
    if (r.value) return;
  }
}

}  // namespace

std::vector<RankOp> exchangeStrictFingerprints(GroupState& st, const Fingerprint& fp, uint64_t seq,
                                               const std::string& where, const std::string& caller,
                                               const std::string& hint, std::vector<RankMetrics>* metrics) {
  const auto& id = st.id();
  Json mine = Json::object();
  mine.set("text", fp.describe());
  mine.set("where", where);
  if (!caller.empty()) mine.set("caller", caller);
  if (!hint.empty()) mine.set("hint", hint);
  if (metrics != nullptr && !metrics->empty()) {
    Json names = Json::array();
    for (const auto& n : metrics->front().names) names.push(n);
    mine.set("metrics", names);
    mine.set("metric_sync", metrics->front().known);
  }
  mine.set("hash", hex64(fp.hash));
  mine.set("facts", fp.facts().toJson());
  const std::string op = "the strict check of #" + std::to_string(seq);
  if (!st.store().set(keys::strictPrint(seq, id.rank), mine.dump())) storeFailed(st, op);
  std::vector<std::string> prints;
  for (int r = 0; r < id.size; ++r) prints.push_back(keys::strictPrint(seq, r));
  // Every rank took part in the check collective, so every rank writes its key.
  awaitKeys(st, prints, op);
  auto values = st.store().multiGet(prints);
  if (!values.ok()) storeFailed(st, op);
  std::vector<RankOp> ops;
  std::vector<RankMetrics> theirs;
  for (int r = 0; r < id.size; ++r) {
    RankOp o;
    o.globalRank = id.globalRank(r);
    RankMetrics m;
    m.globalRank = o.globalRank;
    try {
      Json j = Json::parse(values.value[r]);
      o.text = j.at("text").asString();
      o.where = j.at("where").asString();
      o.caller = j.stringOr("caller");
      if (const Json* h = j.get("hint"); h != nullptr && h->isString()) o.hint = h->asString();
      o.hash = parseHex64(j.at("hash").asString(), "hash");
      if (const Json* f = j.get("facts"); f != nullptr && f->isObject()) o.facts = OpFacts::fromJson(*f);
      if (const Json* a = j.get("metrics"); a != nullptr && a->isArray()) {
        for (const auto& n : a->asArray()) m.names.push_back(n.asString("metric"));
        const Json* s = j.get("metric_sync");
        m.known = s != nullptr && s->asBool("metric_sync");
      }
    } catch (const std::exception& e) {
      o.text = std::string("(unreadable fingerprint: ") + e.what() + ")";
    }
    ops.push_back(std::move(o));
    theirs.push_back(std::move(m));
  }
  if (metrics != nullptr) *metrics = std::move(theirs);
  auto done = st.store().add(keys::strictDone(seq), 1);
  if (done.ok() && done.value >= id.size) {
    prints.push_back(keys::strictDone(seq));
    st.store().deleteKeys(prints);
  }
  return ops;
}

bool publishP2PPrint(GroupState& st, const std::string& key, const P2PPrint& print) {
  Json j = Json::object();
  j.set("text", print.text);
  j.set("where", print.where);
  j.set("pair", hex64(print.pair));
  return st.store().set(key, j.dump());  // the receiver deletes it
}

std::optional<P2PPrint> takeP2PPrintIfThere(GroupState& st, const std::string& key, const std::string& op) {
  if (st.failed()) st.throwFailure(op);
  auto there = st.store().check({key});
  if (!there.ok()) {
    if (there.status == CallStatus::Failed) return std::nullopt;  // the store answered with an error: try later
    storeFailed(st, op);
  }
  if (!there.value) return std::nullopt;
  return awaitP2PPrint(st, key, op);
}

P2PPrint awaitP2PPrint(GroupState& st, const std::string& key, const std::string& op) {
  awaitKeys(st, {key}, op);
  auto raw = st.store().get(key);
  if (!raw) storeFailed(st, op);
  st.store().deleteKeys({key});
  Json j = Json::parse(*raw);
  P2PPrint p;
  p.text = j.at("text").asString();
  p.where = j.at("where").asString();
  p.pair = parseHex64(j.at("pair").asString(), "pair hash");
  return p;
}

bool p2pPairsOrFails(const std::shared_ptr<GroupState>& state, const P2PPrint& theirs, const Fingerprint& fp,
                     uint64_t ordinal, int src, const std::string& where, bool raise) {
  if (theirs.pair == fp.p2pPairHash()) return true;
  const int me = state->id().rank;
  std::ostringstream os;
  os << messages::p2pDoNotPair(state->label()) << "\n  "
     << messages::p2pUnpaired({state->id().globalRank(src), theirs.text, ordinal, theirs.where},
                              {state->id().globalRank(me), fp.describe(), ordinal, where});
  // Tell the sender and the others before raising here: they act on the
  // published verdict even if this process exits right after.
  Verdict v;
  v.kind = Verdict::Kind::Mismatch;
  v.text = os.str();
  v.reporter = state->id().globalRank(me);
  state->incidents().publishVerdict(state, Incident{IncidentKind::Mismatch, IncidentSubject::any(), me, ""}, v);
  state->incidents().failGroup(*state, GroupFailure{GuardErrorKind::Mismatch, v.text, std::nullopt, v});
  if (raise) state->throwFailure("");
  return false;
}

}  // namespace torch_ext
