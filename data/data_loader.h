// The training loader: which sequences each rank reads at each step is a pure function of
// (seed, step, micro_step, rank, world), so a run resumed at step s sees exactly the batches the
// uninterrupted run saw.
//
// Order: a global counter c = step * batch_rows + row walks the ShardSet's sequences; epoch
// e = c / S and position i = c % S (S = sequences per epoch). Without shuffle, sequence i is read;
// with shuffle, sequence perm_e[i], where perm_e is a Fisher-Yates permutation drawn from
// core::Rng(rng_hash(seed, e)): a fresh order of start positions every epoch. A batch may
// straddle two epochs.
//
// Split: the global batch has batch_rows rows per optimizer step. Rank r of W owns rows
// [r*L, (r+1)*L) with L = batch_rows / W, and micro-step m of A (gradient accumulation) reads
// rows [r*L + m*b, r*L + (m+1)*b) with b = L / A. batch_rows must divide by W*A, so every rank
// and micro-step has the same number of rows and a plain average of gradients is the mean.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/shard_set.h"
#include "data/train_loader.h"

namespace data {

struct LoaderOptions {
  std::string pattern;     // glob of token shards, e.g. data/brown/brown_train_*.bin
  int64_t seq_len = 0;     // T
  int64_t batch_rows = 0;  // global sequences per optimizer step (all ranks, all micro-steps)
  int64_t grad_accum = 1;  // micro-steps per optimizer step
  int rank = 0;            // rank in the data-parallel group
  int world = 1;           // size of the data-parallel group
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t vocab_size = 50257;
  // Each shard gives whole global batches only, the rest of it skipped (ShardSet's
  // whole_batch_rows = batch_rows): the record's generator.
  bool shard_whole_batches = false;
};

// What a checkpoint stores to resume the loader: the next (step, micro_step) to read, the seed
// that fixes the order, and a fingerprint of what the order also depends on (the shards' token
// counts, seq_len, batch_rows, shuffle). restore() refuses a different seed or fingerprint
// (fingerprint 0 skips that check). The world size and grad_accum may change across a resume
// at a step boundary: the global batch of each step stays the same.
struct LoaderState {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t micro_step = 0;
  uint64_t fingerprint = 0;
};

class DataLoader : public TrainLoader {
 public:
  explicit DataLoader(const LoaderOptions& options);

  const LoaderOptions& options() const { return options_; }
  const ShardSet& shards() const override { return *shards_; }
  const std::string& pattern() const override { return options_.pattern; }
  int64_t micro_steps(int64_t) const override { return options_.grad_accum; }
  uint64_t fingerprint() const override { return fingerprint_; }
  std::vector<OrderKey> order_keys() const override;
  int64_t sequences_per_epoch() const { return shards_->num_sequences(); }
  // Rows one rank reads per micro-step.
  int64_t micro_rows() const { return micro_rows_; }
  int64_t tokens_per_step() const { return options_.batch_rows * options_.seq_len; }
  // The epoch the first row of `step` falls in.
  int64_t epoch_of(int64_t step) const;

  // The global sequence number read by global row `row` of optimizer step `step`.
  int64_t sequence_at(int64_t step, int64_t row) const;
  // Fills `out` with this rank's rows for (step, micro_step). Pure in its arguments; not
  // thread-safe (it caches the permutations of the last two epochs).
  void load(int64_t step, int64_t micro_step, Batch& out) const override;

  // Sequential use: the batch at the current position, then advance (micro-step, then step).
  void next(Batch& out);
  LoaderState state() const { return {options_.seed, step_, micro_step_, fingerprint_}; }
  void restore(const LoaderState& state);

 private:
  const std::vector<uint32_t>& permutation(int64_t epoch) const;

  LoaderOptions options_;
  std::unique_ptr<ShardSet> shards_;
  int64_t micro_rows_ = 0;
  int64_t step_ = 0;
  int64_t micro_step_ = 0;
  uint64_t fingerprint_ = 0;
  // Permutation cache: slot epoch % 2, so a batch straddling two epochs never recomputes.
  mutable std::array<int64_t, 2> cached_epoch_{-1, -1};
  mutable std::array<std::vector<uint32_t>, 2> cached_perm_;
};

}  // namespace data
