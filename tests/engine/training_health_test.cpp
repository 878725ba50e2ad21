#include "engine/training_health.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

using engine::TrainingDiverged;
using engine::TrainingHealth;

namespace {

std::string verdict(TrainingHealth& h, int64_t step, double loss, double norm) {
  try {
    h.check(step, loss, norm);
  } catch (const TrainingDiverged& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TrainingHealth, NonFiniteLossOrNormStops) {
  TrainingHealth h(0, 0);  // the factor and zero-norm checks off: non-finite values still stop
  EXPECT_EQ(verdict(h, 1, 5.0, 1.0), "");
  const std::string nan = verdict(h, 2, std::nan(""), 1.0);
  EXPECT_NE(nan.find("step 2: the training loss is nan and the gradient norm 1"), std::string::npos)
      << nan;
  EXPECT_NE(verdict(h, 3, 5.0, std::numeric_limits<double>::infinity()).find("gradient norm inf"),
            std::string::npos);
}

TEST(TrainingHealth, LossAboveTheFactorTimesTheLowestStops) {
  TrainingHealth h(4.0, 0);
  EXPECT_EQ(verdict(h, 1, 5.5, 1.0), "");
  EXPECT_EQ(verdict(h, 2, 2.0, 1.0), "");
  EXPECT_EQ(verdict(h, 3, 7.9, 1.0), "");  // below 4 x 2.0: a spike, not a blow-up
  const std::string v = verdict(h, 4, 9.4e6, 1.0);
  EXPECT_NE(v.find("step 4: the training loss 9.4e+06 is above 4x the run's lowest, 2 "
                   "(train.diverge_loss_factor)"),
            std::string::npos)
      << v;
  TrainingHealth off(0, 0);
  EXPECT_EQ(verdict(off, 1, 5.5, 1.0), "");
  EXPECT_EQ(verdict(off, 2, 9.4e6, 1.0), "");
}

TEST(TrainingHealth, ZeroGradientNormForNStepsInARowStops) {
  TrainingHealth h(0, 3);
  EXPECT_EQ(verdict(h, 1, 5.5, 0.0), "");
  EXPECT_EQ(verdict(h, 2, 5.5, 0.0), "");
  EXPECT_EQ(verdict(h, 3, 5.5, 1e-30), "");  // the run of zeros is broken
  EXPECT_EQ(verdict(h, 4, 5.5, 0.0), "");
  EXPECT_EQ(verdict(h, 5, 5.5, 0.0), "");
  const std::string v = verdict(h, 6, 5.5, 0.0);
  EXPECT_NE(v.find("step 6: the gradient norm has been exactly 0 for 3 steps "
                   "(train.diverge_zero_grad_steps)"),
            std::string::npos)
      << v;
}
