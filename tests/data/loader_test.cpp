// Loaders: rank disjointness and coverage, determinism and resume, epoch wrap and shuffle,
// micro-batching, validation order. Each (rank, world) pair is a separate loader in one process.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "data/data_loader.h"
#include "data/token_shard.h"
#include "data/val_loader.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
constexpr int64_t kT = 8;

// Three shards whose token at global position p is p % 50000, so a sequence's first input tells
// where it came from. Shard sizes give 5, 3 and 4 sequences of T=8 (leftover tokens unused).
class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("engine_loader_test_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::create_directories(dir_);
    int64_t base = 0;
    for (int64_t n : {5 * kT + 1, 3 * kT + 5, 4 * kT + 1}) {
      std::vector<uint16_t> tokens(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i)
        tokens[i] = static_cast<uint16_t>((base + i) % 50000);
      const std::string name = "train_" + std::to_string(starts_.size()) + ".bin";
      data::write_shard((dir_ / name).string(), tokens);
      starts_.push_back(base);
      base += n;
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  data::LoaderOptions options(int64_t batch_rows, int rank, int world, bool shuffle,
                              int64_t accum = 1) const {
    data::LoaderOptions o;
    o.pattern = (dir_ / "train_*.bin").string();
    o.seq_len = kT;
    o.batch_rows = batch_rows;
    o.grad_accum = accum;
    o.rank = rank;
    o.world = world;
    o.seed = 1234;
    o.shuffle = shuffle;
    return o;
  }

  fs::path dir_;
  std::vector<int64_t> starts_;
};

TEST_F(LoaderTest, SequencesAreShiftedWindowsWithinShards) {
  data::DataLoader loader(options(4, 0, 1, false));
  EXPECT_EQ(loader.sequences_per_epoch(), 12);
  data::Batch b;
  // Step 1 without shuffle: sequences 4..7 = shard 0 seq 4, shard 1 seq 0..2.
  loader.load(1, 0, b);
  const std::vector<int64_t> firsts = {starts_[0] + 4 * kT, starts_[1], starts_[1] + kT,
                                       starts_[1] + 2 * kT};
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(b.sequences[r], 4 + r);
    for (int64_t t = 0; t < kT; ++t) {
      EXPECT_EQ(b.inputs[r * kT + t], firsts[r] + t);
      EXPECT_EQ(b.targets[r * kT + t], firsts[r] + t + 1);
    }
  }
}

// data.shard_whole_batches: modded-nanogpt's distributed_data_generator (train_gpt.py at 3e121a6e)
// reads a shard of N tokens in global batches of B = b T tokens, batch k at pos = k B while
// pos + B + 1 < N, rank r taking tokens [pos + r L, pos + r L + L + 1) (L = B / world), and
// skips the rest of the shard. Here 2 ranks of one row each: the shards of 41, 29 and 33 tokens
// give 2, 1 and 1 batches (33 = 2 B + 1 is one token short of a second), 8 of the 12 sequences,
// and every rank's inputs and targets are the generator's.
TEST_F(LoaderTest, WholeBatchesPerShardReadAsTheRecordsGenerator) {
  const int world = 2;
  const int64_t rows = 2, B = rows * kT, L = B / world;
  std::vector<std::vector<int64_t>> record;  // per step, per rank: the first token's position
  const std::vector<int64_t> sizes = {5 * kT + 1, 3 * kT + 5, 4 * kT + 1};
  for (size_t shard = 0; shard < sizes.size(); ++shard) {
    for (int64_t pos = 0; pos + B + 1 < sizes[shard]; pos += B) {
      record.emplace_back();
      for (int r = 0; r < world; ++r)
        record.back().push_back(starts_[shard] + pos + r * L);
    }
  }
  ASSERT_EQ(record.size(), 4u);
  for (int r = 0; r < world; ++r) {
    data::LoaderOptions o = options(rows, r, world, false);
    o.shard_whole_batches = true;
    data::DataLoader loader(o);
    EXPECT_EQ(loader.sequences_per_epoch(), 8);
    for (size_t step = 0; step < record.size(); ++step) {
      data::Batch b;
      loader.load(static_cast<int64_t>(step), 0, b);
      for (int64_t t = 0; t < kT; ++t) {
        EXPECT_EQ(b.inputs[t], record[step][r] + t) << "step " << step << " rank " << r;
        EXPECT_EQ(b.targets[t], record[step][r] + t + 1) << "step " << step << " rank " << r;
      }
    }
    // The order is another one: a checkpoint of the plain loader does not resume this one.
    data::DataLoader plain(options(rows, r, world, false));
    EXPECT_NE(plain.state().fingerprint, loader.state().fingerprint);
  }
}

