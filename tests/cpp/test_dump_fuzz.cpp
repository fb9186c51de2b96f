// Fuzzing the post-mortem's input path: the JSON reader (Json::parse) and the
// dump reader (readDump), then the cross-rank analysis (analyzeDumps) on sets
// of edited dumps. Dumps come from disk, possibly truncated, edited or
// hostile; every input must end in a valid snapshot or in a JsonError /
// DumpError that names the file and what is wrong: never a crash, a hang,
// another exception type, or memory out of proportion to the input.
//
// Random cases use std::mt19937 with fixed seeds, so a failure reproduces.
// Work that could hang (analysis of hostile seqs and group counts) runs on a
// thread of its own with a bound: a hang fails the test instead of stalling
// the suite.
#include "guard/report/DumpAnalysis.h"
#include "guard/report/Json.h"
#include "guard/report/Snapshot.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

using namespace torch_ext;

namespace test_dump_fuzz {

namespace {

constexpr const char* kFile = "rank7.json";

// --- helpers ---------------------------------------------------------------

// `s` for a failure message: non-printable bytes as \xNN, at most `max` chars.
std::string printable(const std::string& s, size_t max = 160) {
  std::string out;
  for (size_t i = 0; i < s.size() && out.size() < max; ++i) {
    const auto u = static_cast<unsigned char>(s[i]);
    if (u >= 0x20 && u < 0x7f) {
      out += s[i];
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", u);
      out += buf;
    }
  }
  if (out.size() >= max) out += "...(" + std::to_string(s.size()) + " bytes)";
  return out;
}

// Runs `fn` on a thread of its own and waits up to `limit` for it. Returns
// fn's problems, or one saying it did not finish: the thread is then left
// running (detached), so that a hang fails this test instead of the suite.
std::vector<std::string> runBounded(std::chrono::seconds limit, std::function<std::vector<std::string>()> fn) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::vector<std::string> problems;
  };
  auto sh = std::make_shared<Shared>();
  std::thread([sh, fn = std::move(fn)] {
    std::vector<std::string> p;
    try {
      p = fn();
    } catch (const std::exception& e) {
      p.push_back(std::string("escaped ") + typeid(e).name() + ": " + e.what());
    } catch (...) {
      p.push_back("escaped a non-std exception");
    }
    std::lock_guard<std::mutex> lock(sh->mu);
    sh->problems = std::move(p);
    sh->done = true;
    sh->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(sh->mu);
  if (!sh->cv.wait_for(lock, limit, [&] { return sh->done; })) {
    return {"did not finish within " + std::to_string(limit.count()) + " s (a hang, or cost out of proportion)"};
  }
  return sh->problems;
}

std::string joined(const std::vector<std::string>& problems, size_t max = 12) {
  std::string out;
  for (size_t i = 0; i < problems.size() && i < max; ++i) out += "\n  " + problems[i];
  if (problems.size() > max) out += "\n  ... and " + std::to_string(problems.size() - max) + " more";
  return out;
}

// What readDump made of one input.
struct Outcome {
  bool valid = false;
  RankSnapshot snap;
  std::string reason;   // DumpError::reason()
  std::string problem;  // non-empty: the input broke the contract
};

Outcome load(const std::string& text, const std::string& name = kFile) {
  Outcome o;
  try {
    o.snap = readDump(DumpInput{name, text});
    o.valid = true;
  } catch (const DumpError& e) {
    const std::string what = e.what();  // as a caller sees it: up to the first NUL
    o.reason = e.reason();
    if (e.file() != name || what.rfind(name + ": ", 0) != 0) {
      o.problem = "DumpError does not start with the file name: " + printable(what);
    } else if (what.size() <= name.size() + 2 || o.reason.empty()) {
      o.problem = "DumpError says nothing: '" + printable(what) + "'";
    }
  } catch (const std::exception& e) {
    o.problem = std::string("wrong exception type ") + typeid(e).name() + ": " + printable(e.what());
  } catch (...) {
    o.problem = "a non-std exception";
  }
  return o;
}

std::vector<std::string> groupNames(const std::vector<RankSnapshot>& snaps) {
  std::set<std::string> names;
  for (const auto& s : snaps) {
    for (const auto& g : s.groups) names.insert(g.name);
  }
  return {names.begin(), names.end()};
}

// analyzeDumps returns one finding per group, in name order, each with a text.
std::string checkFindings(const std::vector<RankSnapshot>& snaps, std::vector<GroupFinding>* out = nullptr) {
  std::vector<GroupFinding> findings;
  try {
    findings = analyzeDumps(snaps);
  } catch (const std::exception& e) {
    return std::string("analyzeDumps threw ") + typeid(e).name() + ": " + e.what();
  }
  const auto names = groupNames(snaps);
  std::vector<std::string> got;
  for (const auto& f : findings) {
    got.push_back(f.groupName);
    if (f.verdict.text.empty()) return "finding for group '" + f.groupName + "' has no text";
  }
  if (got != names) {
    std::string g, n;
    for (const auto& x : got) g += "'" + x + "' ";
    for (const auto& x : names) n += "'" + x + "' ";
    return "findings for groups " + g + "but the dumps hold " + n;
  }
  if (out) *out = std::move(findings);
  return "";
}

// --- a valid dump ----------------------------------------------------------

uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

uint64_t hashOf(const std::string& text) {
  uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (unsigned char c : text) h = mix(h ^ c);
  return h;
}

EntryView collective(uint64_t id, uint64_t seq, Op op, const std::string& text, EntryState state, int64_t startNs) {
  EntryView e;
  e.id = id;
  e.seq = seq;
  e.op = op;
  e.device = "cpu";
  e.text = text;
  e.reduceOp = op == Op::AllReduce ? "SUM" : "";
  e.dtypes = {"float32"};
  e.sizes = {{8}};
  e.hash = hashOf(text);
  e.state = state;
  e.startNs = startNs;
  e.endNs = state == EntryState::Scheduled ? 0 : startNs + 1000;
  e.frames = {Frame{"/home/u/train.py", static_cast<int>(100 + seq % 7), "step"}};
  return e;
}

EntryView p2p(uint64_t id, uint64_t ordinal, Op op, int peer, int tag, int64_t numel, EntryState state,
              int64_t startNs) {
  EntryView e;
  e.id = id;
  e.p2pOrdinal = ordinal;
  e.op = op;
  e.isP2P = true;
  e.peer = peer;
  e.tag = tag;
  e.text = std::string(opName(op)) + "(float32[" + std::to_string(numel) + "], peer=" + std::to_string(peer) + ")";
  e.dtypes = {"float32"};
  e.sizes = {{numel}};
  e.hash = hashOf(e.text);
  e.pairHash = hashOf("float32/" + std::to_string(numel) + "/" + std::to_string(tag));
  e.state = state;
  e.startNs = startNs;
  e.endNs = state == EntryState::Scheduled ? 0 : startNs + 1000;
  return e;
}

// Rolling hashes as a ledger keeps them: each collective folds its hash in.
void roll(GroupView& g) {
  uint64_t r = 0;
  for (auto& e : g.entries) {
    if (!e.isP2P) r = mix(r ^ e.hash);
    e.rolling = r;
  }
  g.rolling = r;
}

// One rank's snapshot, with a collective group, a p2p group and an empty one,
// and text fields that need escaping.
RankSnapshot baseSnapshot() {
  RankSnapshot s;
  s.rank = 1;
  s.pid = 4242;
  s.hostname = "node-\"3\"\n\t\u00e9";
  s.timeNs = 1700000000123456789;
  s.incident = "hang:5";
  s.config = "check=async ledger_size=1024";
  s.main.available = true;
  s.main.note = "main thread holds the GIL";
  s.main.frames = {Frame{"/home/u/data.py", 33, "next_batch"}, Frame{"/usr/lib/torch/x.py", 9, "f", "torch"}};

  GroupView g;
  g.name = "0";
  g.desc = "default_pg";
  g.rank = 1;
  g.size = 3;
  g.globalRanks = {0, 1, 2};
  g.timeoutMs = 600000;
  const int64_t t0 = 1700000000000000000;
  for (uint64_t k = 1; k <= 4; ++k) {
    g.entries.push_back(collective(k, k, Op::AllReduce, "all_reduce(float32[8], SUM)", EntryState::Completed, t0 + k));
  }
  g.entries.push_back(collective(5, 5, Op::Barrier, "barrier()", EntryState::Scheduled, t0 + 5));
  g.entries.back().splitSend = 0xffffffffffffffffULL;
  g.lastSeq = 5;
  g.lastCompletedSeq = 4;
  g.lastCompletedNs = t0 + 4;
  roll(g);
  s.groups.push_back(g);

  GroupView pp;
  pp.name = "pp";
  pp.desc = "undefined";
  pp.rank = 1;
  pp.size = 2;
  pp.globalRanks = {0, 1};
  pp.entries.push_back(p2p(1, 1, Op::Recv, 0, 7, 16, EntryState::Completed, t0 + 1));
  pp.entries.push_back(p2p(2, 2, Op::Recv, 0, 7, 16, EntryState::Failed, t0 + 2));
  pp.entries.back().error = "peer 0 closed\nthe connection";
  s.groups.push_back(pp);

  GroupView empty;
  empty.name = "9";
  empty.globalRanks = {1};
  s.groups.push_back(empty);
  return s;
}

const std::string& baseText() {
  static const std::string text = toJson(baseSnapshot()).dump();
  return text;
}

// A valid outcome must survive its own dump (dump -> read -> dump is stable)
// and its analysis, alone and beside the base dump.
std::string checkValid(const RankSnapshot& snap) {
  for (const auto& g : snap.groups) {
    if (g.size <= 0 || g.size > kMaxDumpGroupSize || g.rank < 0 || g.rank >= g.size ||
        g.globalRanks.size() != static_cast<size_t>(g.size)) {
      return "accepted group '" + printable(g.name) + "' with rank " + std::to_string(g.rank) + ", size " +
             std::to_string(g.size) + ", " + std::to_string(g.globalRanks.size()) + " ranks listed";
    }
  }
  const std::string again = toJson(snap).dump();
  Outcome o = load(again);
  if (!o.valid) return "its own dump does not read back: " + (o.problem.empty() ? o.reason : o.problem);
  if (toJson(o.snap).dump() != again) return "dump -> read -> dump changes the text";
  if (auto p = checkFindings({snap}); !p.empty()) return p;
  if (auto p = checkFindings({snap, baseSnapshot()}); !p.empty()) return p;
  return "";
}

// `text` with the first `from` replaced by `to`.
std::string edited(const std::string& text, const std::string& from, const std::string& to) {
  const auto pos = text.find(from);
  if (pos == std::string::npos) {
    ADD_FAILURE() << "the base dump has no " << from;
    return text;
  }
  return text.substr(0, pos) + to + text.substr(pos + from.size());
}

}  // namespace

// --- the JSON reader and readDump --------------------------------------------

TEST(DumpFuzz, TheBaseDumpIsValid) {
  const Outcome o = load(baseText());
  ASSERT_TRUE(o.valid) << o.reason << o.problem;
  EXPECT_EQ(o.snap.groups.size(), 3u);
  EXPECT_EQ(checkValid(o.snap), "");
}

TEST(DumpFuzz, EveryTruncationIsADumpErrorThatSaysTruncated) {
  const std::string& text = baseText();
  std::vector<std::string> problems;
  for (size_t n = 0; n < text.size(); ++n) {
    const Outcome o = load(text.substr(0, n));
    if (!o.problem.empty()) {
      problems.push_back(std::to_string(n) + ": " + o.problem);
    } else if (o.valid) {
      problems.push_back(std::to_string(n) + ": a cut-off dump read as valid");
    } else if (o.reason.rfind("invalid JSON at byte ", 0) != 0 || o.reason.find("truncated") == std::string::npos) {
      problems.push_back(std::to_string(n) + ": " + printable(o.reason));
    }
  }
  EXPECT_TRUE(problems.empty()) << problems.size() << " of " << text.size() << " prefixes:" << joined(problems);
}

TEST(DumpFuzz, RandomByteMutationsEndInASnapshotOrANamedError) {
  auto problems = runBounded(std::chrono::seconds(60), [] {
    const std::string base = baseText();
    std::mt19937 rng(20240617);
    // Bytes that matter to a JSON reader, and some that never should appear.
    const std::string interesting = std::string("{}[],:\"\\-+.eE0123456789tfnu \n") + '\0' + "\x7f\x80\xc3\xff";
    std::vector<std::string> problems;
    int valid = 0, errors = 0;
    for (int c = 0; c < 3000; ++c) {
      std::string text = base;
      std::string what;
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int k = 0; k < edits && !text.empty(); ++k) {
        const size_t at = rng() % text.size();
        const char byte = (rng() % 2) ? interesting[rng() % interesting.size()] : static_cast<char>(rng() % 256);
        switch (rng() % 6) {
          case 0:
            text[at] = static_cast<char>(text[at] ^ (1 << (rng() % 8)));
            what += " flip@" + std::to_string(at);
            break;
          case 1:
            text[at] = byte;
            what += " set@" + std::to_string(at);
            break;
          case 2:
            text.insert(text.begin() + static_cast<std::ptrdiff_t>(at), byte);
            what += " insert@" + std::to_string(at);
            break;
          case 3:
            text.erase(at, 1 + rng() % 4);
            what += " delete@" + std::to_string(at);
            break;
          case 4: {  // a span copied elsewhere: duplicated keys, nested values
            const size_t len = 1 + rng() % 40;
            const std::string span = text.substr(rng() % text.size(), len);
            text.insert(at, span);
            what += " copy@" + std::to_string(at);
            break;
          }
          default:  // a digit run made long: numbers beyond int64 and int32
            if (text[at] >= '0' && text[at] <= '9') text.insert(at, std::string(1 + rng() % 25, text[at]));
            what += " digits@" + std::to_string(at);
            break;
        }
      }
      const Outcome o = load(text);
      const std::string tag = "case " + std::to_string(c) + " (" + what + "): ";
      if (!o.problem.empty()) {
        problems.push_back(tag + o.problem);
      } else if (o.valid) {
        ++valid;
        if (auto p = checkValid(o.snap); !p.empty()) problems.push_back(tag + p);
      } else {
        ++errors;
        if (o.reason.rfind("invalid JSON at byte ", 0) == 0) {
          // A syntax error points into the input.
          const size_t byte = std::stoull(o.reason.substr(21));
          if (byte > text.size()) problems.push_back(tag + "error past the end: " + printable(o.reason));
        }
      }
    }
    // Both outcomes are reached, so both paths were fuzzed.
    if (valid < 100) problems.push_back("only " + std::to_string(valid) + " mutated dumps were valid");
    if (errors < 1000) problems.push_back("only " + std::to_string(errors) + " mutated dumps were refused");
    return problems;
  });
  EXPECT_TRUE(problems.empty()) << joined(problems);
}

