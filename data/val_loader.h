// The validation loader: the first `val_tokens / seq_len` sequences of the shards, in file order,
// read in steps of batch_rows sequences; rank r of W reads rows [r*L, (r+1)*L), L = batch_rows/W,
// of every step. Every evaluation reads the same tokens, so validation losses are comparable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "data/batch.h"
#include "data/shard_set.h"

namespace data {

struct ValOptions {
  std::string pattern;
  int64_t seq_len = 0;
  int64_t batch_rows = 0;  // global sequences per validation step
  int64_t val_tokens = 0;  // tokens per evaluation; a multiple of batch_rows * seq_len; 0 = as
                           // many whole steps as the shards hold
  int rank = 0;
  int world = 1;
  int64_t vocab_size = 50257;
};

class ValLoader {
 public:
  explicit ValLoader(const ValOptions& options);

  const ShardSet& shards() const { return *shards_; }
  int64_t num_steps() const { return num_steps_; }
  int64_t local_rows() const { return options_.batch_rows / options_.world; }
  int64_t tokens() const { return num_steps_ * options_.batch_rows * options_.seq_len; }
  // This rank's rows of validation step `step` in [0, num_steps()).
  void load(int64_t step, Batch& out) const;

 private:
  ValOptions options_;
  std::unique_ptr<ShardSet> shards_;
  int64_t num_steps_ = 0;
};

}  // namespace data
