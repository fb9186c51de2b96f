#include "guard/report/Snapshot.h"

#include <cstdio>
#include <cstdlib>
#include <limits>

namespace torch_ext {

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint64_t parseHex64(const std::string& s, const char* what) {
  if (s.empty() || s.size() > 16 || s.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    throw JsonError(std::string(what) + " must be a hex string of up to 16 digits, got '" + s + "'");
  }
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 16);
  if (end != s.c_str() + s.size()) throw JsonError(std::string(what) + " must be a hex string, got '" + s + "'");
  return static_cast<uint64_t>(v);
}

std::string EntryView::where() const {
  return describeCallSite(frames) + labelSuffix(label, frames);
}

const EntryView* GroupView::bySeq(uint64_t seq) const {
  for (const auto& e : entries) {
    if (!e.isP2P && e.seq == seq) return &e;
  }
  return nullptr;
}

const EntryView* GroupView::oldestPending() const {
  for (const auto& e : entries) {
    if (e.state == EntryState::Scheduled) return &e;
  }
  return nullptr;
}

const GroupView* RankSnapshot::group(const std::string& name) const {
  for (const auto& g : groups) {
    if (g.name == name) return &g;
  }
  return nullptr;
}

Json toJson(const Frame& f) {
  Json j = Json::object();
  j.set("name", f.function);
  j.set("filename", f.filename);
  j.set("line", static_cast<int64_t>(f.line));
  if (!f.library.empty()) j.set("library", f.library);
  return j;
}

namespace {

// A field held in 32 bits: a larger value is an error, not silently wrapped
// (a group "size" of 2^32 + 2 must not read as 2).
int32_t int32From(int64_t v, const char* what) {
  if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max()) {
    throw JsonError(std::string(what) + " must fit in 32 bits, got " + std::to_string(v));
  }
  return static_cast<int32_t>(v);
}

Json framesJson(const std::vector<Frame>& frames) {
  Json a = Json::array();
  for (const auto& f : frames) a.push(toJson(f));
  return a;
}

std::vector<Frame> framesFrom(const Json& j, const char* what) {
  std::vector<Frame> out;
  for (const auto& f : j.asArray(what)) {
    Frame fr;
    fr.function = f.at("name").asString("frame name");
    fr.filename = f.at("filename").asString("frame filename");
    fr.line = int32From(f.at("line").asInt("frame line"), "frame line");
    if (const Json* lib = f.get("library")) fr.library = lib->asString("frame library");
    out.push_back(std::move(fr));
  }
  return out;
}

}  // namespace

Json toJson(const Label& label) {
  Json j = Json::object();
  j.set("text", label.text);
  if (!label.fields.empty()) {
    Json fields = Json::object();
    for (const auto& [k, v] : label.fields) fields.set(k, v);
    j.set("fields", fields);
  }
  if (!label.origin.empty()) j.set("origin", framesJson(label.origin));
  if (!label.hint.empty()) j.set("hint", label.hint);
  return j;
}

Label labelFromJson(const Json& j) {
  Label l;
  l.text = j.at("text").asString("label text");
  if (l.text.empty()) throw JsonError("label text must not be empty");
  if (const Json* fields = j.get("fields")) {
    for (const auto& [k, v] : fields->asObject("label fields")) l.fields.emplace_back(k, v.asString("label field"));
  }
  if (const Json* origin = j.get("origin")) l.origin = framesFrom(*origin, "label origin");
  if (const Json* hint = j.get("hint")) l.hint = hint->asString("label hint");
  return l;
}

