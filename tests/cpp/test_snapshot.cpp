// Snapshot: one rank's portable view of its groups, in the JSON format shared by
// live incidents, dump files and `diagnose`. Views built from a real GroupState,
// the JSON round trip, and validation errors that name the problem.
#include "guard/report/Snapshot.h"
#include "guard/Clock.h"
#include "guard/report/DumpAnalysis.h"
#include "guard/collective/CallSite.h"
#include "guard/watchdog/Dumps.h"

#include "store_testing.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

using namespace torch_ext;

namespace test_snapshot {

namespace {

constexpr auto CPU = c10::DeviceType::CPU;

uint32_t site(const std::string& file, int line, const std::string& fn) {
  return CallSites::instance().intern({Frame{file, line, fn}});
}

std::shared_ptr<GroupState> makeGroup(GroupIdentity id,
                                      std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  Config cfg;
  cfg.ledgerSize = 16;
  return std::make_shared<GroupState>(std::move(id), cfg, testkit::groupStore(), timeout);
}

Fingerprint allReduce(int64_t n) {
  return FingerprintBuilder(Op::AllReduce)
      .meta(at::kFloat, {n}, CPU)
      .reduceOp(c10d::ReduceOp(c10d::ReduceOp::SUM))
      .finish();
}

EntryView entry(uint64_t id, uint64_t seq, const std::string& op, const std::string& state) {
  EntryView e;
  e.id = id;
  e.seq = seq;
  e.op = *opFromName(op);
  e.text = op + "(...)";
  e.state = *enumFromName<EntryState>(state);
  return e;
}

// A snapshot exercising every field, with values that do not fit in 63 bits
// where the format allows it.
RankSnapshot sampleSnapshot() {
  RankSnapshot s;
  s.rank = 5;
  s.pid = 4242;
  s.hostname = "node-3";
  s.software = "torch 2.13.0, torch_ext 0.1.0, Python 3.11.7";
  s.timeNs = 1700000000123456789;
  s.incident = "hang:57";
  s.config = "check=async";
  s.storeHealth = StoreHealth::NotAnswering;
  s.storeLost = "the store at 10.0.0.1:29500 (hosted by rank 0's process) does not answer";
  s.storeHostRank = 0;
  s.main.available = true;
  s.main.note = "main thread holds the GIL";
  s.main.frames = {Frame{"/home/u/data.py", 33, "next_batch"}, Frame{"/home/u/train.py", 120, "main"}};

  GroupView g;
  g.name = "3";
  g.desc = "tp_group";
  g.rank = 1;
  g.size = 2;
  g.globalRanks = {4, 5};
  g.lastSeq = 57;
  g.lastCompletedSeq = 56;
  g.lastCompletedNs = 1700000000000000000;
  g.rolling = 0xfedcba9876543210ULL;
  g.timeoutMs = 600000;

  EntryView c;
  c.id = 90;
  c.seq = 57;
  c.op = Op::AllReduce;
  c.device = "cuda";
  c.text = "all_reduce(float32[10, 2], SUM)";
  c.reduceOp = "SUM";
  c.dtypes = {"float32"};
  c.sizes = {{10, 2}};
  c.hash = 0x8000000000000001ULL;
  c.rolling = 0xfedcba9876543210ULL;
  c.splitSend = 1;
  c.splitRecv = 2;
  c.state = EntryState::Scheduled;
  c.startNs = 1700000000100000000;
  c.frames = {Frame{"/home/u/train.py", 77, "training_step"}};
  g.entries.push_back(c);

  EntryView p;
  p.id = 91;
  p.seq = 0;
  p.p2pOrdinal = 3;
  p.op = Op::Send;
  p.text = "send(int64[4], dst=0, tag=7)";
  p.isP2P = true;
  p.peer = 0;
  p.tag = 7;
  p.dtypes = {"int64", "float16"};
  p.sizes = {{4}, {}};
  p.hash = 12;
  p.rolling = 0xfedcba9876543210ULL;
  p.pairHash = 0xffffffffffffffffULL;
  p.state = EntryState::Failed;
  p.startNs = 1700000000200000000;
  p.endNs = 1700000000300000000;
  p.error = "peer \"0\" closed\nthe connection";
  g.entries.push_back(p);
  s.groups.push_back(g);

  GroupView empty;
  empty.name = "0";
  empty.desc = "undefined";
  empty.globalRanks = {5};
  s.groups.push_back(empty);
  return s;
}

void expectSameFrames(const std::vector<Frame>& a, const std::vector<Frame>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].filename, b[i].filename);
    EXPECT_EQ(a[i].line, b[i].line);
    EXPECT_EQ(a[i].function, b[i].function);
  }
}