TEST(DumpFuzz, RandomJsonTextParsesOrRaisesJsonError) {
  // Short texts over JSON's alphabet: the parser alone, without the schema.
  auto problems = runBounded(std::chrono::seconds(60), [] {
    std::mt19937 rng(7);
    const std::string alphabet = std::string("{}[],:\"\\ -+.eE019tfnlrsu") + '\0' + "\xff";
    std::vector<std::string> problems;
    int parsed = 0;
    for (int c = 0; c < 5000; ++c) {
      std::string text;
      const size_t len = rng() % 24;
      for (size_t i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
      if (c % 3 == 0) text = "[" + text + "]";
      try {
        const Json j = Json::parse(text);
        ++parsed;
        const std::string d = j.dump();
        if (Json::parse(d).dump() != d) problems.push_back(printable(text) + ": dump -> parse -> dump changes");
      } catch (const JsonError& e) {
        if (std::string(e.what()).rfind("invalid JSON at byte ", 0) != 0) {
          problems.push_back(printable(text) + ": " + printable(e.what()));
        }
      } catch (const std::exception& e) {
        problems.push_back(printable(text) + std::string(": wrong exception type ") + typeid(e).name());
      }
    }
    if (parsed < 50) problems.push_back("only " + std::to_string(parsed) + " texts parsed");
    return problems;
  });
  EXPECT_TRUE(problems.empty()) << joined(problems);
}

TEST(DumpFuzz, DeepNestingIsRefusedAtTheDepthLimit) {
  const std::string limit = std::to_string(Json::kMaxDepth);
  auto parseError = [](const std::string& text) {
    try {
      Json::parse(text);
    } catch (const JsonError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  // 100,000 levels: a clear error at the first level over the limit, not a stack overflow.
  const std::string tooDeep =
      "invalid JSON at byte " + limit + ": nesting too deep: more than " + limit + " levels of arrays and objects";
  EXPECT_EQ(parseError(std::string(100000, '[')), tooDeep);
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  const std::string objectsErr = parseError(objects);
  EXPECT_NE(objectsErr.find("nesting too deep: more than " + limit), std::string::npos) << objectsErr;
  std::string mixed;
  for (int i = 0; i < 50000; ++i) mixed += "[{\"k\":";
  EXPECT_NE(parseError(mixed).find("nesting too deep"), std::string::npos);
  EXPECT_EQ(parseError(std::string(100000, ']')), "invalid JSON at byte 0: unexpected character ']'");
  // The limit itself: kMaxDepth levels parse (a scalar at the bottom too), one more does not.
  const int n = Json::kMaxDepth;
  const std::string atLimit = std::string(n, '[') + "1" + std::string(n, ']');
  EXPECT_EQ(Json::parse(atLimit).dump(), atLimit);
  const std::string overLimit = std::string(n + 1, '[') + std::string(n + 1, ']');
  EXPECT_EQ(parseError(overLimit), tooDeep);
  // Inside a dump: a DumpError naming the file and the limit.
  const Outcome o = load(edited(baseText(), R"("hostname":")", R"("hostname":)" + std::string(100000, '[') + "\""));
  EXPECT_TRUE(o.problem.empty()) << o.problem;
  ASSERT_FALSE(o.valid);
  EXPECT_NE(o.reason.find("nesting too deep: more than " + limit), std::string::npos) << o.reason;
}

TEST(DumpFuzz, HostileValuesEndInANamedErrorOrAValidSnapshot) {
  const std::string& ok = baseText();
  struct Case {
    std::string name;
    std::string text;
    std::string expect;  // a substring of the DumpError's reason; "" if it may be valid
  };
  const std::string big16(16u << 20, 'x');
  const std::vector<Case> cases = {
      // Numbers.
      {"rank beyond int64", edited(ok, R"("rank":1,)", R"("rank":123456789012345678901234567890,)"),
       "rank must be an integer that fits in 64 bits, got 1.2345678901234568e+29"},
      {"time_ns 2^63", edited(ok, R"("time_ns":1700000000123456789)", R"("time_ns":9223372036854775808)"),
       "time_ns must be an integer that fits in 64 bits"},
      {"time_ns infinite", edited(ok, R"("time_ns":1700000000123456789)", R"("time_ns":1e999)"),
       "time_ns must be an integer that fits in 64 bits, got inf"},
      {"rank -1e300", edited(ok, R"("rank":1,)", R"("rank":-1e300,)"), "rank must be an integer that fits in 64 bits"},
      {"rank 1.5", edited(ok, R"("rank":1,)", R"("rank":1.5,)"), "rank must be an integer, got number"},
      {"rank '-'", edited(ok, R"("rank":1,)", R"("rank":-,)"), "malformed number '-'"},
      {"time_ns int64 min", edited(ok, R"("time_ns":1700000000123456789)", R"("time_ns":-9223372036854775808)"), ""},
      {"a 300-digit number", edited(ok, R"("pid":4242)", R"("pid":)" + std::string(300, '9')),
       "pid must be an integer that fits in 64 bits"},
      // 32-bit fields are not wrapped.
      {"group size 2^31", edited(ok, R"("rank":1,"size":3)", R"("rank":1,"size":2147483648)"),
       "group size must fit in 32 bits, got 2147483648"},
      {"group size 2^32+3 (wraps to 3)", edited(ok, R"("rank":1,"size":3)", R"("rank":1,"size":4294967299)"),
       "group size must fit in 32 bits, got 4294967299"},
      {"group size 2^31-1", edited(ok, R"("rank":1,"size":3)", R"("rank":1,"size":2147483647)"),
       "group '0' has 2147483647 ranks, over the 262144 a dump may describe"},
      {"group rank 2^32+1 (wraps to 1)", edited(ok, R"("rank":1,"size":3)", R"("rank":4294967297,"size":3)"),
       "group rank must fit in 32 bits, got 4294967297"},
      {"negative group rank", edited(ok, R"("rank":1,"size":3)", R"("rank":-1,"size":3)"),
       "group '0' has rank -1 outside size 3"},
      {"group rank int32 min", edited(ok, R"("rank":1,"size":3)", R"("rank":-2147483648,"size":3)"),
       "group '0' has rank -2147483648 outside size 3"},
      {"negative group size", edited(ok, R"("rank":1,"size":3)", R"("rank":1,"size":-3)"),
       "group '0' has rank 1 outside size -3"},
      {"fewer ranks than the size", edited(ok, R"("size":3,"ranks":[0,1,2])", R"("size":3,"ranks":[0,1])"),
       "group '0' has size 3 but lists 2 ranks"},
      {"more ranks than the size", edited(ok, R"("size":3,"ranks":[0,1,2])", R"("size":3,"ranks":[0,1,2,3])"),
       "group '0' has size 3 but lists 4 ranks"},
      {"negative global ranks",
       edited(ok, R"("size":3,"ranks":[0,1,2])", R"("size":3,"ranks":[-5,-1,-9223372036854775808])"), ""},
      {"negative global rank of the file", edited(ok, R"("rank":1,)", R"("rank":-1,)"), ""},
      {"peer 2^32 (wraps to 0)", edited(ok, R"("peer":0)", R"("peer":4294967296)"), "peer must fit in 32 bits"},
      {"tag -2^31-1", edited(ok, R"("tag":7)", R"("tag":-2147483649)"), "tag must fit in 32 bits"},
      {"frame line 2^40", edited(ok, R"("line":33)", R"("line":1099511627776)"), "frame line must fit in 32 bits"},
      // Times are int64 ns: the analysis subtracts them ("has waited 3.0 s").
      {"a pending op created at int64 min",
       edited(ok, R"("time_created_ns":1700000000000000005)", R"("time_created_ns":-9223372036854775808)"), ""},
      {"a completed op created at int64 min",
       edited(ok, R"("time_created_ns":1700000000000000001)", R"("time_created_ns":-9223372036854775808)"), ""},
      {"last completed at int64 min",
       edited(ok, R"("last_completed_ns":1700000000000000004)", R"("last_completed_ns":-9223372036854775808)"), ""},
      {"negative seqs", edited(ok, R"("collective_seq_id":1,)", R"("collective_seq_id":-1,)"), ""},
      {"seq 2^63-1", edited(ok, R"("collective_seq_id":2,)", R"("collective_seq_id":9223372036854775807,)"), ""},
      // Strings and bytes.
      {"a 16 MiB hostname", edited(ok, R"("hostname":")", R"("hostname":")" + big16), ""},
      {"a 16 MiB unknown key", edited(ok, R"("pid":4242,)", R"("pid":4242,")" + big16 + R"(":1,)"), ""},
      {"a 16 MiB op name", edited(ok, R"("op":"all_reduce")", R"("op":")" + big16 + "\""), "unknown op 'xxx"},
      {"a raw NUL in a string", edited(ok, R"("hostname":")", std::string(R"("hostname":")") + '\0'),
       "control character in string"},
      {"a NUL between values", edited(ok, R"("pid":4242,)", std::string(R"("pid":4242,)") + '\0'),
       "expected a string key"},
      {"a NUL before a value", edited(ok, R"("pid":4242)", std::string(R"("pid":)") + '\0'),
       "unexpected character byte 0x00"},
      {"an escaped NUL", edited(ok, R"("hostname":")", R"("hostname":"\u0000)"), ""},
      {"a backslash and a NUL", edited(ok, R"("hostname":")", std::string(R"("hostname":"\)") + '\0'),
       "bad escape: a backslash followed by byte 0x00"},
      {"invalid UTF-8 in a string", edited(ok, R"("hostname":")", "\"hostname\":\"\xff\xfe\xc3"), ""},
      {"invalid UTF-8 between values", edited(ok, R"("pid":4242)", "\"pid\":\xff"), "unexpected character byte 0xff"},
      {"a lone low surrogate", edited(ok, R"("hostname":")", R"("hostname":"\udc00)"), "lone low surrogate"},
      {"a cut surrogate pair", edited(ok, R"("hostname":")", R"("hostname":"\ud800x)"),
       "high surrogate not followed by a low surrogate"},
      // Keys.
      {"duplicate keys", edited(ok, R"("rank":1,)", R"("rank":1,"rank":"one",)"), ""},
      {"duplicate versions", edited(ok, R"("version":"torch_ext-1",)", R"("version":"torch_ext-1","version":2,)"), ""},
      {"duplicate groups",
       edited(ok, R"("groups":[)",
              R"("groups":[{"name":"0","rank":0,"size":1,"ranks":[0],)"
              R"("last_seq":0,"last_completed_seq":0,"rolling_hash":"0",)"
              R"("entries":[]},)"),
       ""},
      // Not a dump at all.
      {"empty", "", "unexpected end of input (truncated?)"},
      {"whitespace", " \n\t ", "unexpected end of input (truncated?)"},
      {"null", "null", "top level must be an object"},
      {"an array", "[]", "top level must be an object"},
      {"a string", "\"torch_ext-1\"", "top level must be an object"},
      {"an empty object", "{}", "no 'version' field: not a torch_ext dump"},
      {"another version", edited(ok, R"("version":"torch_ext-1")", R"("version":"torch_ext-2")"),
       "version 'torch_ext-2' is not torch_ext-1"},
      {"a dump twice", ok + ok, "unexpected trailing characters"},
  };
  // Bounded: valid outcomes are analysed, and seqs far apart used to hang that.
  auto shared = std::make_shared<const std::vector<Case>>(cases);
  auto problems = runBounded(std::chrono::seconds(60), [shared] {
    std::vector<std::string> problems;
    for (const auto& c : *shared) {
      const Outcome o = load(c.text);
      if (!o.problem.empty()) {
        problems.push_back(c.name + ": " + o.problem);
      } else if (o.valid) {
        if (!c.expect.empty()) problems.push_back(c.name + ": read as valid; expected an error with: " + c.expect);
        if (auto p = checkValid(o.snap); !p.empty()) problems.push_back(c.name + ": " + p);
      } else if (c.expect.empty() || o.reason.find(c.expect) == std::string::npos) {
        problems.push_back(c.name + ": refused with '" + printable(o.reason) + "'" +
                           (c.expect.empty() ? "" : ", expected '" + c.expect + "'"));
      }
    }
    return problems;
  });
  EXPECT_TRUE(problems.empty()) << joined(problems, 60);
  {
    SCOPED_TRACE("what the accepted hostile values read as");
    EXPECT_EQ(load(edited(ok, R"("hostname":")", R"("hostname":"\u0000)")).snap.hostname.substr(0, 6),
              std::string("\0node-", 6));
    EXPECT_EQ(load(edited(ok, R"("rank":1,)", R"("rank":1,"rank":"one",)")).snap.rank, 1);  // the first one counts
    EXPECT_EQ(load(edited(ok, R"("hostname":")", R"("hostname":")" + big16)).snap.hostname.size(),
              big16.size() + baseSnapshot().hostname.size());
  }
}