Json toJson(const EntryView& e, const GroupView& g) {
  Json j = Json::object();
  // Flight Recorder fields.
  j.set("record_id", e.id);
  j.set("pg_id", g.name);
  j.set("process_group", Json(Json::Array{Json(g.name), Json(g.label())}));
  j.set("collective_seq_id", e.seq);
  j.set("p2p_seq_id", e.p2pOrdinal);
  j.set("op_id", e.id);
  j.set("profiling_name", std::string("guard:") + opName(e.op));
  j.set("time_created_ns", e.startNs);
  Json sizes = Json::array();
  for (const auto& s : e.sizes) {
    Json dims = Json::array();
    for (auto d : s) dims.push(d);
    sizes.push(dims);
  }
  j.set("input_sizes", sizes);
  Json dtypes = Json::array();
  for (const auto& d : e.dtypes) dtypes.push(d);
  j.set("input_dtypes", dtypes);
  j.set("output_sizes", Json::array());
  j.set("output_dtypes", Json::array());
  j.set("state", entryStateName(e.state));
  j.set("time_discovered_started_ns", Json());
  j.set("time_discovered_completed_ns", e.endNs ? Json(e.endNs) : Json());
  j.set("duration_ms", e.endNs ? Json((static_cast<double>(e.endNs) - static_cast<double>(e.startNs)) / 1e6) : Json());
  j.set("timeout_ms", g.timeoutMs);
  j.set("is_p2p", e.isP2P);
  j.set("retired", e.state != EntryState::Scheduled);
  j.set("frames", framesJson(e.frames));
  // torch_ext fields.
  j.set("op", opName(e.op));
  j.set("device", e.device);
  j.set("fingerprint", e.text);
  j.set("hash", hex64(e.hash));
  j.set("rolling_hash", hex64(e.rolling));
  j.set("pair_hash", hex64(e.pairHash));
  j.set("split_send", hex64(e.splitSend));
  j.set("split_recv", hex64(e.splitRecv));
  j.set("peer", static_cast<int64_t>(e.peer));
  j.set("tag", static_cast<int64_t>(e.tag));
  j.set("reduce_op", e.reduceOp);
  if (!e.label.empty()) j.set("label", toJson(e.label));
  if (!e.error.empty()) j.set("error", e.error);
  if (e.streamStarted) j.set("stream_started", *e.streamStarted);
  return j;
}

Json toJson(const GroupView& g) {
  Json j = Json::object();
  j.set("name", g.name);
  j.set("desc", g.desc);
  j.set("rank", static_cast<int64_t>(g.rank));
  j.set("size", static_cast<int64_t>(g.size));
  Json ranks = Json::array();
  for (auto r : g.globalRanks) ranks.push(r);
  j.set("ranks", ranks);
  j.set("last_seq", g.lastSeq);
  j.set("last_completed_seq", g.lastCompletedSeq);
  j.set("last_completed_ns", g.lastCompletedNs);
  j.set("rolling_hash", hex64(g.rolling));
  j.set("timeout_ms", g.timeoutMs);
  Json entries = Json::array();
  for (const auto& e : g.entries) entries.push(toJson(e, g));
  j.set("entries", entries);
  if (!g.waitWindows.empty()) {
    Json windows = Json::array();
    for (const auto& w : g.waitWindows) {
      Json wj = Json::object();
      wj.set("level", static_cast<int64_t>(w.level));
      wj.set("index", w.index);
      wj.set("wait_ns", w.waitNs);
      wj.set("span_ns", w.spanNs);
      wj.set("site", hex64(w.siteKey));
      wj.set("site_wait_ns", w.siteWaitNs);
      wj.set("site_count", static_cast<int64_t>(w.siteCount));
      windows.push(wj);
    }
    j.set("wait_windows", windows);
    Json sites = Json::object();
    for (const auto& [key, text] : g.waitSites) sites.set(hex64(key), text);
    j.set("wait_sites", sites);
  }
  return j;
}

std::string LastWordsWhy::encode() const {
  std::string out = enumName(cause);
  if (cause == LastWordsCause::Raised) out += ": " + exception;
  return out;
}

std::optional<LastWordsWhy> LastWordsWhy::decode(const std::string& incident) {
  const auto colon = incident.find(':');
  auto cause = enumFromName<LastWordsCause>(incident.substr(0, colon));
  if (!cause) return std::nullopt;
  LastWordsWhy w;
  w.cause = *cause;
  if (colon != std::string::npos && colon + 2 <= incident.size()) w.exception = incident.substr(colon + 2);
  return w;
}

