// futureOf: a work type whose getFuture() threw is not asked again (no
// exception, and no backtrace, per collective); a type that has futures is
// asked every time, and so is one of the guard's own wrappers, whose answer
// is the wrapped work's.
#include "guard/collective/InnerFuture.h"

#include <gtest/gtest.h>

#include <atomic>

using namespace torch_ext;

namespace test_inner_future {

namespace {

c10::intrusive_ptr<c10::ivalue::Future> newFuture() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::ofTensors());
}

// As gloo's reduce_scatter work: c10d::Work's getFuture(), which throws.
struct Futureless : c10d::Work {
  explicit Futureless(std::atomic<int>* asked) : asked_(asked) {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    asked_->fetch_add(1);
    return c10d::Work::getFuture();
  }
  std::atomic<int>* asked_;
};

// As gloo's all_reduce work: a future per work.
struct WithFuture : c10d::Work {
  explicit WithFuture(std::atomic<int>* asked) : asked_(asked), future_(newFuture()) {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    asked_->fetch_add(1);
    return future_;
  }
  std::atomic<int>* asked_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// As InBandWork: a future where the wrapped work has one.
struct Wrapper : c10d::Work, ForwardsFuture {
  Wrapper(std::atomic<int>* asked, bool has) : asked_(asked), future_(has ? newFuture() : nullptr) {}
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    asked_->fetch_add(1);
    if (!future_) return c10d::Work::getFuture();
    return future_;
  }
  std::atomic<int>* asked_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace

TEST(InnerFuture, AWorkTypeWithoutAFutureIsAskedOnce) {
  std::atomic<int> asked{0};
  for (int i = 0; i < 5; ++i) {
    Futureless work(&asked);
    EXPECT_FALSE(futureOf(work)) << "call " << i;
  }
  EXPECT_EQ(asked.load(), 1) << "the type's getFuture() threw once; it must not be asked again";
}

TEST(InnerFuture, AWorkTypeWithFuturesIsAskedEveryTime) {
  std::atomic<int> asked{0};
  for (int i = 0; i < 3; ++i) {
    WithFuture work(&asked);
    auto future = futureOf(work);
    EXPECT_EQ(future.get(), work.future_.get()) << "call " << i;
  }
  EXPECT_EQ(asked.load(), 3);
}

TEST(InnerFuture, AWrapperOfOursAnswersPerWork) {
  std::atomic<int> asked{0};
  Wrapper without(&asked, false);
  EXPECT_FALSE(futureOf(without));
  EXPECT_FALSE(futureOf(without));
  Wrapper with(&asked, true);
  EXPECT_EQ(futureOf(with).get(), with.future_.get())
      << "a wrapper's type must not be remembered futureless: another of its works has a future";
  EXPECT_EQ(asked.load(), 3);
}

}  // namespace test_inner_future
