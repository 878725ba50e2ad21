// OSFT through the trainer (configs/osft_tiny.yaml) at the world size ctest runs this with, at
// ZeRO stages 1 and 2: after 50 real steps the invariants U_high^T U_low = 0 and
// V_low V_high^T = 0 hold to 1e-6 and the frozen triplets remain triplets of the dense weight
// the model reads; a run resumed from a checkpoint is bit-identical to an uninterrupted one; the
// model `engine export` loads from the checkpoint (engine/model_loading.h, no optimizer) holds
// the same dense weights; stage 3 is refused at start.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/rng.h"
#include "data/token_shard.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/config.h"
#include "engine/model_loading.h"
#include "engine/reparam/osft_reparam.h"
#include "engine/trainer.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

MatD mat(const core::Tensor& t) {
  const int64_t rows = t.dim() == 2 ? t.size(0) : t.numel();
  const int64_t cols = t.dim() == 2 ? t.size(1) : 1;
  MatD m(rows, cols);
  const std::vector<float> v = t.to_vector();
  for (int64_t i = 0; i < rows * cols; ++i)
    m.data()[i] = v[static_cast<size_t>(i)];
  return m;
}

// The trainer's OSFT plug-in (null when it has none).
const engine::OsftReparam* osft_of(const engine::Trainer& trainer) {
  for (const auto& reparam : trainer.reparams())
    if (const auto* osft = dynamic_cast<const engine::OsftReparam*>(reparam.get())) return osft;
  return nullptr;
}

bool same_bytes(const core::Tensor& a, const core::Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

class OsftTrainer : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = comm::make_mpi_world();
    dir_ = fs::temp_directory_path() / ("engine_osft_" + std::to_string(world_->size()));
    if (world_->rank() == 0) {
      fs::remove_all(dir_);
      fs::create_directories(dir_);
      core::Rng rng(9);
      for (const char* split : {"train", "val"}) {
        // A learnable stream: each token is the previous one plus 5, with a little noise.
        std::vector<uint16_t> tokens(40000);
        for (size_t i = 0; i < tokens.size(); ++i)
          tokens[i] = static_cast<uint16_t>((5 * i + rng.next_below(3)) % 256);
        data::write_shard((dir_ / (std::string("tiny_") + split + "_000.bin")).string(), tokens);
      }
    }
    world_->barrier();
  }
  void TearDown() override {
    world_->barrier();
    if (world_->rank() == 0) fs::remove_all(dir_);
  }

  // 768 tokens = 24 sequences: divisible by 1, 2 and 3 ranks.
  engine::Config config(int stage, std::vector<std::string> extra = {}) const {
    const std::string d = dir_.string();
    std::vector<std::string> sets = {"data.train=" + d + "/tiny_train_*.bin",
                                     "data.val=" + d + "/tiny_val_*.bin",
                                     "zero.stage=" + std::to_string(stage),
                                     "train.batch_tokens=768",
                                     "train.val_tokens=768",
                                     "log.dir=" + d + "/log",
                                     "checkpoint.dir=" + d + "/ckpt" + std::to_string(stage),
                                     "log.metrics=false"};
    sets.insert(sets.end(), extra.begin(), extra.end());
    return engine::load_config(std::string(ENGINE_REPO_DIR) + "/configs/osft_tiny.yaml", sets);
  }

  std::unique_ptr<comm::Communicator> world_;
  fs::path dir_;
};

TEST_F(OsftTrainer, FiftyStepsKeepTheInvariantsAtStagesOneAndTwo) {
  for (int stage : {1, 2}) {
    engine::Trainer trainer(config(stage), *world_, *world_, core::cpu_backend());
    const engine::OsftReparam* osft = osft_of(trainer);
    ASSERT_NE(osft, nullptr);
    ASSERT_EQ(osft->targets().size(), 8u);
    const double first_loss = *trainer.train_step().train_loss;
    double last_loss = first_loss;
    for (int step = 2; step <= 50; ++step)
      last_loss = *trainer.train_step().train_loss;
    EXPECT_LT(last_loss, first_loss) << "stage " << stage;
    for (size_t i = 0; i < osft->targets().size(); ++i) {
      const optim::OsftFactors f = osft->full(i);
      const std::string& name = osft->targets()[i].name;
      const MatD uh = mat(f.U_high), vh = mat(f.V_high);
      EXPECT_LT((uh.transpose() * mat(f.U_low)).cwiseAbs().maxCoeff(), 1e-6) << name;
      EXPECT_LT((mat(f.V_low) * vh.transpose()).cwiseAbs().maxCoeff(), 1e-6) << name;
      const MatD w = mat(trainer.model().param(osft->targets()[i].param));
      const MatD s = mat(f.S_high);
      const double drift =
          (uh.transpose() * w * vh.transpose() - MatD(s.col(0).asDiagonal())).cwiseAbs().maxCoeff();
      EXPECT_LT(drift, 1e-5 * std::max(1.0, s.maxCoeff())) << name << " stage " << stage;
    }
  }
}

