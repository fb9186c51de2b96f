// StepSync: the packed wire format, and the ops end to end through the
// dispatcher and the c10d group registry, with an in-process backend that
// stands for N identical ranks (its all_reduce multiplies by N).
#include "ops/StepSync.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <gtest/gtest.h>

#include <string>

namespace test_step_sync {

namespace {

namespace ops = torch_ext::ops;

// at::tensor has no bool or half overloads: build from ints/doubles and convert.
at::Tensor flags(bool stop, bool has_data) {
  return at::tensor({static_cast<int64_t>(stop), static_cast<int64_t>(has_data)}).to(at::kBool);
}

std::string where() {
  return "group 'test', rank 0 of 1";
}

class DoneWork : public c10d::Work {
 public:
  bool isCompleted() override {
    return true;
  }
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    return true;
  }
};

// All ranks contributed the same buffer: SUM == size * buffer.
class TimesN : public c10d::Backend {
 public:
  explicit TimesN(int size) : c10d::Backend(0, size) {}
  const std::string getBackendName() const override {
    return "times_n";
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    EXPECT_EQ(opts.reduceOp, c10d::ReduceOp::SUM);
    for (auto& t : tensors) {
      t.mul_(getSize());
    }
    ++calls;
    return c10::make_intrusive<DoneWork>();
  }
  int calls = 0;
};

struct Group {
  explicit Group(const std::string& name, int size) : name(name) {
    backend = c10::make_intrusive<TimesN>(size);
    pg = c10::make_intrusive<c10d::ProcessGroup>(0, size);
    pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, backend);
    pg->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
    c10d::register_process_group(name, pg);
  }
  ~Group() {
    c10d::unregister_process_group(name);
  }
  std::string name;
  c10::intrusive_ptr<TimesN> backend;
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
};

std::string errorOf(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

}  // namespace

TEST(StepSyncPack, OneFlagSlotThenMetricsInFloat64) {
  auto packed = ops::detail::pack(flags(true, true), at::tensor({1.5, -2.0}).to(at::kHalf), where);
  ASSERT_EQ(packed.scalar_type(), at::kDouble);
  ASSERT_EQ(packed.size(0), 3);
  EXPECT_EQ(packed[0].item<double>(), 1.0 + static_cast<double>(ops::kHasDataUnit));
  EXPECT_EQ(packed[1].item<double>(), 1.5);
  EXPECT_EQ(packed[2].item<double>(), -2.0);
}

TEST(StepSyncPack, FlagsAreNormalisedToZeroOrOne) {
  // stop=5 still counts once; has_data=0 counts zero times.
  auto packed = ops::detail::pack(at::tensor({5, 0}), at::empty({0}), where);
  ASSERT_EQ(packed.size(0), 1);
  EXPECT_EQ(packed[0].item<double>(), 1.0);
  auto f = ops::detail::pack(at::tensor({0.0f, -3.0f}), at::empty({0}), where);
  EXPECT_EQ(f[0].item<double>(), static_cast<double>(ops::kHasDataUnit));
}

TEST(StepSyncPack, UnpackSplitsTheReducedWord) {
  // 3 ranks want to stop, 7 have data, metric sums 10 and 0.25.
  auto reduced = at::tensor({3.0 + 7.0 * static_cast<double>(ops::kHasDataUnit), 10.0, 0.25});
  auto [counts, sums] = ops::detail::unpack(reduced);
  EXPECT_EQ(counts.scalar_type(), at::kLong);
  EXPECT_EQ(counts[0].item<int64_t>(), 3);
  EXPECT_EQ(counts[1].item<int64_t>(), 7);
  EXPECT_TRUE(at::equal(sums, at::tensor({10.0, 0.25})));
  sums.fill_(0);  // a fresh tensor, not a view into the wire buffer
  EXPECT_EQ(reduced[1].item<double>(), 10.0);
}

TEST(StepSyncPack, BadInputNamesTheProblemAndTheGroup) {
  auto e = errorOf([] { ops::detail::pack(at::ones({3}), at::ones({1}), where); });
  EXPECT_NE(e.find("flags must be a 1-D tensor [stop, has_data] of 2 elements, got shape [3]"), std::string::npos) << e;
  EXPECT_NE(e.find("group 'test', rank 0 of 1"), std::string::npos) << e;
  e = errorOf([] { ops::detail::pack(at::ones({2}), at::ones({2, 2}), where); });
  EXPECT_NE(e.find("metrics must be a 1-D tensor"), std::string::npos) << e;
  e = errorOf([] { ops::detail::pack(at::ones({2}), at::ones({1}, at::kComplexFloat), where); });
  EXPECT_NE(e.find("complex tensors are not supported"), std::string::npos) << e;
  e = errorOf([] { ops::detail::unpack(at::ones({2}, at::kFloat)); });
  EXPECT_NE(e.find("expected the float64 buffer returned by step_sync_start"), std::string::npos) << e;
}

TEST(StepSyncOp, OneAllReduceThroughTheRegisteredGroup) {
  Group g("step_sync_gtest_4", 4);
  auto [counts, sums] = ops::step_sync(flags(false, true), at::tensor({0.5f, 2.0f}), g.name);
  EXPECT_EQ(g.backend->calls, 1);
  EXPECT_EQ(counts[0].item<int64_t>(), 0);
  EXPECT_EQ(counts[1].item<int64_t>(), 4);
  EXPECT_TRUE(at::equal(sums, at::tensor({2.0, 8.0})));
}

TEST(StepSyncOp, DispatchesThroughTheOperatorRegistry) {
  Group g("step_sync_gtest_3", 3);
  auto op = c10::Dispatcher::singleton()
                .findSchemaOrThrow("torch_ext::step_sync", "")
                .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, std::string)>();
  auto [counts, sums] = op.call(at::tensor({1.0, 1.0}), at::tensor({1.0}), g.name);
  EXPECT_EQ(counts[0].item<int64_t>(), 3);
  EXPECT_EQ(counts[1].item<int64_t>(), 3);
  EXPECT_EQ(sums[0].item<double>(), 3.0);
}

TEST(StepSyncOp, StartThenFinish) {
  Group g("step_sync_gtest_2", 2);
  auto packed = ops::step_sync_start(flags(true, false), at::tensor({1.25}), g.name);
  auto [counts, sums] = ops::step_sync_finish(packed);
  EXPECT_EQ(counts[0].item<int64_t>(), 2);
  EXPECT_EQ(counts[1].item<int64_t>(), 0);
  EXPECT_EQ(sums[0].item<double>(), 2.5);
}

TEST(StepSyncOp, UnknownGroupNamesTheFix) {
  auto e = errorOf([] { ops::step_sync(at::zeros({2}), at::zeros({0}), "no_such_group"); });
  EXPECT_NE(e.find("no process group named 'no_such_group'"), std::string::npos) << e;
  EXPECT_NE(e.find("dist.group.WORLD.group_name"), std::string::npos) << e;
}

}  // namespace test_step_sync