void expectSameEntry(const EntryView& a, const EntryView& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.seq, b.seq);
  EXPECT_EQ(a.p2pOrdinal, b.p2pOrdinal);
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.isP2P, b.isP2P);
  EXPECT_EQ(a.peer, b.peer);
  EXPECT_EQ(a.tag, b.tag);
  EXPECT_EQ(a.reduceOp, b.reduceOp);
  EXPECT_EQ(a.dtypes, b.dtypes);
  EXPECT_EQ(a.sizes, b.sizes);
  EXPECT_EQ(a.hash, b.hash);
  EXPECT_EQ(a.rolling, b.rolling);
  EXPECT_EQ(a.pairHash, b.pairHash);
  EXPECT_EQ(a.splitSend, b.splitSend);
  EXPECT_EQ(a.splitRecv, b.splitRecv);
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.startNs, b.startNs);
  EXPECT_EQ(a.endNs, b.endNs);
  EXPECT_EQ(a.error, b.error);
  expectSameFrames(a.frames, b.frames);
}

void expectSameGroup(const GroupView& a, const GroupView& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.desc, b.desc);
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.size, b.size);
  EXPECT_EQ(a.globalRanks, b.globalRanks);
  EXPECT_EQ(a.lastSeq, b.lastSeq);
  EXPECT_EQ(a.lastCompletedSeq, b.lastCompletedSeq);
  EXPECT_EQ(a.lastCompletedNs, b.lastCompletedNs);
  EXPECT_EQ(a.rolling, b.rolling);
  EXPECT_EQ(a.timeoutMs, b.timeoutMs);
  ASSERT_EQ(a.entries.size(), b.entries.size());
  for (size_t i = 0; i < a.entries.size(); ++i) expectSameEntry(a.entries[i], b.entries[i]);
}

std::string validDump() {
  return toJson(sampleSnapshot()).dump();
}

// `text` with the first occurrence of `from` replaced by `to` (which must exist).
std::string edited(const std::string& text, const std::string& from, const std::string& to) {
  auto pos = text.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  if (pos == std::string::npos) return text;
  return text.substr(0, pos) + to + text.substr(pos + from.size());
}