namespace {

bool isIndex(const std::string& k) {
  return !k.empty() && k[0] == '[';
}

// Every path to a value in `j` (keys, "[i]" for array elements), `j` itself excluded.
void pathsIn(const Json& j, std::vector<std::string>& at, std::vector<std::vector<std::string>>* out) {
  if (!at.empty()) out->push_back(at);
  if (j.isObject()) {
    for (const auto& [k, v] : j.asObject()) {
      at.push_back(k);
      pathsIn(v, at, out);
      at.pop_back();
    }
  } else if (j.isArray()) {
    const auto& a = j.asArray();
    for (size_t i = 0; i < a.size(); ++i) {
      at.push_back("[" + std::to_string(i) + "]");
      pathsIn(a[i], at, out);
      at.pop_back();
    }
  }
}

// A copy of `j` with the value at path[at...] replaced by `v`.
Json replacedAt(const Json& j, const std::vector<std::string>& path, size_t at, const Json& v) {
  if (at == path.size()) return v;
  if (isIndex(path[at])) {
    Json::Array a = j.asArray();
    const size_t i = std::stoul(path[at].substr(1));
    a[i] = replacedAt(a[i], path, at + 1, v);
    return Json(std::move(a));
  }
  Json::Object o = j.asObject();
  for (auto& kv : o) {
    if (kv.first == path[at]) kv.second = replacedAt(kv.second, path, at + 1, v);
  }
  return Json(std::move(o));
}

}  // namespace