namespace {

Json progressJson(const ProgressFacts& p) {
  Json j = Json::object();
  j.set("window_ns", p.windowNs);
  j.set("cpu_ns", p.cpuNs);
  j.set("io_bytes", p.ioBytes);
  j.set("quiet_ns", p.quietNs);
  j.set("busy", p.busy);
  return j;
}

ProgressFacts progressFrom(const Json& j) {
  ProgressFacts p;
  p.known = true;
  p.windowNs = j.intOr("window_ns");
  p.cpuNs = j.intOr("cpu_ns");
  p.ioBytes = j.intOr("io_bytes", -1);
  p.quietNs = j.intOr("quiet_ns");
  const Json* busy = j.get("busy");
  p.busy = busy != nullptr && busy->asBool("progress.busy");
  return p;
}

}  // namespace

Json toJson(const RankSnapshot& s) {
  Json j = Json::object();
  j.set("version", s.version);
  j.set("rank", s.rank);
  j.set("pid", s.pid);
  j.set("hostname", s.hostname);
  if (!s.software.empty()) j.set("software", s.software);
  j.set("time_ns", s.timeNs);
  j.set("incident", s.incident);
  j.set("config", s.config);
  if (s.storeHealth != StoreHealth::Healthy) {
    j.set("store_health", enumName(s.storeHealth));
    j.set("store_lost", s.storeLost);
  }
  if (s.storeHostRank >= 0) j.set("store_host_rank", s.storeHostRank);
  Json main = Json::object();
  main.set("available", s.main.available);
  main.set("note", s.main.note);
  main.set("frames", framesJson(s.main.frames));
  j.set("main_thread", main);
  if (s.progress.known) j.set("progress", progressJson(s.progress));
  if (!s.threads.empty()) {
    Json threads = Json::array();
    for (const auto& t : s.threads) {
      Json tj = Json::object();
      tj.set("id", t.id);
      tj.set("name", t.name);
      tj.set("frames", framesJson(t.frames));
      threads.push(tj);
    }
    j.set("threads", threads);
  }
  Json pgConfig = Json::object();
  Json groups = Json::array();
  for (const auto& g : s.groups) {
    Json c = Json::object();
    c.set("name", g.name);
    c.set("desc", g.desc);
    Json ranks = Json::array();
    for (auto r : g.globalRanks) ranks.push(r);
    c.set("ranks", ranks);
    pgConfig.set(g.name, c);
    groups.push(toJson(g));
  }
  j.set("pg_config", pgConfig);
  j.set("groups", groups);
  if (!s.waits.empty()) {
    Json waits = Json::array();
    for (const auto& w : s.waits) waits.push(toJson(w));
    j.set("waits", waits);
  }
  if (s.status) {
    const DumpStatus& st = *s.status;
    j.set("written_at", std::string(enumName(st.cause)));
    j.set("state", std::string(enumName(st.state)));
    j.set("state_ns", st.stateNs);
    j.set("recovered_ns", st.recoveredNs);
    Json awaited = Json::array();
    for (const auto& a : st.awaited) {
      Json w = Json::object();
      w.set("group", a.group);
      w.set("collective_seq_id", a.seq);
      w.set("record_id", a.recordId);
      awaited.push(w);
    }
    j.set("awaited", awaited);
  }
  return j;
}

namespace {

// GroupView::waitWindows and waitSites (optional: dumps of an older
// torch_ext, and incident snapshots, carry none).
void waitWindowsFromJson(const Json& j, GroupView& g) {
  if (const Json* windows = j.get("wait_windows")) {
    for (const auto& wj : windows->asArray("wait_windows")) {
      WaitWindow w;
      const int64_t level = wj.at("level").asInt("wait window level");
      if (level < 0 || static_cast<size_t>(level) >= kWaitWindowSizes.size()) {
        throw JsonError("wait window level must be 0 to " + std::to_string(kWaitWindowSizes.size() - 1) + ", got " +
                        std::to_string(level));
      }
      w.level = static_cast<uint8_t>(level);
      w.index = static_cast<uint64_t>(wj.at("index").asInt("wait window index"));
      w.waitNs = wj.at("wait_ns").asInt("wait_ns");
      w.spanNs = wj.at("span_ns").asInt("span_ns");
      w.siteKey = parseHex64(wj.at("site").asString("wait window site"), "wait window site");
      w.siteWaitNs = wj.intOr("site_wait_ns");
      w.siteCount = static_cast<uint32_t>(wj.intOr("site_count"));
      g.waitWindows.push_back(w);
    }
  }
  if (const Json* sites = j.get("wait_sites")) {
    for (const auto& [key, text] : sites->asObject("wait_sites")) {
      g.waitSites[parseHex64(key, "wait site key")] = text.asString("wait site");
    }
  }
}

}  // namespace

