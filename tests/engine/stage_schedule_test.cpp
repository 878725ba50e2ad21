// The batch stages of record #89 (train.stages.*) against the record's own numbers
// (train_gpt.py at f411b3d3, TrainingSchedule, TRAINING_STAGES, get_muon_momentum; the spec's
// table 2.7), with the record's formulas written out here: lookup's t, get_lr, the weight ramps.
#include "engine/stage_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/check.h"
#include "engine/config.h"
#include "optim/muon/muon.h"

namespace {

// The record's schedule as keys: 1270 scheduled steps in thirds, 15 extension steps, rows of 8.
const char* kRecordStages = R"(
model:
  seq_len: 49152
data:
  train: unused_train_*.bin
  val: unused_val_*.bin
train:
  steps: 1285
  batch_tokens: 393216
  lr_cooldown_frac: 0.6
  lr_floor: 0.15
  stages:
    batch_tokens: "131072; 262144; 393216; 393216"
    durations: "1/3; 1/3; 1/3"
    extension_steps: 15
    rows: 8
    max_doc_tokens: "896; 2048; 2048; 2048"
    windows: "128 384; 384 896; 640 1408; 768 1664"
    lr_mul: "1.0; 1.52; 1.73; 1.0"
    mtp: "1 0.5 0.25>0; 1 0.5>0; 1; 1"
    prefix: "0.25; 0.25>0; 0; 0"
    final_window: 2560
optim:
  - params: ["*"]
    optimizer: adamw
)";

engine::StageSchedule record_schedule(const std::vector<std::string>& sets = {}) {
  return engine::StageSchedule::of(engine::parse_config(kRecordStages, "record89.yaml", sets));
}

// get_lr(step), written out: m = the stage's lr_mul, cooldown from int(1270 * (1 - 0.6)).
double record_lr(int64_t step) {
  const double m = step < 423 ? 1.0 : step < 847 ? 1.52 : step < 1270 ? 1.73 : 1.0;
  const auto cd = static_cast<int64_t>(1270 * (1 - 0.6));
  if (step < cd) return m;
  const double t = std::min(1.0, static_cast<double>(step - cd) / (1270 - cd));
  return m * (1 - t) + 0.15 * t;
}

TEST(StageSchedule, BoundsAreTheRecordsThirds) {
  const engine::StageSchedule s = record_schedule();
  ASSERT_TRUE(s.enabled());
  ASSERT_EQ(s.stages().size(), 4u);
  const std::vector<std::pair<int64_t, int64_t>> bounds = {
      {0, 423}, {423, 847}, {847, 1270}, {1270, 1285}};
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(s.stages()[k].begin_step, bounds[k].first) << k;
    EXPECT_EQ(s.stages()[k].end_step, bounds[k].second) << k;
  }
  EXPECT_EQ(s.transition_steps(), (std::vector<int64_t>{423, 847, 1270}));
  EXPECT_EQ(s.total_steps(), 1285);
  EXPECT_EQ(s.stage_index(422), 0);
  EXPECT_EQ(s.stage_index(423), 1);
  EXPECT_EQ(s.stage_index(846), 1);
  EXPECT_EQ(s.stage_index(847), 2);
  EXPECT_EQ(s.stage_index(1270), 3);
  EXPECT_EQ(s.stage_index(1285), 3);  // the final validation's step
  // Rows per GPU (8 rows a step), documents, the record's TRAIN_MAX_NUM_DOCS.
  const std::vector<int64_t> rows = {16384, 32768, 49152, 49152}, docs = {896, 2048, 2048, 2048},
                             caps = {64, 96, 128, 128};
  int64_t tokens = 0;
  for (size_t k = 0; k < 4; ++k) {
    EXPECT_EQ(s.stages()[k].row_tokens, rows[k]);
    EXPECT_EQ(s.stages()[k].max_doc_tokens, docs[k]);
    EXPECT_EQ(s.stages()[k].max_docs, caps[k]);
  }
  for (int64_t step = 0; step < s.total_steps(); ++step)
    tokens += s.settings(step).batch_tokens;
  EXPECT_EQ(tokens, 338821120);  // 423 x 131072 + 424 x 262144 + 438 x 393216
}

TEST(StageSchedule, LrIsTheRecordsGetLrAtEveryStep) {
  const engine::StageSchedule s = record_schedule();
  for (int64_t step = 0; step <= 1285; ++step)
    EXPECT_EQ(s.lr_multiplier(step), record_lr(step)) << "step " << step;
  // The spec's values: no warmup, 1.52 at 508, 0.912 at 846, 1.027 at 847 (the jump), 0.15 from
  // 1270.
  EXPECT_EQ(s.lr_multiplier(0), 1.0);
  EXPECT_EQ(s.lr_multiplier(507), 1.52);
  EXPECT_EQ(s.lr_multiplier(508), 1.52);
  EXPECT_NEAR(s.lr_multiplier(846), 0.912, 5e-4);
  EXPECT_NEAR(s.lr_multiplier(847), 1.027, 5e-4);
  EXPECT_EQ(s.lr_multiplier(1270), 0.15);
  EXPECT_EQ(s.lr_multiplier(1284), 0.15);
}

