#include "guard/report/OpFacts.h"

#include "guard/report/Snapshot.h"

#include <algorithm>

namespace torch_ext {

Json OpFacts::toJson() const {
  Json j = Json::object();
  j.set("text", text);
  j.set("op", op);
  j.set("dtype", dtype);
  Json sizesJson = Json::array();
  for (auto d : sizes) sizesJson.push(d);
  j.set("sizes", sizesJson);
  j.set("tensors", tensors);
  j.set("reduce_op", reduceOp);
  return j;
}

OpFacts OpFacts::fromJson(const Json& j) {
  OpFacts f;
  f.text = j.at("text").asString("op text");
  f.op = j.at("op").asString("op");
  f.dtype = j.stringOr("dtype");
  if (const Json* a = j.get("sizes"); a != nullptr && a->isArray()) {
    for (const auto& d : a->asArray()) f.sizes.push_back(d.asInt("size"));
  }
  if (const Json* n = j.get("tensors"); n != nullptr && !n->isNull()) f.tensors = n->asInt("tensors");
  f.reduceOp = j.stringOr("reduce_op");
  return f;
}

OpFacts opFacts(const EntryView& e) {
  OpFacts f;
  f.text = e.text;
  f.op = opName(e.op);
  if (!e.dtypes.empty()) f.dtype = e.dtypes.front();
  if (!e.sizes.empty()) f.sizes = e.sizes.front();
  f.tensors = static_cast<int64_t>(e.sizes.size());
  f.reduceOp = e.reduceOp;
  return f;
}

void addShown(std::vector<OpFacts>& shown, const OpFacts& f) {
  if (!f.known()) return;
  const bool there = std::any_of(shown.begin(), shown.end(), [&](const OpFacts& s) { return s.text == f.text; });
  if (!there) shown.push_back(f);
}

}  // namespace torch_ext