GroupView groupFromJson(const Json& j) {
  GroupView g;
  g.name = j.at("name").asString("group name");
  g.desc = j.stringOr("desc");
  g.rank = int32From(j.at("rank").asInt("group rank"), "group rank");
  g.size = int32From(j.at("size").asInt("group size"), "group size");
  if (g.size <= 0 || g.rank < 0 || g.rank >= g.size) {
    throw JsonError("group '" + g.name + "' has rank " + std::to_string(g.rank) + " outside size " +
                    std::to_string(g.size));
  }
  for (const auto& r : j.at("ranks").asArray("group ranks")) g.globalRanks.push_back(r.asInt("group rank list"));
  g.lastSeq = static_cast<uint64_t>(j.at("last_seq").asInt("last_seq"));
  g.lastCompletedSeq = static_cast<uint64_t>(j.at("last_completed_seq").asInt("last_completed_seq"));
  g.lastCompletedNs = j.intOr("last_completed_ns");
  g.rolling = parseHex64(j.at("rolling_hash").asString("rolling_hash"), "rolling_hash");
  g.timeoutMs = j.intOr("timeout_ms");
  for (const auto& ej : j.at("entries").asArray("entries")) {
    EntryView e;
    e.id = static_cast<uint64_t>(ej.at("record_id").asInt("record_id"));
    e.seq = static_cast<uint64_t>(ej.at("collective_seq_id").asInt("collective_seq_id"));
    e.p2pOrdinal = static_cast<uint64_t>(ej.at("p2p_seq_id").asInt("p2p_seq_id"));
    const std::string op = ej.at("op").asString("op");
    const auto parsedOp = opFromName(op);
    if (!parsedOp) throw JsonError("unknown op '" + op + "'");
    e.op = *parsedOp;
    e.device = ej.stringOr("device");
    e.text = ej.at("fingerprint").asString("fingerprint");
    e.isP2P = ej.at("is_p2p").asBool("is_p2p");
    e.peer = int32From(ej.intOr("peer", -1), "peer");
    e.tag = int32From(ej.intOr("tag", 0), "tag");
    e.reduceOp = ej.stringOr("reduce_op");
    for (const auto& d : ej.at("input_dtypes").asArray("input_dtypes")) e.dtypes.push_back(d.asString("dtype"));
    for (const auto& s : ej.at("input_sizes").asArray("input_sizes")) {
      std::vector<int64_t> dims;
      for (const auto& d : s.asArray("input_sizes entry")) dims.push_back(d.asInt("size"));
      e.sizes.push_back(std::move(dims));
    }
    e.hash = parseHex64(ej.at("hash").asString("hash"), "hash");
    e.rolling = parseHex64(ej.at("rolling_hash").asString("rolling_hash"), "rolling_hash");
    e.pairHash = parseHex64(ej.at("pair_hash").asString("pair_hash"), "pair_hash");
    e.splitSend = parseHex64(ej.at("split_send").asString("split_send"), "split_send");
    e.splitRecv = parseHex64(ej.at("split_recv").asString("split_recv"), "split_recv");
    const std::string state = ej.at("state").asString("state");
    const auto parsedState = enumFromName<EntryState>(state);
    if (!parsedState) throw JsonError("entry state must be scheduled, completed or failed, got '" + state + "'");
    e.state = *parsedState;
    e.startNs = ej.at("time_created_ns").asInt("time_created_ns");
    const Json* done = ej.get("time_discovered_completed_ns");
    e.endNs = (done && done->isNumber()) ? done->asInt("time_discovered_completed_ns") : 0;
    e.frames = framesFrom(ej.at("frames"), "frames");
    if (const Json* label = ej.get("label")) e.label = labelFromJson(*label);
    e.error = ej.stringOr("error");
    if (const Json* started = ej.get("stream_started"); started != nullptr && started->type() == Json::Type::Bool) {
      e.streamStarted = started->asBool("stream_started");
    }
    g.entries.push_back(std::move(e));
  }
  waitWindowsFromJson(j, g);
  return g;
}