TEST_F(LoaderTest, RanksAreDisjointAndCoverTheGlobalBatch) {
  for (bool shuffle : {false, true}) {
    for (int world : {1, 2, 3, 6}) {
      for (int64_t accum : {1, 2}) {
        const int64_t rows = 6 * accum;
        data::DataLoader reference(options(rows, 0, 1, shuffle));
        for (int64_t step = 0; step < 5; ++step) {
          std::multiset<int64_t> seen;
          std::vector<int64_t> in_order;
          for (int rank = 0; rank < world; ++rank) {
            data::DataLoader loader(options(rows, rank, world, shuffle, accum));
            ASSERT_EQ(loader.micro_rows(), rows / world / accum);
            for (int64_t m = 0; m < accum; ++m) {
              data::Batch b;
              loader.load(step, m, b);
              seen.insert(b.sequences.begin(), b.sequences.end());
              in_order.insert(in_order.end(), b.sequences.begin(), b.sequences.end());
            }
          }
          // Rank-major then micro-step order reassembles the one-rank global batch exactly.
          std::vector<int64_t> global;
          for (int64_t r = 0; r < rows; ++r)
            global.push_back(reference.sequence_at(step, r));
          EXPECT_EQ(in_order, global) << "world " << world << " step " << step;
          EXPECT_EQ(seen, std::multiset<int64_t>(global.begin(), global.end()));
        }
      }
    }
  }
}

TEST_F(LoaderTest, EpochWrapVisitsEverySequenceOncePerEpoch) {
  for (bool shuffle : {false, true}) {
    data::DataLoader loader(options(3, 0, 1, shuffle));
    const int64_t s = loader.sequences_per_epoch();
    std::vector<std::vector<int64_t>> epochs(3);
    for (int64_t step = 0; step < 3 * s / 3; ++step) {
      for (int64_t r = 0; r < 3; ++r) {
        epochs[(step * 3 + r) / s].push_back(loader.sequence_at(step, r));
      }
    }
    for (auto& e : epochs) {
      std::vector<int64_t> sorted = e;
      std::sort(sorted.begin(), sorted.end());
      for (int64_t i = 0; i < s; ++i)
        EXPECT_EQ(sorted[i], i);
    }
    if (shuffle) {
      std::vector<int64_t> natural(static_cast<size_t>(s));
      for (int64_t i = 0; i < s; ++i)
        natural[i] = i;
      EXPECT_NE(epochs[0], natural) << "shuffle must change the order";
      EXPECT_NE(epochs[0], epochs[1]) << "each epoch must draw a new order";
    } else {
      EXPECT_EQ(epochs[0], epochs[1]);
    }
  }
  // A batch of 5 straddles epochs (12 sequences): step 2 holds rows 10, 11 of epoch 0 and 0..2.
  data::DataLoader plain(options(5, 0, 1, false));
  EXPECT_EQ(plain.sequence_at(2, 1), 11);
  EXPECT_EQ(plain.sequence_at(2, 2), 0);
  EXPECT_EQ(plain.epoch_of(3), 1);
}