TEST(DumpFuzz, AWrongTypeForEveryFieldIsNamedOrIgnored) {
  // Every value in the base dump, replaced in turn by values of every type:
  // the dump reads (the field is optional, or unread) or the error names the
  // field (by its key, or by the name the reader gives it).
  auto problems = runBounded(std::chrono::seconds(60), [] {
    const Json base = Json::parse(baseText());
    std::vector<std::vector<std::string>> paths;
    std::vector<std::string> root;
    pathsIn(base, root, &paths);
    // Names the reader gives elements and containers: "group rank list must
    // be an integer", "expected an object holding 'record_id'".
    const std::vector<std::pair<std::string, std::string>> aliases = {
        {"ranks[]", "group rank list"}, {"input_dtypes[]", "dtype"},  {"input_sizes[][]", "size"},
        {"frames[]", "'name'"},         {"entries[]", "'record_id'"}, {"groups[]", "'name'"},
        {"main_thread", "'available'"},
    };
    const std::vector<Json> values = {Json(),    Json(true),    Json(int64_t{-1}), Json(1.5), Json(int64_t{1} << 31),
                                      Json("x"), Json::array(), Json::object()};
    std::vector<std::string> problems;
    int valid = 0, named = 0;
    for (const auto& path : paths) {
      // The field's key, and its form with element markers ("input_sizes[][]").
      std::string key, shape, where;
      for (const auto& k : path) {
        if (isIndex(k)) {
          shape += "[]";
          where += k;
        } else {
          key = k;
          shape = k;
          where += "." + k;
        }
      }
      std::vector<std::string> mentions{key};
      for (const auto& [sh, name] : aliases) {
        if (sh == shape) mentions.push_back(name);
      }
      for (const auto& v : values) {
        const Outcome o = load(replacedAt(base, path, 0, v).dump());
        const std::string tag = where + " = " + v.dump() + ": ";
        if (!o.problem.empty()) {
          problems.push_back(tag + o.problem);
        } else if (o.valid) {
          ++valid;
          if (auto p = checkValid(o.snap); !p.empty()) problems.push_back(tag + p);
        } else {
          ++named;
          bool mentioned = false;
          for (const auto& m : mentions) mentioned = mentioned || o.reason.find(m) != std::string::npos;
          if (!mentioned) problems.push_back(tag + "the error does not name the field: " + printable(o.reason));
        }
      }
    }
    // Both outcomes are common: many fields are optional, most are required.
    if (paths.size() < 100) problems.push_back("only " + std::to_string(paths.size()) + " fields");
    if (valid < 100) problems.push_back("only " + std::to_string(valid) + " replacements read as valid");
    if (named < 200) problems.push_back("only " + std::to_string(named) + " replacements were refused");
    return problems;
  });
  EXPECT_TRUE(problems.empty()) << problems.size() << " problems:" << joined(problems, 30);
}