RankSnapshot snapshotFromJson(const Json& j) {
  if (!j.isObject()) throw JsonError("top level must be an object");
  RankSnapshot s;
  const Json* version = j.get("version");
  if (version == nullptr || !version->isString()) {
    throw JsonError("no 'version' field: not a torch_ext dump");
  }
  s.version = version->asString();
  if (s.version != kSnapshotVersion) {
    throw JsonError("version '" + s.version + "' is not " + kSnapshotVersion + " (written by another torch_ext?)");
  }
  s.rank = j.at("rank").asInt("rank");
  s.pid = j.intOr("pid");
  s.hostname = j.stringOr("hostname");
  s.software = j.stringOr("software");
  s.timeNs = j.at("time_ns").asInt("time_ns");
  s.incident = j.stringOr("incident");
  s.config = j.stringOr("config");
  if (const Json* health = j.get("store_health")) {
    const auto parsed = enumFromName<StoreHealth>(health->asString("store_health"));
    if (!parsed) throw JsonError("store_health '" + health->asString("store_health") + "' is not a store health");
    s.storeHealth = *parsed;
  }
  s.storeLost = j.stringOr("store_lost");
  s.storeHostRank = j.intOr("store_host_rank", -1);
  const Json& main = j.at("main_thread");
  s.main.available = main.at("available").asBool("main_thread.available");
  s.main.note = main.stringOr("note");
  s.main.frames = framesFrom(main.at("frames"), "main_thread.frames");
  if (const Json* progress = j.get("progress")) s.progress = progressFrom(*progress);
  if (const Json* threads = j.get("threads")) {
    for (const auto& tj : threads->asArray("threads")) {
      ThreadStack t;
      t.id = static_cast<uint64_t>(tj.intOr("id"));
      t.name = tj.stringOr("name");
      t.frames = framesFrom(tj.at("frames"), "threads.frames");
      s.threads.push_back(std::move(t));
    }
  }
  for (const auto& g : j.at("groups").asArray("groups")) s.groups.push_back(groupFromJson(g));
  if (const Json* waits = j.get("waits")) {
    for (const auto& w : waits->asArray("waits")) s.waits.push_back(groupWaitFromJson(w));
  }
  // The dump's state (absent before torch_ext wrote one).
  if (j.get("state") != nullptr) {
    DumpStatus st;
    const std::string cause = j.at("written_at").asString("written_at");
    const auto parsedCause = enumFromName<DumpCause>(cause);
    if (!parsedCause) {
      throw JsonError("written_at must be warn_after, abort_after, mismatch, p2p_check, failure or manual, got '" +
                      cause + "'");
    }
    st.cause = *parsedCause;
    const std::string state = j.at("state").asString("state");
    const auto parsedState = enumFromName<DumpState>(state);
    if (!parsedState) {
      throw JsonError("state must be running, waiting, failed, recovered or finished, got '" + state + "'");
    }
    st.state = *parsedState;
    st.stateNs = j.intOr("state_ns");
    st.recoveredNs = j.intOr("recovered_ns");
    if (const Json* awaited = j.get("awaited")) {
      for (const auto& w : awaited->asArray("awaited")) {
        DumpAwaited a;
        a.group = w.at("group").asString("awaited group");
        a.seq = static_cast<uint64_t>(w.intOr("collective_seq_id"));
        a.recordId = static_cast<uint64_t>(w.intOr("record_id"));
        st.awaited.push_back(std::move(a));
      }
    }
    s.status = std::move(st);
  }
  return s;
}

}  // namespace torch_ext