TEST_F(LoaderTest, OrderIsAPureFunctionOfSeedAndStep) {
  data::DataLoader a(options(6, 1, 2, true, 3));
  std::vector<data::Batch> run;
  for (int i = 0; i < 20; ++i)
    a.next(run.emplace_back());
  // Resume mid-step (after 7 micro-steps = step 2, micro 1) on a fresh loader.
  data::DataLoader b(options(6, 1, 2, true, 3));
  data::LoaderState s = a.state();
  EXPECT_EQ(s.step, 6);
  EXPECT_EQ(s.micro_step, 2);
  s.step = 2;
  s.micro_step = 1;
  b.restore(s);
  for (int i = 7; i < 20; ++i) {
    data::Batch batch;
    b.next(batch);
    EXPECT_EQ(batch.inputs, run[i].inputs) << "micro-step " << i;
    EXPECT_EQ(batch.targets, run[i].targets);
  }
  EXPECT_EQ(b.state().step, 6);
  EXPECT_EQ(b.state().micro_step, 2);
  // Reading out of order changes nothing (the permutation cache is not state).
  data::DataLoader c(options(6, 1, 2, true, 3));
  data::Batch late, early;
  c.load(40, 0, late);
  c.load(0, 0, early);
  EXPECT_EQ(early.inputs, run[0].inputs);
  // Another seed gives another order.
  auto other = options(6, 1, 2, true, 3);
  other.seed = 99;
  data::DataLoader d(other);
  data::Batch x;
  bool differs = false;
  for (int64_t step = 0; step < 4 && !differs; ++step) {
    d.load(step, 0, x);
    differs = x.sequences != run[step * 3].sequences;
  }
  EXPECT_TRUE(differs);
  data::LoaderState wrong_seed{7, 0, 0, 0};
  EXPECT_THROW(b.restore(wrong_seed), core::Error);
  // Another batch shape over the same shards has another fingerprint.
  data::DataLoader e(options(12, 0, 1, true));
  EXPECT_NE(e.state().fingerprint, s.fingerprint);
  EXPECT_THROW(e.restore(s), core::Error);
  // A different world size and grad_accum may resume: the global batch is the same.
  data::DataLoader f(options(6, 0, 3, true, 1));
  EXPECT_NO_THROW(f.restore(data::LoaderState{1234, 2, 0, s.fingerprint}));
}

// Resume on another world size, batch by batch through next(): a state saved by rank 0 of a
// world-2 run (grad_accum 3) restored on 3 ranks (grad_accum 1) and on 1 rank (grad_accum 6)
// reads, at every later step, the global batch the world-2 run reads, in the same order.
TEST_F(LoaderTest, RestoredAtAnotherWorldSizeReadsTheSameBatches) {
  const int64_t rows = 6;
  // The global batches of `steps` steps after `state`, rank-major then micro-step order.
  auto global_batches = [&](int world, int64_t accum, const data::LoaderState& state, int steps) {
    std::vector<std::vector<int64_t>> out(steps);
    for (int rank = 0; rank < world; ++rank) {
      data::DataLoader loader(options(rows, rank, world, true, accum));
      loader.restore(state);
      for (int step = 0; step < steps; ++step) {
        for (int64_t m = 0; m < accum; ++m) {
          data::Batch b;
          loader.next(b);
          out[step].insert(out[step].end(), b.sequences.begin(), b.sequences.end());
        }
      }
    }
    return out;
  };
  data::DataLoader saved(options(rows, 0, 2, true, 3));
  for (int i = 0; i < 3 * 4; ++i) {  // four steps
    data::Batch b;
    saved.next(b);
  }
  const data::LoaderState state = saved.state();
  ASSERT_EQ(state.step, 4);
  const auto two = global_batches(2, 3, state, 6);
  for (auto [world, accum] : {std::pair<int, int64_t>{3, 1}, {1, 6}, {2, 1}}) {
    const auto other = global_batches(world, accum, state, 6);
    for (int step = 0; step < 6; ++step) {
      ASSERT_EQ(other[step].size(), static_cast<size_t>(rows));
      EXPECT_EQ(other[step], two[step]) << "world " << world << " step " << 4 + step;
    }
  }
  // And it is the one-rank reference order, not just any consistent one.
  data::DataLoader reference(options(rows, 0, 1, true));
  for (int step = 0; step < 6; ++step)
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(two[step][r], reference.sequence_at(4 + step, r));
}