TEST(DumpFuzz, AThreeHundredMiBDumpIsRefusedBySizeBeforeParsing) {
  // One allocation, reused: the base dump, then whitespace (valid JSON), and a
  // last byte that would make it invalid if it were parsed.
  DumpInput dump{"rank0.json", baseText()};
  dump.text.resize(300u << 20, ' ');
  dump.text.back() = 'x';
  const auto t0 = std::chrono::steady_clock::now();
  try {
    readDump(dump);
    ADD_FAILURE() << "a 300 MiB dump was read";
  } catch (const DumpError& e) {
    EXPECT_EQ(std::string(e.what()),
              "rank0.json: is 300 MiB, over the 256 MiB a dump may hold (not a torch_ext dump?)");
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 0.5) << "refusing by size must not read the text";
  // The bound is the size, exactly: at kMaxDumpBytes the same text reads
  // (trailing whitespace), one byte more is refused.
  dump.text.resize(kMaxDumpBytes);
  try {
    RankSnapshot s = readDump(dump);
    EXPECT_EQ(s.hostname, baseSnapshot().hostname);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "a dump of exactly kMaxDumpBytes was refused: " << e.what();
  }
  dump.text.push_back(' ');
  EXPECT_THROW(readDump(dump), DumpError);
}

// --- analyzeDumps on sets of edited, valid dumps -------------------------------

