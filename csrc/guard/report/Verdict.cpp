#include "guard/report/Verdict.h"

#include "guard/report/Snapshot.h"

namespace torch_ext {

namespace {

Json ranksJson(const std::vector<int64_t>& ranks) {
  Json a = Json::array();
  for (auto r : ranks) a.push(r);
  return a;
}

std::vector<int64_t> ranksFrom(const Json& j, const char* key) {
  std::vector<int64_t> out;
  if (const Json* a = j.get(key); a != nullptr && a->isArray()) {
    for (const auto& r : a->asArray()) out.push_back(r.asInt(key));
  }
  return out;
}

const std::string& stringOr(const Json& j, const char* key, const std::string& fallback) {
  const Json* v = j.get(key);
  return v != nullptr && v->isString() ? v->asString(key) : fallback;
}

}  // namespace

Json Verdict::toJson() const {
  Json j = Json::object();
  j.set("kind", kindName(kind));
  j.set("text", text);
  j.set("reporter", reporter);
  j.set("seq", seq);
  j.set("group", group);
  j.set("incident", incident);
  if (!shown.empty()) {
    Json a = Json::array();
    for (const auto& f : shown) a.push(f.toJson());
    j.set("shown_ops", a);
  }
  if (kind == Kind::Mismatch) {
    Json lines = Json::array();
    for (const auto& op : ops) {
      Json l = Json::object();
      l.set("rank", op.globalRank);
      l.set("issued", op.issued);
      l.set("op", op.text);
      l.set("where", op.where);
      if (!op.caller.empty()) l.set("caller", op.caller);
      if (!op.hint.empty()) l.set("hint", op.hint);
      l.set("hash", hex64(op.hash));
      lines.push(l);
    }
    j.set("ranks", lines);
  }
  if (kind == Kind::Hang || kind == Kind::Failure) {
    j.set("op", op);
    j.set("waiting", ranksJson(waiting));
    j.set("not_arrived", ranksJson(notArrived));
    j.set("gone", ranksJson(gone));
    j.set("completed", ranksJson(completed));
    j.set("wait_shape", enumName(shape));
    if (shape == WaitShape::Cycle) {
      Json groups = Json::array();
      for (const auto& g : cycleGroups) groups.push(g);
      j.set("cycle_groups", groups);
      j.set("certain", certain);
    }
    if (shape == WaitShape::Chain) j.set("waits_for", ranksJson(waitsFor));
    if (!sites.empty()) {
      Json a = Json::array();
      for (const auto& s : sites) a.push(torch_ext::toJson(s));
      j.set("wait_sites", a);
    }
  }
  return j;
}

Verdict Verdict::fromJson(const Json& j) {
  static const std::string empty;
  Verdict v;
  const std::string kind = j.at("kind").asString("verdict kind");
  const auto known = enumFromName<Kind>(kind);
  // A kind this release does not know (a verdict from another torch_ext; the
  // join handshake keeps those out) is no verdict to act on as "none".
  if (!known) throw JsonError("verdict kind '" + kind + "' is not one this torch_ext knows");
  v.kind = *known;
  v.text = j.at("text").asString("verdict text");
  v.reporter = j.at("reporter").asInt("verdict reporter");
  v.seq = static_cast<uint64_t>(j.at("seq").asInt("verdict seq"));
  v.group = stringOr(j, "group", empty);
  v.incident = stringOr(j, "incident", empty);
  v.op = stringOr(j, "op", empty);
  v.waiting = ranksFrom(j, "waiting");
  v.notArrived = ranksFrom(j, "not_arrived");
  v.gone = ranksFrom(j, "gone");
  v.completed = ranksFrom(j, "completed");
  v.shape = enumFromName<WaitShape>(stringOr(j, "wait_shape", empty)).value_or(WaitShape::None);
  if (const Json* groups = j.get("cycle_groups"); groups != nullptr && groups->isArray()) {
    for (const auto& g : groups->asArray()) v.cycleGroups.push_back(g.asString("cycle group"));
  }
  if (const Json* c = j.get("certain"); c != nullptr && c->type() == Json::Type::Bool) v.certain = c->asBool("certain");
  v.waitsFor = ranksFrom(j, "waits_for");
  if (const Json* sites = j.get("wait_sites"); sites != nullptr && sites->isArray()) {
    for (const auto& s : sites->asArray()) v.sites.push_back(waitSiteFromJson(s));
  }
  if (const Json* a = j.get("shown_ops"); a != nullptr && a->isArray()) {
    for (const auto& f : a->asArray()) v.shown.push_back(OpFacts::fromJson(f));
  }
  if (const Json* lines = j.get("ranks"); lines != nullptr && lines->isArray()) {
    for (const auto& l : lines->asArray()) {
      RankOp op;
      op.globalRank = l.at("rank").asInt("rank");
      op.issued = l.at("issued").asBool("issued");
      op.text = l.at("op").asString("op");
      op.where = l.at("where").asString("where");
      op.caller = l.stringOr("caller");
      op.hint = stringOr(l, "hint", empty);
      if (const Json* h = l.get("hash"); h != nullptr && h->isString()) op.hash = parseHex64(h->asString(), "hash");
      v.ops.push_back(std::move(op));
    }
  }
  return v;
}

}  // namespace torch_ext