std::string loadError(const std::string& text) {
  try {
    snapshotFromJson(Json::parse(text));
  } catch (const JsonError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Snapshot, RoundTripsThroughJson) {
  const RankSnapshot s = sampleSnapshot();
  const std::string text = toJson(s).dump();
  const RankSnapshot back = snapshotFromJson(Json::parse(text));
  EXPECT_EQ(back.version, "torch_ext-1");
  EXPECT_EQ(back.rank, s.rank);
  EXPECT_EQ(back.pid, s.pid);
  EXPECT_EQ(back.hostname, s.hostname);
  EXPECT_EQ(back.software, s.software);
  EXPECT_EQ(back.timeNs, s.timeNs);
  EXPECT_EQ(back.incident, s.incident);
  EXPECT_EQ(back.config, s.config);
  EXPECT_EQ(back.storeHealth, StoreHealth::NotAnswering);
  EXPECT_EQ(back.storeLost, s.storeLost);
  EXPECT_EQ(back.storeHostRank, 0);
  EXPECT_EQ(back.main.available, true);
  EXPECT_EQ(back.main.note, s.main.note);
  expectSameFrames(back.main.frames, s.main.frames);
  ASSERT_EQ(back.groups.size(), 2u);
  expectSameGroup(back.groups[0], s.groups[0]);
  expectSameGroup(back.groups[1], s.groups[1]);
  // And the JSON is stable across a second trip.
  EXPECT_EQ(toJson(back).dump(), text);
}

TEST(Snapshot, JsonUsesFlightRecorderFieldNames) {
  const RankSnapshot s = sampleSnapshot();
  const Json j = toJson(s);
  EXPECT_EQ(j.at("version").asString(), "torch_ext-1");
  EXPECT_EQ(j.at("main_thread").at("frames").asArray()[0].at("name").asString(), "next_batch");
  EXPECT_EQ(j.at("pg_config").at("3").at("desc").asString(), "tp_group");
  EXPECT_EQ(j.at("pg_config").at("3").at("ranks").dump(), "[4,5]");
  const Json& g = j.at("groups").asArray()[0];
  EXPECT_EQ(g.at("rolling_hash").asString(), "fedcba9876543210");
  const Json& c = g.at("entries").asArray()[0];
  EXPECT_EQ(c.at("record_id").asInt(), 90);
  EXPECT_EQ(c.at("pg_id").asString(), "3");
  EXPECT_EQ(c.at("process_group").dump(), R"(["3","tp_group"])");
  EXPECT_EQ(c.at("collective_seq_id").asInt(), 57);
  EXPECT_EQ(c.at("p2p_seq_id").asInt(), 0);
  EXPECT_EQ(c.at("profiling_name").asString(), "guard:all_reduce");
  EXPECT_EQ(c.at("device").asString(), "cuda");
  EXPECT_EQ(c.at("input_sizes").dump(), "[[10,2]]");
  EXPECT_EQ(c.at("input_dtypes").dump(), R"(["float32"])");
  EXPECT_EQ(c.at("state").asString(), "scheduled");
  EXPECT_TRUE(c.at("time_discovered_completed_ns").isNull());
  EXPECT_TRUE(c.at("duration_ms").isNull());
  EXPECT_EQ(c.at("timeout_ms").asInt(), 600000);
  EXPECT_FALSE(c.at("retired").asBool());
  EXPECT_FALSE(c.at("is_p2p").asBool());
  EXPECT_EQ(c.at("hash").asString(), "8000000000000001");
  EXPECT_EQ(c.at("split_send").asString(), "0000000000000001");
  EXPECT_EQ(c.at("frames").asArray()[0].at("filename").asString(), "/home/u/train.py");
  EXPECT_EQ(c.at("frames").asArray()[0].at("line").asInt(), 77);
  EXPECT_EQ(c.get("error"), nullptr);  // only written when there is one
  const Json& p = g.at("entries").asArray()[1];
  EXPECT_TRUE(p.at("retired").asBool());
  EXPECT_TRUE(p.at("is_p2p").asBool());
  EXPECT_EQ(p.at("p2p_seq_id").asInt(), 3);
  EXPECT_EQ(p.at("pair_hash").asString(), "ffffffffffffffff");
  EXPECT_EQ(p.at("time_discovered_completed_ns").asInt(), 1700000000300000000);
  EXPECT_DOUBLE_EQ(p.at("duration_ms").asDouble(), 100.0);
  EXPECT_EQ(p.at("error").asString(), "peer \"0\" closed\nthe connection");
  // The second group has no desc: its label is the name.
  EXPECT_EQ(j.at("groups").asArray()[1].at("entries").asArray().size(), 0u);
}

TEST(Snapshot, ViewsOfARealGroupState) {
  auto st = makeGroup(GroupIdentity{"7", 1, 3, {2, 4, 6}});
  st->setDesc("pipeline");
  const uint32_t here = site("/work/proj/train.py", 120, "training_step");
  uint64_t seq = 0, ord = 0;
  const uint64_t c1 = st->ledger().record(allReduce(10), here, &seq);
  const uint64_t s1 =
      st->ledger().record(FingerprintBuilder(Op::Send).meta(at::kFloat, {4}, CPU).peer(2, 3).finish(), 0, &seq, &ord);
  const uint64_t c2 = st->ledger().record(allReduce(20), here, &seq);
  st->ledger().complete(c1, true);
  st->ledger().complete(s1, false, "boom");

  GroupView g = groupView(*st, 10);
  EXPECT_EQ(g.name, "7");
  EXPECT_EQ(g.desc, "pipeline");
  EXPECT_EQ(g.label(), "pipeline");
  EXPECT_EQ(g.rank, 1);
  EXPECT_EQ(g.size, 3);
  EXPECT_EQ(g.globalRanks, (std::vector<int64_t>{2, 4, 6}));
  EXPECT_EQ(g.globalRank(2), 6);
  EXPECT_EQ(g.globalRank(7), 7);  // out of range: passed through
  EXPECT_EQ(g.lastSeq, 2u);
  EXPECT_EQ(g.lastCompletedSeq, 1u);
  EXPECT_GT(g.lastCompletedNs, 0);
  EXPECT_EQ(g.rolling, *st->ledger().rollingAt(2));
  EXPECT_EQ(g.timeoutMs, 5000);
  ASSERT_EQ(g.entries.size(), 3u);

  const EntryView& e1 = g.entries[0];
  EXPECT_EQ(e1.id, c1);
  EXPECT_EQ(e1.seq, 1u);
  EXPECT_EQ(e1.op, Op::AllReduce);
  EXPECT_EQ(e1.device, "cpu");
  EXPECT_EQ(e1.text, "all_reduce(float32[10], SUM)");
  EXPECT_FALSE(e1.isP2P);
  EXPECT_EQ(e1.reduceOp, "SUM");
  EXPECT_EQ(e1.dtypes, (std::vector<std::string>{"float32"}));
  EXPECT_EQ(e1.sizes, (std::vector<std::vector<int64_t>>{{10}}));
  EXPECT_EQ(e1.hash, allReduce(10).hash);
  EXPECT_EQ(e1.pairHash, 0u);
  EXPECT_EQ(e1.state, EntryState::Completed);
  EXPECT_EQ(e1.where(), "train.py:120 in training_step");

  const EntryView& e2 = g.entries[1];
  EXPECT_TRUE(e2.isP2P);
  EXPECT_EQ(e2.p2pOrdinal, 1u);
  EXPECT_EQ(e2.peer, 2);
  EXPECT_EQ(e2.tag, 3);
  EXPECT_EQ(e2.reduceOp, "");
  EXPECT_EQ(e2.pairHash, FingerprintBuilder(Op::Recv).meta(at::kFloat, {2, 2}, CPU).peer(1, 3).finish().p2pPairHash());
  EXPECT_EQ(e2.state, EntryState::Failed);
  EXPECT_EQ(e2.error, "boom");
  EXPECT_EQ(e2.where(), "(unknown call site)");
  EXPECT_EQ(g.entries[2].id, c2);
  EXPECT_EQ(g.entries[2].state, EntryState::Scheduled);

  EXPECT_EQ(g.bySeq(2), &g.entries[2]);
  EXPECT_EQ(g.bySeq(0), nullptr);  // p2p entries have no seq
  EXPECT_EQ(g.bySeq(3), nullptr);
  EXPECT_EQ(g.oldestPending(), &g.entries[2]);
  // The window is the newest entries.
  GroupView w = groupView(*st, 2);
  ASSERT_EQ(w.entries.size(), 2u);
  EXPECT_EQ(w.entries[0].id, s1);
  // And the view survives the JSON trip.
  expectSameGroup(groupFromJson(Json::parse(toJson(g).dump())), g);

  // Identity ranks when torch gave no list.
  auto plain = makeGroup(GroupIdentity{"0", 0, 2, {}});
  EXPECT_EQ(groupView(*plain, 4).globalRanks, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(groupView(*plain, 4).label(), "0");
  {
    SCOPED_TRACE("GroupLookupAndLabels");
    RankSnapshot s = sampleSnapshot();
    ASSERT_NE(s.group("3"), nullptr);
    EXPECT_EQ(s.group("3")->label(), "tp_group");
    EXPECT_EQ(s.group("0")->label(), "0");  // "undefined" is no description
    EXPECT_EQ(s.group("nope"), nullptr);
    GroupView g;
    g.entries = {entry(1, 1, "all_reduce", "completed"), entry(2, 2, "barrier", "failed"),
                 entry(3, 3, "barrier", "scheduled")};
    EXPECT_EQ(g.oldestPending()->id, 3u);  // failed is not pending
    g.entries[2].state = EntryState::Completed;
    EXPECT_EQ(g.oldestPending(), nullptr);
  }
}

TEST(Snapshot, ValidationNamesTheProblem) {
  const std::string ok = validDump();
  ASSERT_EQ(loadError(ok), "(no error)");
  EXPECT_EQ(loadError("[1]"), "top level must be an object");
  EXPECT_EQ(loadError(edited(ok, R"("version":"torch_ext-1",)", "")), "no 'version' field: not a torch_ext dump");
  EXPECT_EQ(loadError(edited(ok, R"("version":"torch_ext-1")", R"("version":1)")),
            "no 'version' field: not a torch_ext dump");
  EXPECT_EQ(loadError(edited(ok, R"("version":"torch_ext-1")", R"("version":"2.10")")),
            "version '2.10' is not torch_ext-1 (written by another torch_ext?)");
  EXPECT_EQ(loadError(edited(ok, R"("rank":5)", R"("rank":"5")")), "rank must be an integer, got string");
  EXPECT_EQ(loadError(edited(ok, R"("time_ns":1700000000123456789,)", "")), "missing field 'time_ns'");
  EXPECT_EQ(loadError(edited(ok, R"("available":true)", R"("available":"yes")")),
            "main_thread.available must be a bool, got string");
  EXPECT_EQ(loadError(edited(ok, R"("groups":[)", R"("groups":7,"x":[)")), "groups must be an array, got number");
  // Group fields.
  EXPECT_EQ(loadError(edited(ok, R"("rank":1,"size":2)", R"("rank":2,"size":2)")),
            "group '3' has rank 2 outside size 2");
  EXPECT_EQ(loadError(edited(ok, R"("rank":1,"size":2)", R"("rank":-1,"size":2)")),
            "group '3' has rank -1 outside size 2");
  EXPECT_EQ(loadError(edited(ok, R"("rank":0,"size":1)", R"("rank":0,"size":0)")),
            "group '0' has rank 0 outside size 0");
  EXPECT_EQ(loadError(edited(ok, R"("name":"3","desc":"tp_group","rank":1)", R"("name":3,"desc":"tp_group","rank":1)")),
            "group name must be a string, got number");
  EXPECT_EQ(
      loadError(edited(ok, R"("rolling_hash":"fedcba9876543210","timeout_ms")", R"("rolling_hash":"zz","timeout_ms")")),
      "rolling_hash must be a hex string of up to 16 digits, got 'zz'");
  // Entry fields.
  EXPECT_EQ(loadError(edited(ok, R"("op":"all_reduce")", R"("op":"allreduce")")), "unknown op 'allreduce'");
  EXPECT_EQ(loadError(edited(ok, R"("state":"scheduled")", R"("state":"running")")),
            "entry state must be scheduled, completed or failed, got 'running'");
  EXPECT_EQ(loadError(edited(ok, R"("state":"scheduled")", R"("state":1)")), "state must be a string, got number");
  EXPECT_EQ(loadError(edited(ok, R"("is_p2p":false)", R"("is_p2p":0)")), "is_p2p must be a bool, got number");
  EXPECT_EQ(loadError(edited(ok, R"("hash":"8000000000000001")", R"("hash":"0x8000000000000001")")),
            "hash must be a hex string of up to 16 digits, got '0x8000000000000001'");
  EXPECT_EQ(loadError(edited(ok, R"("input_sizes":[[10,2]])", R"("input_sizes":[10])")),
            "input_sizes entry must be an array, got number");
  EXPECT_EQ(loadError(edited(ok, R"("line":77)", R"("line":"77")")), "frame line must be an integer, got string");
  EXPECT_EQ(loadError(edited(ok, R"("record_id":90,)", "")), "missing field 'record_id'");
  // "device" came later: dumps without it still load, with an empty device.
  const std::string noDevice = edited(ok, R"("device":"cuda",)", "");
  ASSERT_EQ(loadError(noDevice), "(no error)");
  EXPECT_EQ(snapshotFromJson(Json::parse(noDevice)).groups[0].entries[0].device, "");
  {
    SCOPED_TRACE("Hex64");
    EXPECT_EQ(hex64(0), "0000000000000000");
    EXPECT_EQ(hex64(0xabcULL), "0000000000000abc");
    EXPECT_EQ(hex64(~0ULL), "ffffffffffffffff");
    EXPECT_EQ(parseHex64("ffffffffffffffff", "h"), ~0ULL);
    EXPECT_EQ(parseHex64("ABC", "h"), 0xabcULL);
    EXPECT_EQ(parseHex64(hex64(0x0123456789abcdefULL), "h"), 0x0123456789abcdefULL);
    auto err = [](const std::string& s) {
      try {
        parseHex64(s, "rolling_hash");
      } catch (const JsonError& e) {
        return std::string(e.what());
      }
      return std::string("(no error)");
    };
    EXPECT_EQ(err(""), "rolling_hash must be a hex string of up to 16 digits, got ''");
    EXPECT_EQ(err("10000000000000000"),
              "rolling_hash must be a hex string of up to 16 digits, got '10000000000000000'");
    EXPECT_EQ(err("12xy"), "rolling_hash must be a hex string of up to 16 digits, got '12xy'");
    EXPECT_EQ(err("-1"), "rolling_hash must be a hex string of up to 16 digits, got '-1'");
    EXPECT_EQ(err(" 1"), "rolling_hash must be a hex string of up to 16 digits, got ' 1'");
  }
}

namespace {

std::string readText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

DumpStatus statusIn(const std::string& path) {
  const RankSnapshot s = snapshotFromJson(Json::parse(readText(path)));
  EXPECT_TRUE(s.status.has_value()) << path;
  return s.status.value_or(DumpStatus{});
}

// A fresh folder for a test's dump files ("" if it cannot be made).
std::string dumpDir() {
  char tmpl[] = "/tmp/torch_ext_dumpfile_XXXXXX";
  return mkdtemp(tmpl) != nullptr ? std::string(tmpl) : std::string();
}

// Rank 0's snapshot of `st` as of now.
RankSnapshot rank0Snapshot(GroupState& st) {
  RankSnapshot snap;
  snap.rank = 0;
  snap.timeNs = wallNs();
  snap.groups.push_back(groupView(st, 16));
  return snap;
}

}  // namespace

TEST(DumpFile, FollowsTheJobWaitingRecoveredFinished) {
  const std::string dir = dumpDir();
  ASSERT_FALSE(dir.empty());
  auto st = makeGroup(GroupIdentity{"0", 0, 2, {}});
  uint64_t seq = 0;
  st->ledger().complete(st->ledger().record(allReduce(1), 0, &seq), true);  // #1
  const uint64_t c2 = st->ledger().record(allReduce(8), 0, &seq);           // #2: waits
  const RankSnapshot snap = rank0Snapshot(*st);
  DumpFile file;
  std::string error;
  const std::string path = file.write(dir, snap, DumpCause::WarnAfter, {DumpWatch{st, 2, 0}}, false, &error);
  ASSERT_EQ(path, dir + "/rank0.json") << error;
  DumpStatus s = statusIn(path);
  EXPECT_EQ(s.cause, DumpCause::WarnAfter);
  EXPECT_EQ(s.state, DumpState::Waiting);
  EXPECT_EQ(s.stateNs, snap.timeNs);
  EXPECT_EQ(s.recoveredNs, 0);
  ASSERT_EQ(s.awaited.size(), 1u);
  EXPECT_EQ(s.awaited[0].group, "0");
  EXPECT_EQ(s.awaited[0].seq, 2u);
  const std::string waitingText = readText(path);
  EXPECT_NE(waitingText.find(R"("written_at":"warn_after","state":"waiting")"), std::string::npos) << waitingText;

  file.update();  // #2 still pending: nothing changes
  EXPECT_EQ(readText(path), waitingText);
  file.finish();  // a waiting dump is never finished
  EXPECT_EQ(statusIn(path).state, DumpState::Waiting);

  st->ledger().complete(c2, true);  // the hang resolves
  file.update();
  s = statusIn(path);
  EXPECT_EQ(s.state, DumpState::Recovered);
  EXPECT_GE(s.recoveredNs, snap.timeNs);
  EXPECT_EQ(s.stateNs, s.recoveredNs);
  // The ledgers still show the moment of the report.
  const RankSnapshot kept = snapshotFromJson(Json::parse(readText(path)));
  ASSERT_EQ(kept.groups.at(0).entries.size(), 2u);
  EXPECT_EQ(kept.groups[0].entries[1].state, EntryState::Scheduled);

  file.finish();
  const DumpStatus done = statusIn(path);
  EXPECT_EQ(done.state, DumpState::Finished);
  EXPECT_EQ(done.recoveredNs, s.recoveredNs);
  EXPECT_GE(done.stateNs, s.recoveredNs);
  // Round trip of the whole status, and a state that is not one.
  const std::string text = readText(path);
  EXPECT_EQ(toJson(snapshotFromJson(Json::parse(text))).dump() + "\n", text);
  EXPECT_EQ(loadError(edited(text, R"("state":"finished")", R"("state":"done")")),
            "state must be running, waiting, failed, recovered or finished, got 'done'");

  // A watched group that fails turns a waiting dump into a failed one; a failure
  // cause is failed from the start, and nothing pending is "running".
  auto other = makeGroup(GroupIdentity{"1", 0, 2, {}});
  other->ledger().record(allReduce(2), 0, &seq);
  ASSERT_FALSE(file.write(dir, snap, DumpCause::Manual, {DumpWatch{other, 0, 1}}, false, &error).empty());
  EXPECT_EQ(statusIn(path).state, DumpState::Waiting);
  EXPECT_EQ(statusIn(path).cause, DumpCause::Manual);
  other->fail(GuardErrorKind::Timeout, "timeout");
  file.update();
  EXPECT_EQ(statusIn(path).state, DumpState::Failed);
  file.finish();
  EXPECT_EQ(statusIn(path).state, DumpState::Failed);
  ASSERT_FALSE(file.write(dir, snap, DumpCause::AbortAfter, {DumpWatch{st, 2, 0}}, false, &error).empty());
  EXPECT_EQ(statusIn(path).state, DumpState::Failed);
  ASSERT_FALSE(file.write(dir, snap, DumpCause::Manual, {}, false, &error).empty());
  EXPECT_EQ(statusIn(path).state, DumpState::Running);
  file.finish();
  EXPECT_EQ(statusIn(path).state, DumpState::Finished);
  std::remove(path.c_str());
  rmdir(dir.c_str());
}

// The first failure is the dump's story: what follows it (a peer's exit failing an in-flight
// collective, the store's host gone) does not replace it; an asked-for dump does.
TEST(DumpFile, KeepsTheFirstFailureAgainstLaterAutomaticWrites) {
  const std::string dir = dumpDir();
  ASSERT_FALSE(dir.empty());
  auto st = makeGroup(GroupIdentity{"0", 0, 2, {}});
  uint64_t seq = 0;
  st->ledger().record(allReduce(4), 0, &seq);  // #1: waits
  const RankSnapshot first = rank0Snapshot(*st);
  DumpFile file;
  std::string error;
  // A hang seen at warn_after (waiting), then its group fails before the next tick.
  const std::string path = file.write(dir, first, DumpCause::WarnAfter, {DumpWatch{st, 1, 0}}, false, &error);
  ASSERT_EQ(path, dir + "/rank0.json") << error;
  st->fail(GuardErrorKind::Deadlock, "deadlock");
  RankSnapshot later = first;
  later.timeNs = first.timeNs + 1000;
  for (DumpCause c : {DumpCause::Failure, DumpCause::StoreLost, DumpCause::AbortAfter, DumpCause::Terminated}) {
    EXPECT_EQ(file.write(dir, later, c, {DumpWatch{st, 1, 0}}, true, &error), path);
    const DumpStatus s = statusIn(path);
    EXPECT_EQ(s.cause, DumpCause::WarnAfter) << enumName(c);
    EXPECT_EQ(s.state, DumpState::Failed) << enumName(c);
    EXPECT_EQ(snapshotFromJson(Json::parse(readText(path))).timeNs, first.timeNs) << enumName(c);
  }
  ASSERT_FALSE(file.write(dir, later, DumpCause::Manual, {}, false, &error).empty());
  EXPECT_EQ(statusIn(path).cause, DumpCause::Manual);
  std::remove(path.c_str());
  rmdir(dir.c_str());
}

// Live reports carry the other Python threads' stacks; other snapshots write no "threads" field.
TEST(Snapshot, OtherThreadsRoundTripAndAreOptional) {
  RankSnapshot s;
  s.rank = 3;
  s.timeNs = 7;
  EXPECT_EQ(toJson(s).get("threads"), nullptr);
  ThreadStack t;
  t.id = 0x7f00deadbeefULL;
  t.name = "data_loader";
  t.frames.push_back(Frame{"/x/train.py", 47, "_loader", ""});
  t.frames.push_back(Frame{"/usr/lib/python3.11/threading.py", 982, "run", "stdlib"});
  s.threads.push_back(t);
  RankSnapshot back = snapshotFromJson(Json::parse(toJson(s).dump()));
  ASSERT_EQ(back.threads.size(), 1u);
  EXPECT_EQ(back.threads[0].id, t.id);
  EXPECT_EQ(back.threads[0].name, "data_loader");
  ASSERT_EQ(back.threads[0].frames.size(), 2u);
  EXPECT_EQ(back.threads[0].frames[0].function, "_loader");
  EXPECT_EQ(back.threads[0].frames[1].library, "stdlib");
}

namespace {

// Rank `rank` of a 3-rank job, waiting in collective #4, its store as `health`.
RankSnapshot waitingIn4(int64_t rank, StoreHealth health) {
  RankSnapshot s;
  s.rank = rank;
  s.timeNs = 1700000000000000000;
  s.incident = "store_lost";
  s.storeHostRank = 0;
  s.storeHealth = health;
  if (health != StoreHealth::Healthy) s.storeLost = "the store at 127.0.0.1:29500 (hosted by rank 0's process) is gone";
  GroupView g;
  g.name = "0";
  g.rank = static_cast<int>(rank);
  g.size = 3;
  g.lastSeq = 4;
  g.lastCompletedSeq = 3;
  g.timeoutMs = 600000;
  EntryView e = entry(4, 4, "all_reduce", "scheduled");
  e.startNs = s.timeNs - 1000000000;
  g.entries.push_back(e);
  s.groups.push_back(g);
  return s;
}

}  // namespace

// Dumps written at the store's loss name its host among the absent ranks, and
// the finding carries who hosted it and how it was lost (what --repro replays).
TEST(DumpAnalysis, DumpsAtAStoreLossNameItsHost) {
  auto findings = analyzeDumps({waitingIn4(1, StoreHealth::Lost), waitingIn4(2, StoreHealth::Lost)});
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].storeLostHost, 0);
  EXPECT_EQ(findings[0].storeHealth, StoreHealth::Lost);
  EXPECT_EQ(findings[0].verdict.gone, (std::vector<int64_t>{0}));
  EXPECT_NE(findings[0].verdict.text.find("rank 0: no heartbeat (process gone or frozen); the store its process "
                                          "hosts was lost: the store at 127.0.0.1:29500"),
            std::string::npos)
      << findings[0].verdict.text;
  // A store that answered: no host named, no word of a loss.
  auto healthy = analyzeDumps({waitingIn4(1, StoreHealth::Healthy), waitingIn4(2, StoreHealth::Healthy)});
  ASSERT_EQ(healthy.size(), 1u);
  EXPECT_EQ(healthy[0].storeLostHost, -1);
  EXPECT_EQ(healthy[0].verdict.text.find("store"), std::string::npos) << healthy[0].verdict.text;
  // A dump whose store health is not one: refused, naming the field.
  Json j = toJson(waitingIn4(1, StoreHealth::Lost));
  j.set("store_health", "melted");
  try {
    snapshotFromJson(j);
    FAIL() << "accepted store_health 'melted'";
  } catch (const JsonError& e) {
    EXPECT_NE(std::string(e.what()).find("store_health 'melted'"), std::string::npos) << e.what();
  }
}