namespace {

// Three ranks' dumps, written for incident "failure:1": group "0" (3 ranks,
// #5 pending on ranks 0 and 1, rank 2 still at #4), "pp" (ranks 0 and 1: a
// send and a recv that pair, pending), "a2a" (3 ranks, an all_to_all whose
// splits pair, failed on rank 0).
std::vector<RankSnapshot> world() {
  std::vector<RankSnapshot> out;
  const int64_t t0 = 1700000000000000000;
  for (int r = 0; r < 3; ++r) {
    RankSnapshot s;
    s.rank = r;
    s.pid = 100 + r;
    s.hostname = "node-" + std::to_string(r);
    s.timeNs = t0 + 9'000'000'000;
    s.incident = "failure:1";  // rank 0's all_to_all failed (a peer died?)
    s.main.available = true;
    s.main.frames = {Frame{"/home/u/train.py", 50 + r, "main"}};

    GroupView g;
    g.name = "0";
    g.rank = r;
    g.size = 3;
    g.globalRanks = {0, 1, 2};
    const uint64_t last = r == 2 ? 4 : 5;
    for (uint64_t k = 1; k <= last; ++k) {
      g.entries.push_back(collective(k, k, Op::AllReduce, "all_reduce(float32[8], SUM)",
                                     k == 5 ? EntryState::Scheduled : EntryState::Completed, t0 + int64_t(k) * 1000));
    }
    g.lastSeq = last;
    g.lastCompletedSeq = 4;
    roll(g);
    s.groups.push_back(g);

    if (r < 2) {
      GroupView pp;
      pp.name = "pp";
      pp.rank = r;
      pp.size = 2;
      pp.globalRanks = {0, 1};
      pp.entries.push_back(p2p(1, 1, r == 0 ? Op::Send : Op::Recv, 1 - r, 3, 16, EntryState::Completed, t0 + 10));
      pp.entries.push_back(p2p(2, 2, r == 0 ? Op::Send : Op::Recv, 1 - r, 3, 16, EntryState::Scheduled, t0 + 20));
      s.groups.push_back(pp);
    }

    GroupView a2a;
    a2a.name = "a2a";
    a2a.rank = r;
    a2a.size = 3;
    a2a.globalRanks = {0, 1, 2};
    EntryView e = collective(1, 1, Op::AllToAll, "all_to_all(float32[8])", EntryState::Completed, t0 + 30);
    // Pairing sums that add up over the group: rank r sends 1 to r+1.
    e.splitSend = mix(100 + r);
    e.splitRecv = mix(100 + (r + 2) % 3);
    if (r == 0) {
      e.state = EntryState::Failed;
      e.error = "connection closed by peer";
    }
    a2a.entries.push_back(e);
    roll(a2a);
    s.groups.push_back(a2a);
    out.push_back(s);
  }
  return out;
}

}  // namespace