TEST_F(LoaderTest, BadConfigurationsAreRefused) {
  EXPECT_THROW(data::DataLoader(options(5, 0, 2, false)), core::Error);     // 5 % 2
  EXPECT_THROW(data::DataLoader(options(4, 2, 2, false)), core::Error);     // rank >= world
  EXPECT_THROW(data::DataLoader(options(4, 0, 2, false, 4)), core::Error);  // 4 % 8
  auto none = options(4, 0, 1, false);
  none.pattern = (dir_ / "nothing_*.bin").string();
  try {
    data::DataLoader loader(none);
    ADD_FAILURE() << "an empty glob must be refused";
  } catch (const core::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no file matches the token-shard pattern '" + none.pattern + "'"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("make_tiny_data.py"), std::string::npos) << what;
  }
  // A missing folder is named, relative patterns say which directory they are relative to.
  auto missing = options(4, 0, 1, false);
  missing.pattern = "no_such_folder_xyz/train_*.bin";
  try {
    data::DataLoader loader(missing);
    ADD_FAILURE() << "a pattern in a missing folder must be refused";
  } catch (const core::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the folder no_such_folder_xyz does not exist"), std::string::npos) << what;
    EXPECT_NE(what.find("relative to the working directory " + fs::current_path().string()),
              std::string::npos)
        << what;
    EXPECT_EQ(what.find("glob error"), std::string::npos) << what;
  }
  // A bad shard among good ones is named.
  { std::ofstream((dir_ / "train_9.bin").string()) << std::string(1500, 'x'); }
  try {
    data::DataLoader loader(options(4, 0, 1, false));
    ADD_FAILURE() << "a bad shard must be refused";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("train_9.bin"), std::string::npos) << e.what();
  }
}

TEST_F(LoaderTest, TokenIdsAreCheckedAgainstTheVocabularyAtLoad) {
  // Shards 0 and 1 hold positions 0..69 (valid below 100); shard 2 holds 70..102 and its token
  // 30 (position 100) is the first id >= 100: refused when the loader is built, before any
  // batch is read.
  auto o = options(4, 0, 1, false);
  o.vocab_size = 100;
  const std::string what = test_util::error_of([&] { data::DataLoader loader(o); });
  EXPECT_NE(what.find("train_2.bin"), std::string::npos) << what;
  EXPECT_NE(what.find("token 30 has id 100 >= vocabulary size 100"), std::string::npos) << what;
  EXPECT_NE(what.find("the largest id in the shard is 102"), std::string::npos) << what;
  o.vocab_size = 50000;
  EXPECT_NO_THROW(data::DataLoader{o});
}

TEST_F(LoaderTest, ValidationReadsFixedTokensInFileOrder) {
  for (int world : {1, 2, 4}) {
    std::vector<int64_t> order;
    int64_t steps = 0;
    for (int rank = 0; rank < world; ++rank) {
      data::ValOptions o;
      o.pattern = (dir_ / "train_*.bin").string();
      o.seq_len = kT;
      o.batch_rows = 4;
      o.val_tokens = 8 * kT;
      o.rank = rank;
      o.world = world;
      data::ValLoader val(o);
      steps = val.num_steps();
      EXPECT_EQ(val.tokens(), 8 * kT);
      for (int64_t s = 0; s < steps; ++s) {
        data::Batch b;
        val.load(s, b);
        ASSERT_EQ(b.rows, 4 / world);
        for (int64_t r = 0; r < b.rows; ++r) {
          EXPECT_EQ(b.sequences[r], s * 4 + rank * (4 / world) + r);
          order.push_back(b.sequences[r]);
        }
      }
    }
    EXPECT_EQ(steps, 2);
    std::sort(order.begin(), order.end());
    for (int64_t i = 0; i < 8; ++i)
      EXPECT_EQ(order[i], i);
  }
  data::ValOptions all;
  all.pattern = (dir_ / "train_*.bin").string();
  all.seq_len = kT;
  all.batch_rows = 5;
  EXPECT_EQ(data::ValLoader(all).num_steps(), 2);  // 12 sequences, whole steps of 5
  all.val_tokens = 3 * 5 * kT;                     // 15 sequences > 12
  EXPECT_THROW(data::ValLoader{all}, core::Error);
  all.val_tokens = 7;  // not a multiple of a step
  EXPECT_THROW(data::ValLoader{all}, core::Error);
}

}  // namespace