TEST_F(OsftTrainer, ResumeIsBitIdenticalAndALoadOnlyTrainerHoldsTheDenseWeights) {
  for (int stage : {1, 2}) {
    engine::Trainer whole(config(stage), *world_, *world_, core::cpu_backend());
    std::string checkpoint;
    for (int step = 1; step <= 6; ++step) {
      whole.train_step();
      if (step == 3) checkpoint = whole.save_checkpoint();
    }
    engine::Trainer resumed(config(stage), *world_, *world_, core::cpu_backend());
    resumed.load_checkpoint(checkpoint);
    for (int step = 4; step <= 6; ++step)
      resumed.train_step();
    for (size_t i = 0; i < whole.model().table().size(); ++i)
      EXPECT_TRUE(same_bytes(whole.model().param(i), resumed.model().param(i)))
          << whole.model().table()[i].name << " stage " << stage;
    for (size_t j = 0; j < osft_of(whole)->factors().size(); ++j)
      EXPECT_TRUE(
          same_bytes(osft_of(whole)->factors()[j].value, osft_of(resumed)->factors()[j].value))
          << osft_of(whole)->factors()[j].name << " stage " << stage;

    // What `engine export` does: the model alone, loaded from the checkpoint, holds the dense
    // weights W = U_high S_high V_high + U_low S_low V_low by their names.
    const std::string last = whole.save_checkpoint();
    const std::unique_ptr<model::Gpt> exported =
        engine::load_model(config(stage), last, core::cpu_backend());
    for (size_t i = 0; i < whole.model().table().size(); ++i)
      EXPECT_TRUE(same_bytes(whole.model().param(i), exported->param(i)))
          << whole.model().table()[i].name << " stage " << stage;
  }
}

// train.init_from a dense checkpoint: the OSFT run starts from its weights (the targets through
// their fresh SVDs); a checkpoint of another model shape is refused naming the tensor.
TEST_F(OsftTrainer, InitFromADenseCheckpointDecomposesItsWeights) {
  const std::string d = dir_.string();
  auto dense_config = [&](const std::string& d_model, const std::string& ckpt) {
    return engine::load_config(
        std::string(ENGINE_REPO_DIR) + "/configs/tiny.yaml",
        {"data.train=" + d + "/tiny_train_*.bin", "data.val=" + d + "/tiny_val_*.bin",
         "train.batch_tokens=768", "train.val_tokens=768", "log.dir=" + d + "/log",
         "checkpoint.dir=" + d + "/" + ckpt, "log.metrics=false", "model.d_model=" + d_model});
  };
  engine::Trainer dense(dense_config("64", "dense"), *world_, *world_, core::cpu_backend());
  for (int step = 1; step <= 3; ++step)
    dense.train_step();
  const std::string pretrained = dense.save_checkpoint();

  engine::Trainer tuned(config(1), *world_, *world_, core::cpu_backend());
  tuned.init_params_from(pretrained);
  for (size_t i = 0; i < dense.model().table().size(); ++i) {
    const double diff =
        (mat(tuned.model().param(i)) - mat(dense.model().param(i))).cwiseAbs().maxCoeff();
    EXPECT_LT(diff, 1e-5) << dense.model().table()[i].name;
  }
  tuned.train_step();

  engine::Trainer other(dense_config("32", "other"), *world_, *world_, core::cpu_backend());
  const std::string wrong = other.save_checkpoint();
  engine::Trainer refused(config(1), *world_, *world_, core::cpu_backend());
  const std::string err = test_util::error_of([&] { refused.init_params_from(wrong); });
  EXPECT_NE(err.find("parameter embed.weight has shape [256, 32], the model expects [256, 64]"),
            std::string::npos)
      << err;
}

// A dense run init_from an OSFT checkpoint takes the dense weights rebuilt from its factors
// (engine/model_loading.h): bit for bit those the OSFT run's model held. The checkpoint records
// the validation loss of its step (checkpoint.keep_best).
TEST_F(OsftTrainer, ADenseRunInitFromAnOsftCheckpointTakesItsDenseWeights) {
  engine::Trainer tuned(config(1), *world_, *world_, core::cpu_backend());
  for (int step = 1; step <= 3; ++step)
    tuned.train_step();
  const double val_loss = tuned.evaluate();
  const std::string checkpoint = tuned.save_checkpoint();
  EXPECT_EQ(std::stod(engine::read_manifest(checkpoint).state.at(engine::kValLossKey)), val_loss);
  const std::string d = dir_.string();
  engine::Trainer dense(
      engine::load_config(
          std::string(ENGINE_REPO_DIR) + "/configs/tiny.yaml",
          {"data.train=" + d + "/tiny_train_*.bin", "data.val=" + d + "/tiny_val_*.bin",
           "train.batch_tokens=768", "train.val_tokens=768", "log.dir=" + d + "/log",
           "checkpoint.dir=" + d + "/dense_from_osft", "log.metrics=false"}),
      *world_, *world_, core::cpu_backend());
  dense.init_params_from(checkpoint);
  for (size_t i = 0; i < tuned.model().table().size(); ++i)
    EXPECT_TRUE(same_bytes(tuned.model().param(i), dense.model().param(i)))
        << tuned.model().table()[i].name;
}

TEST_F(OsftTrainer, StageThreeIsRefusedAtStart) {
  const std::string err = test_util::error_of(
      [&] { engine::Trainer t(config(3), *world_, *world_, core::cpu_backend()); });
  EXPECT_NE(err.find("'zero.stage' = 3 is not supported with osft targets"), std::string::npos)
      << err;
}

}  // namespace