// A pipeline stage's recv ended by a deadlock's verdict before its dump was
// written: the dumps hold it failed, not pending, and the group's verdict is
// still the hang the live report gave (not "nothing pending"), whichever the
// dump caught.
TEST(DumpAnalysis, ASendRecvThatFailedBeforeTheDumpIsStillTheGroupsHang) {
  for (const char* state : {"scheduled", "failed"}) {
    SCOPED_TRACE(state);
    std::vector<RankSnapshot> snaps(2);
    for (int r = 0; r < 2; ++r) {
      RankSnapshot& s = snaps[r];
      s.rank = r;
      s.timeNs = 1700000000000000000;
      s.incident = "hang:1";
      GroupView g;
      g.name = "pp";
      g.rank = r;
      g.size = 2;
      g.timeoutMs = 600000;
      if (r == 0) {  // rank 0 receives from rank 1, which never sends (it waits elsewhere)
        EntryView e = entry(7, 0, "recv", state);
        e.isP2P = true;
        e.peer = 1;
        e.p2pOrdinal = 1;
        e.startNs = s.timeNs - 2000000000;
        g.entries.push_back(e);
      }
      s.groups.push_back(g);
    }
    auto findings = analyzeDumps(snaps);
    ASSERT_EQ(findings.size(), 1u);
    EXPECT_TRUE(findings[0].pending);
    EXPECT_EQ(findings[0].verdict.kind, Verdict::Kind::Hang) << findings[0].verdict.text;
    EXPECT_EQ(findings[0].verdict.waiting, (std::vector<int64_t>{0})) << findings[0].verdict.text;
    EXPECT_EQ(findings[0].verdict.notArrived, (std::vector<int64_t>{1})) << findings[0].verdict.text;
  }
}

}  // namespace test_snapshot
