// Labels (issue 29): the label table, the thread's current label, labels in the
// ledger, in snapshot JSON, and in the reports (call site + label, the hint).
#include "guard/collective/CallSite.h"
#include "guard/collective/LabelTable.h"
#include "guard/collective/Ledger.h"
#include "guard/report/Report.h"
#include "guard/report/Snapshot.h"
#include "guard/watchdog/Dumps.h"

#include <gtest/gtest.h>

#include <thread>

using namespace torch_ext;

namespace test_labels {

namespace {

constexpr int64_t kNow = 1'700'000'000'000'000'000;
constexpr int64_t kSec = 1'000'000'000;

Fingerprint allReduce(int64_t n) {
  return FingerprintBuilder(Op::AllReduce)
      .meta(at::kFloat, {n}, c10::DeviceType::CPU)
      .reduceOp(c10d::ReduceOp(c10d::ReduceOp::SUM))
      .finish();
}

Label metric() {
  Label l;
  l.text = "metric 'val_loss'";
  l.fields = {{"metric", "val_loss"}, {"hook", "validation_step"}};
  l.origin = {Frame{"/job/model.py", 41, "Model.validation_step", ""}};
  l.hint = "log it on every rank";
  return l;
}

GroupView viewOf(Ledger& ledger, int rank, int size) {
  GroupView g;
  g.name = "0";
  g.rank = rank;
  g.size = size;
  for (int r = 0; r < size; ++r) g.globalRanks.push_back(r);
  Progress p = ledger.progress();
  g.lastSeq = p.lastSeq;
  g.lastCompletedSeq = p.lastCompletedSeq;
  g.rolling = p.rolling;
  for (const auto& e : ledger.entries(64)) g.entries.push_back(entryView(e));
  return g;
}

RankInput responded(int rank, const GroupView& g) {
  RankInput r;
  r.groupRank = rank;
  r.globalRank = rank;
  r.responded = true;
  r.groupName = g.name;
  r.snapshot.rank = rank;
  r.snapshot.groups.push_back(g);
  return r;
}

}  // namespace

TEST(Labels, InternedOnceAndLookedUp) {
  auto& table = LabelTable::instance();
  const uint32_t a = table.intern(metric());
  EXPECT_GE(a, 1u);
  EXPECT_EQ(table.intern(metric()), a);
  Label other = metric();
  other.origin[0].line = 42;
  EXPECT_NE(table.intern(other), a);
  EXPECT_EQ(table.intern(Label{}), 0u);
  EXPECT_EQ(table.get(a).text, "metric 'val_loss'");
  EXPECT_TRUE(table.get(0).empty());
  EXPECT_TRUE(table.get(0xfffffff0u).empty());
  EXPECT_EQ(metric().describe(), "metric 'val_loss' (asked for at model.py:41 in Model.validation_step)");
  EXPECT_EQ(labelSuffix(Label{}), "");
  // A library called from the line that asked for the work: the origin is that call site, said once.
  EXPECT_EQ(labelSuffix(metric(), {Frame{"/job/model.py", 41, "Model.validation_step", ""}}), " for metric 'val_loss'");
  EXPECT_EQ(labelSuffix(metric(), {Frame{"/job/model.py", 40, "Model.validation_step", ""}}),
            " for metric 'val_loss' (asked for at model.py:41 in Model.validation_step)");
}

TEST(Labels, CurrentIsPerThread) {
  const uint32_t id = LabelTable::instance().intern(metric());
  EXPECT_EQ(LabelTable::current(), 0u);
  const uint32_t prev = LabelTable::setCurrent(id);
  EXPECT_EQ(prev, 0u);
  uint32_t seen = 99;
  std::thread([&] { seen = LabelTable::current(); }).join();
  EXPECT_EQ(seen, 0u);
  EXPECT_EQ(LabelTable::current(), id);
  EXPECT_EQ(LabelTable::setCurrent(prev), id);
}

TEST(Labels, InTheLedgerTheSnapshotJsonAndBack) {
  const uint32_t id = LabelTable::instance().intern(metric());
  const uint32_t site = CallSites::instance().intern({Frame{"/job/train.py", 88, "main", ""}});
  Ledger ledger(8);
  uint64_t seq = 0;
  ledger.record(allReduce(4), site, &seq, nullptr, nullptr, id);
  ledger.record(allReduce(4), site, &seq);
  GroupView g = viewOf(ledger, 0, 1);
  ASSERT_EQ(g.entries.size(), 2u);
  EXPECT_EQ(g.entries[0].label.text, "metric 'val_loss'");
  EXPECT_TRUE(g.entries[1].label.empty());
  EXPECT_EQ(g.entries[0].where(),
            "train.py:88 in main for metric 'val_loss' (asked for at model.py:41 in Model.validation_step)");
  GroupView back = groupFromJson(Json::parse(toJson(g).dump()));
  ASSERT_EQ(back.entries.size(), 2u);
  const Label& l = back.entries[0].label;
  EXPECT_EQ(l.text, metric().text);
  EXPECT_EQ(l.fields, metric().fields);
  EXPECT_EQ(l.hint, metric().hint);
  ASSERT_EQ(l.origin.size(), 1u);
  EXPECT_EQ(l.origin[0].line, 41);
  EXPECT_EQ(l.origin[0].function, "Model.validation_step");
  EXPECT_TRUE(back.entries[1].label.empty());
  EXPECT_THROW(labelFromJson(Json::parse(R"({"text": ""})")), JsonError);
  EXPECT_THROW(labelFromJson(Json::parse(R"({"text": "x", "origin": 3})")), JsonError);
}

TEST(Labels, ReportsNameTheLabelAndSayItsHintOnce) {
  const uint32_t id = LabelTable::instance().intern(metric());
  const uint32_t site = CallSites::instance().intern({Frame{"/job/train.py", 88, "main", ""}});
  Ledger l0(16), l1(16);
  uint64_t seq = 0;
  l0.complete(l0.record(allReduce(1), site, &seq), true);
  l1.complete(l1.record(allReduce(1), site, &seq), true);
  l0.record(allReduce(4), site, &seq, nullptr, nullptr, id);  // #2, rank 0 only: a hang
  {
    std::vector<RankInput> in{responded(0, viewOf(l0, 0, 2)), responded(1, viewOf(l1, 1, 2))};
    in[0].snapshot.groups[0].entries.back().startNs = kNow - 5 * kSec;
    Incident inc;
    inc.kind = IncidentKind::Hang;
    inc.poster = 0;
    inc.subject = IncidentSubject::collective(2);
    Verdict v = analyze("default_pg", in, inc, kNow);
    EXPECT_EQ(v.kind, Verdict::Kind::Hang);
    EXPECT_NE(v.text.find("waiting: rank 0 at train.py:88 in main for metric 'val_loss' (asked for at model.py:41 in "
                          "Model.validation_step)"),
              std::string::npos)
        << v.text;
    EXPECT_NE(v.text.find("\n  hint: log it on every rank"), std::string::npos) << v.text;
  }
  l1.record(allReduce(5), site, &seq);  // #2 on rank 1: another size, no label
  {
    std::vector<RankInput> in{responded(0, viewOf(l0, 0, 2)), responded(1, viewOf(l1, 1, 2))};
    Incident inc;
    inc.kind = IncidentKind::Mismatch;
    inc.poster = 0;
    inc.subject = IncidentSubject::collective(2);
    Verdict v = analyze("default_pg", in, inc, kNow);
    EXPECT_EQ(v.kind, Verdict::Kind::Mismatch);
    EXPECT_NE(v.text.find("rank 0: all_reduce(float32[4], SUM)  at train.py:88 in main for metric 'val_loss'"),
              std::string::npos)
        << v.text;
    const auto hint = v.text.find("\n  hint: log it on every rank");
    EXPECT_NE(hint, std::string::npos) << v.text;
    EXPECT_EQ(v.text.find("hint:", hint + 8), std::string::npos) << v.text;  // once
    Verdict back = Verdict::fromJson(Json::parse(v.toJson().dump()));
    ASSERT_EQ(back.ops.size(), 2u);
    EXPECT_EQ(back.ops[0].hint, "log it on every rank");
  }
}

namespace {

Label metricNamed(const std::string& name) {
  Label l;
  l.text = "metric '" + name + "'";
  l.fields = {{"metric", name}};
  l.hint = "log it on every rank";
  return l;
}

}  // namespace

// Lightning#19106: self.log_dict with a key only rank 0 logs. Ranks 1 and 2 sync
// val_loss and end; rank 0 waits in val_acc_c3's sync. The report names, per
// rank, the metrics synced there and which one is missing where (ranks 1 and 2
// sent no window: their syncs are read from rank 0's ledger up to their last seq).
TEST(Labels, MetricSyncsPerRankNameTheMissingKey) {
  auto& table = LabelTable::instance();
  const uint32_t loss = table.intern(metricNamed("val_loss"));
  const uint32_t acc = table.intern(metricNamed("val_acc_c3"));
  const uint32_t site = CallSites::instance().intern({Frame{"/job/train.py", 88, "main", ""}});
  Ledger l0(16), l1(16), l2(16);
  uint64_t s0 = 0, s1 = 0, s2 = 0;
  for (Ledger* l : {&l0, &l1, &l2}) {
    uint64_t* s = l == &l0 ? &s0 : l == &l1 ? &s1 : &s2;
    l->complete(l->record(allReduce(8), site, s), true);                          // #1 training
    l->complete(l->record(allReduce(1), site, s, nullptr, nullptr, loss), true);  // #2 val_loss
  }
  l0.record(allReduce(1), site, &s0, nullptr, nullptr, acc);  // #3 val_acc_c3, rank 0 only
  {
    std::vector<RankInput> in{responded(0, viewOf(l0, 0, 3))};
    in[0].snapshot.groups[0].entries.back().startNs = kNow - 5 * kSec;
    for (int r : {1, 2}) {
      RankInput x;
      x.groupRank = r;
      x.globalRank = r;
      x.groupName = "0";
      x.statusKnown = true;
      x.phase = RankPhase::Exited;
      x.lastSeq = 2;
      in.push_back(x);
    }
    Incident inc;
    inc.kind = IncidentKind::Hang;
    inc.poster = 0;
    inc.subject = IncidentSubject::collective(3);
    Verdict v = analyze("default_pg", in, inc, kNow);
    EXPECT_EQ(v.kind, Verdict::Kind::Hang);
    EXPECT_NE(v.text.find("\n  metric syncs here: rank 0 synced val_loss, val_acc_c3; ranks 1,2 synced val_loss only"
                          " (ranks 1,2 sent no ledger: read from rank 0's, up to the last collective each issued)"
                          "\n  val_acc_c3 is synced on rank 0 only: ranks 1,2 never synced it here"
                          "\n  hint: log it on every rank"),
              std::string::npos)
        << v.text;
  }
  // Ranks 1 and 2 go on to the next epoch's training collective: a mismatch at #3,
  // every rank's window at hand.
  l1.record(allReduce(8), site, &s1);
  l2.record(allReduce(8), site, &s2);
  {
    std::vector<RankInput> in{responded(0, viewOf(l0, 0, 3)), responded(1, viewOf(l1, 1, 3)),
                              responded(2, viewOf(l2, 2, 3))};
    Incident inc;
    inc.kind = IncidentKind::Mismatch;
    inc.poster = 0;
    inc.subject = IncidentSubject::collective(3);
    Verdict v = analyze("default_pg", in, inc, kNow);
    EXPECT_EQ(v.kind, Verdict::Kind::Mismatch);
    EXPECT_NE(v.text.find("\n  metric syncs here: rank 0 synced val_loss, val_acc_c3; ranks 1,2 synced val_loss only"
                          "\n  val_acc_c3 is synced on rank 0 only: ranks 1,2 never synced it here"),
              std::string::npos)
        << v.text;
  }
  // Every rank synced the same metrics: nothing added.
  Ledger a(16), b(16);
  uint64_t sa = 0, sb = 0;
  a.record(allReduce(1), site, &sa, nullptr, nullptr, loss);
  b.record(allReduce(2), site, &sb, nullptr, nullptr, loss);
  {
    std::vector<RankInput> in{responded(0, viewOf(a, 0, 2)), responded(1, viewOf(b, 1, 2))};
    Incident inc;
    inc.kind = IncidentKind::Mismatch;
    inc.poster = 0;
    inc.subject = IncidentSubject::collective(1);
    Verdict v = analyze("default_pg", in, inc, kNow);
    EXPECT_EQ(v.kind, Verdict::Kind::Mismatch);
    EXPECT_EQ(v.text.find("metric syncs here"), std::string::npos) << v.text;
  }
}

TEST(Labels, MetricRunAndFormatting) {
  // #1 training, #2 val_loss, #3 val_acc_c3, #4 training.
  auto at = [](uint64_t s) -> std::optional<std::string> {
    if (s == 2) return "val_loss";
    if (s == 3) return "val_acc_c3";
    return std::nullopt;
  };
  EXPECT_EQ(metricRunAround(3, 4, UINT64_MAX, at), (std::vector<std::string>{"val_loss", "val_acc_c3"}));
  EXPECT_EQ(metricRunAround(4, 4, UINT64_MAX, at), (std::vector<std::string>{"val_loss", "val_acc_c3"}));
  EXPECT_EQ(metricRunAround(3, 2, UINT64_MAX, at), (std::vector<std::string>{"val_loss"}));  // stopped at #2
  EXPECT_EQ(metricRunAround(3, 4, 2, at), (std::vector<std::string>{"val_loss"}));           // not past #2
  EXPECT_TRUE(metricRunAround(1, 4, UINT64_MAX, at).empty());
  EXPECT_TRUE(metricRunAround(0, 0, UINT64_MAX, at).empty());
  std::vector<RankMetrics> ranks{{0, true, {"val_loss", "val_acc_c3"}},
                                 {1, true, {"val_loss"}},
                                 {2, false, {}},
                                 {3, true, {"val_loss", "val_acc_c5"}}};
  EXPECT_EQ(formatMetricSyncs(ranks),
            "\n  metric syncs here: rank 0 synced val_loss, val_acc_c3; rank 1 synced val_loss only; rank 3 synced "
            "val_loss, val_acc_c5; rank 2: not known (no ledger window)"
            "\n  val_acc_c3 is synced on rank 0 only: ranks 1,3 never synced it here"
            "\n  val_acc_c5 is synced on rank 3 only: ranks 0,1 never synced it here");
  EXPECT_EQ(formatMetricSyncs({{0, true, {"a"}}, {1, true, {"a"}}, {2, false, {}}}), "");
}

namespace {

struct FakeCode {
  const char* file;
  const char* name;
};

bool resolveFake(const OriginRef& ref, Frame* out) {
  const auto* c = static_cast<const FakeCode*>(ref.code);
  if (c->file == nullptr) return false;
  *out = Frame{c->file, ref.line, c->name, ""};
  return true;
}

}  // namespace

// Origins interned as code objects are resolved by the installed resolver when the
// label is first read, then kept; without a resolver they read "(code object)".
TEST(Labels, LazyOriginsAreResolvedWhenFirstRead) {
  auto& table = LabelTable::instance();
  static const FakeCode code{"/job/model.py", "Model.validation_step"};
  static const FakeCode unreadable{nullptr, nullptr};
  Label l;
  l.text = "metric 'lazy'";
  const size_t before = table.unresolved();
  table.setResolver(nullptr);
  const uint32_t id = table.intern(l, {OriginRef{&code, 41}});
  EXPECT_EQ(table.intern(l, {OriginRef{&code, 41}}), id);
  EXPECT_NE(table.intern(l, {OriginRef{&code, 42}}), id);  // another line, another label
  EXPECT_EQ(table.unresolved(), before + 2);
  Label seen = table.get(id);
  ASSERT_EQ(seen.origin.size(), 1u);
  EXPECT_EQ(seen.origin[0].filename, "(code object)");  // no resolver yet: not kept
  EXPECT_EQ(table.unresolved(), before + 2);
  table.setResolver(&resolveFake);
  seen = table.get(id);
  EXPECT_EQ(seen.describe(), "metric 'lazy' (asked for at model.py:41 in Model.validation_step)");
  EXPECT_EQ(table.unresolved(), before + 1);
  const uint32_t bad = table.intern(l, {OriginRef{&unreadable, 7}});
  EXPECT_EQ(table.get(bad).origin.at(0).filename, "(code object)");  // the resolver could not read it
  table.resolveAll();
  EXPECT_EQ(table.unresolved(), 0u);
  table.setResolver(nullptr);
}

TEST(LabelTable, AMetricFieldIsWhatRanksMustAgreeOn) {
  auto& table = LabelTable::instance();
  const uint32_t a = table.intern(Label{"metric 'id_a'", {{"metric", "id_a"}}, {}, ""});
  const uint32_t a2 = table.intern(Label{"metric 'id_a' again", {{"metric", "id_a"}, {"hook", "x"}}, {}, "h"});
  const uint32_t b = table.intern(Label{"metric 'id_b'", {{"metric", "id_b"}}, {}, ""});
  const uint32_t plain = table.intern(Label{"no metric here", {{"step", "3"}}, {}, ""});
  EXPECT_NE(table.identityOf(a), 0u);
  EXPECT_EQ(table.identityOf(a), table.identityOf(a2));  // only the metric counts, not text, fields or hint
  EXPECT_NE(table.identityOf(a), table.identityOf(b));
  EXPECT_EQ(table.identityOf(plain), 0u);
  EXPECT_EQ(table.identityOf(0), 0u);
  const uint32_t prev = LabelTable::setCurrent(b);
  EXPECT_EQ(LabelTable::currentIdentity(), table.identityOf(b));
  LabelTable::setCurrent(plain);
  EXPECT_EQ(LabelTable::currentIdentity(), 0u);
  LabelTable::setCurrent(prev);
}

TEST(LabelTable, AModuleFieldIsWhatRanksMustAgreeOnWhenThereIsNoMetric) {
  auto& table = LabelTable::instance();
  // FSDP2's parameter groups (torch_ext/_libraries.py): the module path, whatever the text says.
  const uint32_t one = table.intern(Label{"FSDP2 unshard of 'layers.1' [8x8]", {{"module", "layers.1"}}, {}, ""});
  const uint32_t oneWide = table.intern(Label{"FSDP2 unshard of 'layers.1' [16x8]", {{"module", "layers.1"}}, {}, ""});
  const uint32_t two = table.intern(Label{"FSDP2 unshard of 'layers.2'", {{"module", "layers.2"}}, {}, ""});
  const uint32_t asMetric = table.intern(Label{"metric 'layers.1'", {{"metric", "layers.1"}}, {}, ""});
  const uint32_t both = table.intern(Label{"both", {{"module", "layers.2"}, {"metric", "layers.1"}}, {}, ""});
  EXPECT_NE(table.identityOf(one), 0u);
  EXPECT_EQ(table.identityOf(one), table.identityOf(oneWide));
  EXPECT_NE(table.identityOf(one), table.identityOf(two));
  EXPECT_NE(table.identityOf(one), table.identityOf(asMetric));   // a module is no metric of the same name
  EXPECT_EQ(table.identityOf(both), table.identityOf(asMetric));  // the metric, where a label has both
}

}  // namespace test_labels
