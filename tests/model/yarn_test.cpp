// Record #89's YaRN (model/layers/yarn.h) against the record's own Yarn.apply on its windows, and
// its reach into the attention blocks (AttentionMasks: the scale, the device frequencies).
#include "model/layers/yarn.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace {

// The record's attention: 6 heads of 128, the half-truncated rotary at base 1024.
model::ModelConfig record_heads() {
  model::ModelConfig c;
  c.n_head = 6;
  c.d_model = 768;
  c.rotary_base = 1024.0f;
  c.rotary_truncate = true;
  c.window = 2560;
  c.yarn = true;
  return c;
}

// The spec's attention scales (section 2.4) over the record's long windows 3, 7, 11, 13 blocks of
// 128, and the frequencies of train_gpt.py's Yarn after the three growths: torch float32 running
// reset() and apply() as the record does (the engine's pairs (j, j + 64), j < 32 rotated).
TEST(Yarn, TheRecordsWindowsGiveItsScalesAndFrequencies) {
  model::Yarn yarn(record_heads());
  yarn.set_window(384, true);  // the first window anchors
  EXPECT_EQ(yarn.scale(), 1.0);
  const int windows[] = {896, 1408, 1664};
  const double scales[] = {0.11695, 0.12752, 0.13178};
  for (int i = 0; i < 3; ++i) {
    yarn.set_window(windows[i], true);
    EXPECT_NEAR(0.1 * yarn.scale(), scales[i], 5e-6) << "window " << windows[i];
  }
  const std::vector<std::pair<int, double>> freqs = {{0, 1.0},
                                                     {5, 2.545073330e-01},
                                                     {10, 3.617491573e-02},
                                                     {15, 8.717407472e-03},
                                                     {20, 2.636628691e-03},
                                                     {25, 8.620189619e-04},
                                                     {31, 2.253605926e-04},
                                                     {32, 0.0},
                                                     {63, 0.0}};
  for (const auto& [j, f] : freqs)
    EXPECT_NEAR(yarn.frequencies()[static_cast<size_t>(j)], f, 1e-6 * f) << "pair " << j;
  // The final validation's window: wider, not rescaled; back to the trained one: unchanged.
  const std::vector<double> trained = yarn.frequencies();
  const double scale = yarn.scale();
  yarn.set_window(2560, false);
  yarn.set_window(1664, true);
  EXPECT_EQ(yarn.frequencies(), trained);
  EXPECT_EQ(yarn.scale(), scale);
}

// One growth by hand: the fastest pair (f = 1 turns 61 times over 384 tokens) is kept, the
// slowest rotated one (f = 1/1024, 0.06 turns) is interpolated by 384 / 896, the unrotated stay 0.
TEST(Yarn, InterpolatesSlowPairsAndKeepsFastOnes) {
  model::Yarn yarn(record_heads());
  yarn.set_window(384, true);
  yarn.set_window(384, true);
  EXPECT_EQ(yarn.scale(), 1.0);  // no change, no growth
  yarn.set_window(896, true);
  EXPECT_DOUBLE_EQ(yarn.frequencies()[0], 1.0);
  EXPECT_NEAR(yarn.frequencies()[31], 384.0 / 896.0 / 1024.0, 1e-15);
  EXPECT_EQ(yarn.frequencies()[40], 0.0);
  EXPECT_NEAR(yarn.scale(), 1.0 + 0.2 * std::log(896.0 / 384.0), 1e-15);
}

}  // namespace
