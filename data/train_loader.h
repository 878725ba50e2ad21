// What the trainer and the checkpoints need of a training loader: the rows of (step,
// micro-step) for this rank, a pure function of the step, and what the order depends on.
// DataLoader (fixed-length sequences) and DocumentLoader (BOS-aligned document rows in stages)
// are the two.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/shard_set.h"

namespace data {

// One thing the order depends on, as a checkpoint records it (manifest key "data." + name) and
// as a message reads it: before + value + after ("seq_len 32", "16 sequences per step").
struct OrderKey {
  std::string name;
  std::string value;
  std::string before;
  std::string after;
};

class TrainLoader {
 public:
  virtual ~TrainLoader() = default;
  // Micro-steps of `step` on each rank.
  virtual int64_t micro_steps(int64_t step) const = 0;
  // This rank's rows of (step, micro_step).
  virtual void load(int64_t step, int64_t micro_step, Batch& out) const = 0;
  virtual const ShardSet& shards() const = 0;
  virtual const std::string& pattern() const = 0;
  // A hash of everything the order depends on (never 0), and those things by name, for a
  // checkpoint's manifest and the message that refuses a resume over other data.
  virtual uint64_t fingerprint() const = 0;
  virtual std::vector<OrderKey> order_keys() const = 0;
};

}  // namespace data
