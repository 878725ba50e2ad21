#include "engine/lr_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace {

using engine::DecayShape;
using engine::LrSchedule;

TEST(LrSchedule, WarmupStableLinearDecay) {
  LrSchedule s(10, 2, 0.5, 0.1, DecayShape::Linear);
  EXPECT_DOUBLE_EQ(s.multiplier(0), 0.5);
  EXPECT_DOUBLE_EQ(s.multiplier(1), 1.0);
  EXPECT_DOUBLE_EQ(s.multiplier(4), 1.0);  // the decay starts at step 5
  EXPECT_DOUBLE_EQ(s.multiplier(5), 1.0 - 0.2 * 0.9);
  EXPECT_DOUBLE_EQ(s.multiplier(9), 0.1);  // the last step reaches the floor
}

TEST(LrSchedule, CosineIsMonotoneToTheFloor) {
  LrSchedule s(100, 10, 1.0, 0.0, DecayShape::Cosine);
  // The decay never starts inside the warmup: it begins at step 10.
  EXPECT_DOUBLE_EQ(s.multiplier(9), 1.0);
  EXPECT_LT(s.multiplier(10), 1.0);
  double prev = 2;
  for (int64_t i = 10; i < 100; ++i) {
    double m = s.multiplier(i);
    EXPECT_LE(m, prev);
    prev = m;
  }
  EXPECT_NEAR(s.multiplier(99), 0.0, 1e-15);
  EXPECT_NEAR(s.multiplier(54), 0.5 * (1 + std::cos(M_PI * 45.0 / 90.0)), 1e-15);
}

TEST(LrSchedule, ConstantNeverDecays) {
  LrSchedule s(50, 0, 0.9, 0.0, DecayShape::Constant);
  for (int64_t i = 0; i < 50; ++i)
    EXPECT_EQ(s.multiplier(i), 1.0);
}

TEST(LrSchedule, BadNamesAndArguments) {
  EXPECT_EQ(engine::parse_decay_shape("cosine"), DecayShape::Cosine);
  EXPECT_THROW(engine::parse_decay_shape("step"), core::Error);
  EXPECT_THROW(LrSchedule(0, 0, 0.1, 0, DecayShape::Linear), core::Error);
  EXPECT_THROW(LrSchedule(10, 0, 1.5, 0, DecayShape::Linear), core::Error);
}

}  // namespace

namespace {

// The record's window warmup: 128 at the start, linear in blocks of 128, the full window at the
// end, never above it (1792 over 1770 steps as record #24; a window that is not a multiple of
// 128 is reached exactly).
TEST(WindowSchedule, GrowsIn128BlocksToTheWindow) {
  EXPECT_EQ(engine::window_at(1792, 0, 1770), 128);
  EXPECT_EQ(engine::window_at(1792, 1, 1770), 128);
  EXPECT_EQ(engine::window_at(1792, 885, 1770), 896);
  EXPECT_EQ(engine::window_at(1792, 1769, 1770), 1792);
  EXPECT_EQ(engine::window_at(1792, 1770, 1770), 1792);
  int64_t last = 0;
  for (int64_t s = 0; s < 1770; ++s) {
    const int64_t w = engine::window_at(1792, s, 1770);
    EXPECT_EQ(w % 128, 0);
    EXPECT_GE(w, last);
    last = w;
  }
  EXPECT_EQ(engine::window_at(100, 0, 10), 100);
  EXPECT_EQ(engine::window_at(300, 9, 10), 300);
}

}  // namespace

namespace {

// train.lr_at_step_start: the record's get_lr(step) = w + (1 - w) 0.1 with w = min((1 - step /
// 1770) / 0.4, 1), written out here, step by step; the default is the same curve a step later.
TEST(LrSchedule, AtStepStartIsTheRecordsGetLr) {
  const LrSchedule record(1770, 0, 0.4, 0.1, DecayShape::Linear, true);
  const LrSchedule after(1770, 0, 0.4, 0.1, DecayShape::Linear);
  for (int64_t step = 0; step < 1770; ++step) {
    const double x = static_cast<double>(step) / 1770.0;
    const double w = std::min((1.0 - x) / 0.4, 1.0);
    EXPECT_NEAR(record.multiplier(step), w + (1.0 - w) * 0.1, 1e-12) << step;
    if (step + 1 < 1770) {
      EXPECT_EQ(after.multiplier(step), record.multiplier(step + 1)) << step;
    }
  }
  EXPECT_EQ(record.multiplier(1062), 1.0);
  EXPECT_LT(after.multiplier(1062), 1.0);
}

// model.window_block's growth: train_gpt.py's next_multiple_of_n(1728 x, n=128), x = step /
// 1770, written out for the steps where it changes: one block to step 131, two from 132, 13
// to 1704, 14 (1792) from 1705 on.
TEST(WindowSchedule, BlockRuleIsTheRecordsNextMultipleOf128) {
  auto record = [](int64_t step) {
    const double v = 1728.0 * (static_cast<double>(step) / 1770.0);
    int64_t m = 128;
    while (static_cast<double>(m) < v)
      m += 128;
    return m;
  };
  for (int64_t step = 0; step <= 1770; ++step)
    ASSERT_EQ(engine::block_window_at(1792, 128, step, 1770), record(step)) << step;
  EXPECT_EQ(engine::block_window_at(1792, 128, 131, 1770), 128);
  EXPECT_EQ(engine::block_window_at(1792, 128, 132, 1770), 256);
  EXPECT_EQ(engine::block_window_at(1792, 128, 1704, 1770), 1664);
  EXPECT_EQ(engine::block_window_at(1792, 128, 1705, 1770), 1792);
  EXPECT_NE(engine::window_at(1792, 1700, 1770), engine::block_window_at(1792, 128, 1700, 1770));
}

}  // namespace