TEST(StageSchedule, WindowsAndWeightsRampWithinTheirStage) {
  const engine::StageSchedule s = record_schedule();
  auto at = [&](int64_t step) { return s.settings(step); };
  EXPECT_EQ(at(0).window_short, 128);
  EXPECT_EQ(at(0).window_long, 384);
  EXPECT_EQ(at(423).window_short, 384);
  EXPECT_EQ(at(423).window_long, 896);
  EXPECT_EQ(at(847).window_short, 640);
  EXPECT_EQ(at(847).window_long, 1408);
  EXPECT_EQ(at(1270).window_short, 768);
  EXPECT_EQ(at(1270).window_long, 1664);
  EXPECT_EQ(at(1284).window_long, 1664);
  // The final validation (after step 1285): long 2560, short kept.
  EXPECT_EQ(at(1285).window_long, 2560);
  EXPECT_EQ(at(1285).window_short, 768);
  // MTP [1, 0.5, 0.25->0] over steps 0-422, t = step / 423 (a + (b - a) t).
  EXPECT_EQ(at(0).mtp_weights, (std::vector<double>{1.0, 0.5, 0.25}));
  EXPECT_EQ(at(211).mtp_weights,
            (std::vector<double>{1.0, 0.5, 0.25 + (0.0 - 0.25) * (211.0 / 423)}));
  EXPECT_EQ(at(422).mtp_weights[2], 0.25 + (0.0 - 0.25) * (422.0 / 423));
  // [1, 0.5->0] over 423-846, t = (step - 423) / 424; then [1].
  EXPECT_EQ(at(423).mtp_weights, (std::vector<double>{1.0, 0.5}));
  EXPECT_EQ(at(846).mtp_weights, (std::vector<double>{1.0, 0.5 + (0.0 - 0.5) * (423.0 / 424)}));
  EXPECT_EQ(at(847).mtp_weights, (std::vector<double>{1.0}));
  EXPECT_EQ(at(1284).mtp_weights, (std::vector<double>{1.0}));
  // Prefix 0.25, then 0.25->0 in stage 2, then 0.
  EXPECT_EQ(at(0).prefix_weight, 0.25);
  EXPECT_EQ(at(422).prefix_weight, 0.25);
  EXPECT_EQ(at(423).prefix_weight, 0.25);
  EXPECT_EQ(at(635).prefix_weight, 0.25 + (0.0 - 0.25) * (212.0 / 424));
  EXPECT_EQ(at(847).prefix_weight, 0.0);
}

// get_muon_momentum (0.85 -> 0.95 over steps 0-300, back to 0.85 over the last 50 of 1285) is
// the muon keys' schedule with train.steps 1285 (optim/muon: momentum_start 0.85,
// momentum_warmup_steps 300, momentum_end 0.85, momentum_cooldown_steps 50); StepContext.step
// is the record's step + 1.
TEST(StageSchedule, MuonMomentumKeysGiveTheRecordsSchedule) {
  optim::MuonConfig c;
  c.momentum = 0.95;
  c.momentum_start = 0.85;
  c.momentum_warmup_steps = 300;
  c.momentum_end = 0.85;
  c.momentum_cooldown_steps = 50;
  double worst = 0;
  for (int64_t step = 0; step < 1285; ++step) {
    double want = 0.95;
    if (step < 300)
      want = 0.85 + step / 300.0 * (0.95 - 0.85);
    else if (step > 1235)
      want = 0.95 - (step - 1235) / 50.0 * (0.95 - 0.85);
    worst = std::max(worst, std::abs(c.momentum_at(step + 1, 1285) - want));
  }
  EXPECT_LT(worst, 1e-15);
  EXPECT_NEAR(c.momentum_at(1, 1285), 0.85, 1e-15);
  EXPECT_NEAR(c.momentum_at(151, 1285), 0.90, 1e-15);
  EXPECT_NEAR(c.momentum_at(301, 1285), 0.95, 1e-15);
  EXPECT_NEAR(c.momentum_at(1236, 1285), 0.95, 1e-15);
  EXPECT_NEAR(c.momentum_at(1285, 1285), 0.852, 1e-15);
}

TEST(StageSchedule, OffUnlessGivenAndBadKeysNamed) {
  EXPECT_FALSE(engine::StageSchedule::of(engine::Config{}).enabled());
  auto message = [](const std::vector<std::string>& sets) {
    try {
      record_schedule(sets);
    } catch (const core::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({"train.stages.lr_mul=1.0; 1.52"})
                .find("key 'train.stages.lr_mul': has 2 stages ('1.0; 1.52'), expected 4"),
            std::string::npos);
  EXPECT_NE(message({"train.stages.durations=1/3; 1/3; 1/4"}).find("train.stages.durations"),
            std::string::npos);
  EXPECT_NE(message({"train.stages.windows=128; 384 896; 640 1408; 768 1664"})
                .find("stage '128' is not 'SHORT LONG'"),
            std::string::npos);
  EXPECT_NE(message({"train.stages.windows=128 384; 1024 896; 640 1408; 768 1664"})
                .find("stage '1024 896': the short window must be in [1, the long one]"),
            std::string::npos);
  EXPECT_NE(message({"train.stages.rows=7"}).find("do not divide into train.stages.rows = 7"),
            std::string::npos);
  EXPECT_NE(message({"model.seq_len=16384"}).find("longer than model.seq_len = 16384"),
            std::string::npos);
  EXPECT_NE(message({"train.lr_warmup_steps=5"}).find("must be 0 with train.stages"),
            std::string::npos);
  // The loss's weights: up to 4 multi-token weights, none negative.
  EXPECT_NE(
      message({"train.stages.mtp=1 0.5 0.25 0.1 0.1; 1; 1; 1"})
          .find("key 'train.stages.mtp': stage '1 0.5 0.25 0.1 0.1' has 5 weights, at most 4"),
      std::string::npos);
  EXPECT_NE(message({"train.stages.mtp=1 -0.5; 1; 1; 1"}).find("has a negative weight"),
            std::string::npos);
  EXPECT_NE(message({"train.stages.prefix=0.25>-1; 0; 0; 0"})
                .find("key 'train.stages.prefix': stage '0.25>-1' has a negative weight"),
            std::string::npos);
}

}  // namespace