TEST(DumpFuzz, AnalysisOfEditedDumpSetsGivesOneFindingPerGroup) {
  {
    std::vector<GroupFinding> findings;
    ASSERT_EQ(checkFindings(world(), &findings), "");
    ASSERT_EQ(findings.size(), 3u);
    EXPECT_EQ(findings[0].groupName, "0");
    EXPECT_EQ(findings[0].verdict.kind, Verdict::Kind::Hang) << findings[0].verdict.text;
    EXPECT_EQ(findings[0].verdict.notArrived, (std::vector<int64_t>{2})) << findings[0].verdict.text;
    EXPECT_EQ(findings[1].groupName, "a2a");
    EXPECT_EQ(findings[1].verdict.kind, Verdict::Kind::Failure) << findings[1].verdict.text;
    EXPECT_EQ(findings[2].groupName, "pp");
    EXPECT_EQ(findings[2].verdict.kind, Verdict::Kind::Hang) << findings[2].verdict.text;
  }
  auto problems = runBounded(std::chrono::seconds(60), [] {
    std::mt19937 rng(4242);
    std::vector<std::string> problems;
    std::map<Verdict::Kind, int> kinds;
    const std::vector<std::string> incidents = {
        "hang:5",  "failure:3", "abort:p2p-0-2", "mismatch:any",
        "garbage", "",          "failure:1",     "failure:18446744073709551615"};
    const std::vector<uint64_t> shifts = {
        1, 2, 5, uint64_t{1} << 40, ~uint64_t{0}, ~uint64_t{0} - 3, uint64_t{1} << 63};
    for (int round = 0; round < 400; ++round) {
      std::vector<RankSnapshot> snaps = world();
      std::string what;
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int k = 0; k < edits && !snaps.empty(); ++k) {
        RankSnapshot& s = snaps[rng() % snaps.size()];
        if (s.groups.empty()) continue;
        GroupView& g = s.groups[rng() % s.groups.size()];
        EntryView* e = g.entries.empty() ? nullptr : &g.entries[rng() % g.entries.size()];
        switch (rng() % 12) {
          case 0:
            if (e) g.entries.erase(g.entries.begin() + (e - g.entries.data()));
            what += " remove-entry";
            break;
          case 1:
            if (e) e->state = static_cast<EntryState>(rng() % 3);
            what += " state";
            break;
          case 2: {  // every seq of the group shifted, maybe past 2^63 or around 2^64
            const uint64_t d = shifts[rng() % shifts.size()];
            for (auto& x : g.entries) {
              if (!x.isP2P) x.seq += d;
            }
            g.lastSeq += d;
            what += " shift-seqs";
            break;
          }
          case 3: {  // this file's idea of the group's size differs from the others'
            g.size = 1 + static_cast<int>(rng() % 5);
            g.globalRanks.resize(g.size);
            for (int i = 0; i < g.size; ++i) g.globalRanks[i] = i;
            g.rank = std::min(g.rank, g.size - 1);
            what += " size";
            break;
          }
          case 4:
            if (e) e->hash = rng();
            what += " hash";
            break;
          case 5:
            if (e) e->splitSend += 1 + rng() % 3;
            what += " split";
            break;
          case 6:
            snaps.erase(snaps.begin() + (&s - snaps.data()));
            what += " drop-file";
            continue;
          case 7:
            snaps.push_back(s);
            what += " duplicate-file";
            continue;
          case 8:
            s.incident = incidents[rng() % incidents.size()];
            what += " incident";
            break;
          case 9:
            if (e) {
              e->peer = static_cast<int>(rng() % 8) - 2;
              e->tag = static_cast<int>(rng() % 3);
              e->p2pOrdinal += rng() % 3;
              e->isP2P = rng() % 4 != 0;
            }
            what += " p2p";
            break;
          case 10:
            g.name = "renamed";
            what += " rename";
            break;
          default:
            s.groups.erase(s.groups.begin() + (&g - s.groups.data()));
            what += " remove-group";
            break;
        }
      }
      // Through the files: every edited set is a set of valid dumps.
      std::vector<RankSnapshot> read;
      bool ok = true;
      for (size_t i = 0; i < snaps.size(); ++i) {
        const Outcome o = load(toJson(snaps[i]).dump(), "rank" + std::to_string(i) + ".json");
        if (!o.valid) {
          problems.push_back("round " + std::to_string(round) + " (" + what +
                             "): an edited dump does not read: " + o.reason + o.problem);
          ok = false;
          break;
        }
        read.push_back(o.snap);
      }
      if (!ok) continue;
      std::vector<GroupFinding> findings;
      if (auto p = checkFindings(read, &findings); !p.empty()) {
        problems.push_back("round " + std::to_string(round) + " (" + what + "): " + p);
      }
      for (const auto& f : findings) kinds[f.verdict.kind]++;
    }
    // The edits reach every kind of verdict.
    for (auto k : {Verdict::Kind::None, Verdict::Kind::Mismatch, Verdict::Kind::Hang, Verdict::Kind::Failure}) {
      if (kinds[k] == 0) problems.push_back(std::string("no round gave a verdict of kind ") + Verdict::kindName(k));
    }
    return problems;
  });
  EXPECT_TRUE(problems.empty()) << joined(problems);
}

