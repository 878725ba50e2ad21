// Preflight: the model-size check and the refusal of a fresh start into another run's folders.
#include "engine/preflight.h"

#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>

#include "engine/checkpoint/checkpoint_files.h"
#include "tests/test_util.h"

using test_util::error_of;

namespace {

namespace fs = std::filesystem;

engine::Config tiny(const std::vector<std::string>& sets = {}) {
  return engine::parse_config(
      "model: {n_layer: 2, d_model: 64, seq_len: 32, vocab_size: 256}\n"
      "data: {train: a, val: b}\n"
      "train: {batch_tokens: 256, val_tokens: 64}\n"
      "optim: [{params: ['*'], optimizer: adamw}]\n",
      "tiny.yaml", sets);
}

TEST(Preflight, ModelLargerThanMemoryIsRefusedByItsKeys) {
  engine::Config c = tiny({"model.d_model=10000000", "model.n_head=4"});
  EXPECT_GT(engine::estimated_parameters(c), 1e15);
  const std::string msg = error_of([&] { engine::check_model_fits_memory(c, 64e9); });
  EXPECT_NE(msg.find("config error: tiny.yaml: the model of model.d_model = 10000000, "
                     "model.n_layer = 2, model.vocab_size = 256 has about 2.4e+15 parameters"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("more than this machine's 64 GB of memory"), std::string::npos) << msg;
  EXPECT_NO_THROW(engine::check_model_fits_memory(tiny(), 64e9));
  EXPECT_NO_THROW(engine::check_model_fits_memory(tiny()));  // this machine
}

class FreshStart : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("engine_preflight_" +
             std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "ckpt");
  }
  void TearDown() override { fs::remove_all(root_); }
  engine::Config config(const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> sets = {"log.dir=" + root_.string(),
                                     "checkpoint.dir=" + (root_ / "ckpt").string()};
    sets.insert(sets.end(), extra.begin(), extra.end());
    return tiny(sets);
  }
  fs::path root_;
};

TEST_F(FreshStart, EmptyFoldersAndResumesPass) {
  EXPECT_NO_THROW(engine::prepare_fresh_start(config()));
  std::ofstream(root_ / "config.yaml") << "x\n";  // a config.yaml alone is no run
  EXPECT_NO_THROW(engine::prepare_fresh_start(config()));
  fs::create_directories(root_ / "ckpt" / "step_00000005");
  EXPECT_NO_THROW(engine::prepare_fresh_start(config({"checkpoint.resume=step_00000005"})));
}