TEST(DumpFuzz, AnalysisOfSeqsFarApartFinishes) {
  // Seqs are read as uint64 from any integer: edited dumps may hold seqs
  // 2^63 apart, or at 2^64 - 1 (written as -1). The analysis must not walk
  // every seq in between (it used to: a loop of 2^63 steps, or without end).
  auto problems = runBounded(std::chrono::seconds(20), [] {
    std::vector<std::string> problems;
    for (const uint64_t far : {uint64_t{1} << 63, ~uint64_t{0}}) {
      std::vector<RankSnapshot> snaps = world();
      // Rank 0's #5 moves to `far` (its text differs there); rank 1 has #5 as before.
      for (auto& e : snaps[0].groups[0].entries) {
        if (e.seq == 5) {
          e.seq = far;
          e.text = "barrier()";
          e.hash = hashOf(e.text);
        }
      }
      snaps[0].groups[0].entries.push_back(snaps[0].groups[0].entries.back());
      snaps[0].groups[0].entries.back().seq = far - 1;
      std::vector<RankSnapshot> read;
      for (const auto& s : snaps) read.push_back(readDump(DumpInput{"r.json", toJson(s).dump()}));
      std::vector<GroupFinding> findings;
      if (auto p = checkFindings(read, &findings); !p.empty()) problems.push_back(p);
      if (findings.empty() || findings[0].verdict.kind != Verdict::Kind::Hang) {
        problems.push_back("seq " + std::to_string(far) + ": expected a hang verdict, got " +
                           (findings.empty() ? "nothing" : findings[0].verdict.text));
      }
    }
    return problems;
  });
  EXPECT_TRUE(problems.empty()) << joined(problems);
}

TEST(DumpFuzz, AnalysisCostGrowsWithTheInputNotWithGroupsTimesFileSize) {
  // 10,000 one-rank groups in each of two dumps: each group's analysis reads
  // its own group only (it used to copy each whole snapshot once per group,
  // 10,000 x 10,000 group copies).
  auto problems = runBounded(std::chrono::seconds(20), [] {
    std::vector<RankSnapshot> snaps(2);
    for (int f = 0; f < 2; ++f) {
      snaps[f].rank = f;
      snaps[f].timeNs = 1;
      for (int i = 0; i < 10000; ++i) {
        GroupView g;
        g.name = std::to_string(f) + "_" + std::to_string(i);
        g.globalRanks = {f};
        g.entries.push_back(collective(1, 1, Op::AllReduce, "all_reduce(float32[8], SUM)", EntryState::Scheduled, 1));
        g.lastSeq = 1;
        snaps[f].groups.push_back(std::move(g));
      }
    }
    std::vector<GroupFinding> findings;
    auto p = checkFindings(snaps, &findings);
    if (!p.empty()) return std::vector<std::string>{p};
    for (const auto& f : findings) {
      if (f.verdict.kind != Verdict::Kind::Hang) return std::vector<std::string>{"not a hang: " + f.verdict.text};
    }
    return std::vector<std::string>{};
  });
  EXPECT_TRUE(problems.empty()) << joined(problems);
}

}  // namespace test_dump_fuzz