TEST_F(FreshStart, AnotherRunsOutputIsRefusedNamingTheFolderAndChoices) {
  fs::create_directories(root_ / "ckpt" / "step_00000010");
  fs::create_directories(root_ / "ckpt" / "step_00000020");
  std::ofstream(root_ / "metrics.jsonl") << "{\"step\":0}\n";
  // auto with no complete checkpoint (no manifest) is a fresh start too.
  for (const std::string resume : {"", "auto"}) {
    const std::string msg =
        error_of([&] { engine::prepare_fresh_start(config({"checkpoint.resume=" + resume})); });
    EXPECT_NE(msg.find("refusing a fresh start: " + (root_ / "ckpt").string() +
                       " holds 2 checkpoint folder(s) of an earlier run (step_00000010 ... "
                       "step_00000020) and " +
                       (root_ / "metrics.jsonl").string() + " holds an earlier run's metrics"),
              std::string::npos)
        << msg;
    for (const char* choice :
         {"--set log.dir=", "--set checkpoint.dir=", "--set checkpoint.overwrite=true"})
      EXPECT_NE(msg.find(choice), std::string::npos) << msg;
    // Neither folder is a complete checkpoint (no manifest): there is nothing to resume, and
    // resume=auto, refused here, is no choice to offer.
    EXPECT_NE(msg.find(", and no complete checkpoint to resume (the earlier run saved none, or "
                       "was stopped before its first one was complete)"),
              std::string::npos)
        << msg;
    EXPECT_EQ(msg.find("checkpoint.resume=auto"), std::string::npos) << msg;
  }
  EXPECT_TRUE(fs::exists(root_ / "ckpt" / "step_00000010"));
  EXPECT_TRUE(fs::exists(root_ / "metrics.jsonl"));

  std::ofstream(root_ / "ckpt" / "step_00000020" / "manifest.yaml") << "step: 20\n";
  const std::string msg = error_of([&] { engine::prepare_fresh_start(config()); });
  EXPECT_NE(msg.find("Choose one: resume it (--set checkpoint.resume=auto), write elsewhere"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("no complete checkpoint"), std::string::npos) << msg;
}

TEST_F(FreshStart, OverwriteDeletesOnlyTheEarlierRunsCheckpointsAndMetrics) {
  fs::create_directories(root_ / "ckpt" / "step_00000010");
  fs::create_directories(root_ / "ckpt" / "step_00000015.tmp");
  std::ofstream(root_ / "ckpt" / "notes.txt") << "mine\n";
  std::ofstream(root_ / "metrics.jsonl") << "{\"step\":0}\n";
  std::ofstream(root_ / "events.out.tfevents.1700000000.host.12") << "x";
  std::ofstream(root_ / "events.txt") << "mine\n";
  engine::prepare_fresh_start(config({"checkpoint.overwrite=true"}));
  EXPECT_FALSE(fs::exists(root_ / "ckpt" / "step_00000010"));
  EXPECT_FALSE(fs::exists(root_ / "ckpt" / "step_00000015.tmp"));
  EXPECT_FALSE(fs::exists(root_ / "metrics.jsonl"));
  EXPECT_FALSE(fs::exists(root_ / "events.out.tfevents.1700000000.host.12"));
  EXPECT_TRUE(fs::exists(root_ / "ckpt" / "notes.txt"));
  EXPECT_TRUE(fs::exists(root_ / "events.txt"));
}

// A log or checkpoint folder that cannot be created gave a raw `filesystem error` naming no key,
// on rank 0 alone (so after the 10 s wait and Open MPI's banner); refused as a config error.
TEST_F(FreshStart, FoldersThatCannotBeCreatedAreRefusedNamingTheKey) {
  EXPECT_NO_THROW(engine::prepare_run_folders(config({"log.dir=" + (root_ / "new/log").string()})));
  EXPECT_TRUE(fs::is_directory(root_ / "new/log"));
  std::ofstream(root_ / "file") << "x\n";
  std::string msg = error_of(
      [&] { engine::prepare_run_folders(config({"log.dir=" + (root_ / "file/log").string()})); });
  EXPECT_EQ(msg.rfind("config error: --set log.dir=", 0), 0u) << msg;
  EXPECT_NE(msg.find(": key 'log.dir': folder '" + (root_ / "file/log").string() +
                     "' cannot be created: Not a directory"),
            std::string::npos)
      << msg;
  msg = error_of([&] {
    engine::prepare_run_folders(config({"checkpoint.dir=" + (root_ / "file").string()}));
  });
  EXPECT_NE(msg.find("key 'checkpoint.dir': folder '" + (root_ / "file").string() + "' "),
            std::string::npos)
      << msg;
  // A working folder deleted under the run: relative folders cannot be made.
  const fs::path cwd = fs::current_path();
  fs::create_directories(root_ / "gone");
  ASSERT_EQ(::chdir((root_ / "gone").c_str()), 0);
  fs::remove(root_ / "gone");
  msg = error_of([&] {
    engine::prepare_run_folders(tiny({"log.dir=runs/x", "checkpoint.dir=runs/x/ckpt"}));
  });
  ASSERT_EQ(::chdir(cwd.c_str()), 0);
  EXPECT_NE(msg.find("key 'log.dir': folder 'runs/x' cannot be created: No such file or directory"),
            std::string::npos)
      << msg;
}

// checkpoint.resume=auto before the first complete checkpoint was refused as a fresh start into
// another run's folders, so a scheduler requeuing the same command was stuck. When what is there
// is this config's own first attempt (its log.dir/config.yaml, unfinished saves only), it starts
// afresh; anything else is still refused.
TEST_F(FreshStart, AutoAfterThisConfigsUnfinishedFirstSaveStartsAfresh) {
  const auto first_attempt = [&](const engine::Config& started) {
    fs::create_directories(root_ / "ckpt" / "step_00000010.tmp");
    std::ofstream(root_ / "ckpt" / "step_00000010.tmp" / "rank_00000.safetensors") << "part";
    std::ofstream(root_ / "metrics.jsonl") << "{\"step\":0}\n";
    std::ofstream(root_ / "config.yaml") << engine::config_to_yaml(started);
  };
  first_attempt(config());
  EXPECT_NO_THROW(engine::prepare_fresh_start(config({"checkpoint.resume=auto"})));
  EXPECT_FALSE(fs::exists(root_ / "ckpt" / "step_00000010.tmp"));
  EXPECT_FALSE(fs::exists(root_ / "metrics.jsonl"));

  // A first attempt that finished (its metrics reach train.steps) without saving, another
  // config's output, or a step folder that is no unfinished save, stays refused.
  first_attempt(config({"train.steps=3"}));
  std::ofstream(root_ / "metrics.jsonl", std::ios::app) << "{\"step\":3}\n";
  const std::string finished = error_of([&] {
    engine::prepare_fresh_start(config({"train.steps=3", "checkpoint.resume=auto"}));
  });
  EXPECT_NE(finished.find("refusing a fresh start"), std::string::npos) << finished;
  first_attempt(config({"train.steps=77"}));
  std::string msg =
      error_of([&] { engine::prepare_fresh_start(config({"checkpoint.resume=auto"})); });
  EXPECT_NE(msg.find("refusing a fresh start"), std::string::npos) << msg;
  first_attempt(config());
  fs::create_directories(root_ / "ckpt" / "step_00000005");
  msg = error_of([&] { engine::prepare_fresh_start(config({"checkpoint.resume=auto"})); });
  EXPECT_NE(msg.find("refusing a fresh start"), std::string::npos) << msg;
  // Without auto nothing changes: a fresh start over it is refused.
  fs::remove_all(root_ / "ckpt" / "step_00000005");
  msg = error_of([&] { engine::prepare_fresh_start(config()); });
  EXPECT_NE(msg.find("refusing a fresh start"), std::string::npos) << msg;
  EXPECT_TRUE(fs::exists(root_ / "ckpt" / "step_00000010.tmp"));
}

// A complete one-rank checkpoint of `step` under root.
std::string save_checkpoint(const fs::path& root, int64_t step) {
  engine::prepare_staging(root.string(), step);
  const std::vector<float> values = {1.f, 2.f};
  engine::write_rank_file(engine::staging_path(root.string(), step), 0,
                          {{"w", {2}, 0, 0, core::Tensor::from_vector({2}, values)}});
  engine::Manifest m;
  m.step = step;
  m.world_size = 1;
  m.state = {{"data.step", std::to_string(step)}};
  return engine::commit_checkpoint(root.string(), m, 10);
}

// Resuming from an older checkpoint while newer ones exist replaced them silently (a save of the
// same step) and let rotation delete the run's own new ones as the oldest: refused naming them,
// or, with checkpoint.overwrite=true, the newer ones are deleted first.
TEST_F(FreshStart, ResumingFromAnOlderCheckpointIsRefusedWithoutOverwrite) {
  const std::string s10 = save_checkpoint(root_ / "ckpt", 10);
  save_checkpoint(root_ / "ckpt", 20);
  const std::string s30 = save_checkpoint(root_ / "ckpt", 30);
  const std::string msg = error_of([&] { engine::prepare_resume_from_older(config(), s10, 10); });
  EXPECT_NE(msg.find("refusing to resume from " + s10 + " (step 10): " + (root_ / "ckpt").string() +
                     " holds 2 newer checkpoint(s) (step_00000020 ... step_00000030)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("--set checkpoint.resume=auto"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--set checkpoint.overwrite=true"), std::string::npos) << msg;
  EXPECT_EQ(engine::list_checkpoints((root_ / "ckpt").string()).size(), 3u);
  EXPECT_NO_THROW(engine::prepare_resume_from_older(config(), s30, 30));
  engine::prepare_resume_from_older(config({"checkpoint.overwrite=true"}), s10, 10);
  EXPECT_EQ(engine::list_checkpoints((root_ / "ckpt").string()), (std::vector<std::string>{s10}));
}

}  // namespace
