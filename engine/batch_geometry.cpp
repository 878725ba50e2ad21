#include "engine/batch_geometry.h"

#include <algorithm>
#include <string>

#include "core/check.h"
#include "data/data_loader.h"
#include "data/document_loader.h"
#include "data/val_loader.h"
#include "engine/stage_schedule.h"

namespace engine {

namespace {

// Largest divisor of n that is <= cap (>= 1).
int64_t largest_divisor_at_most(int64_t n, int64_t cap) {
  for (int64_t d = std::min(n, cap); d > 1; --d)
    if (n % d == 0) return d;
  return 1;
}

}  // namespace

BatchGeometry BatchGeometry::of(const Config& config, int world) {
  // Each refusal names where its key was set: the YAML file and line, or the --set argument.
  const std::string batch_origin = config_origin(config, "train.batch_tokens");
  BatchGeometry g;
  g.seq_len = config.model.seq_len;
  g.batch_rows = config.train.batch_tokens / g.seq_len;
  ENGINE_CHECK(g.batch_rows % world == 0,
               "config error: " + batch_origin + ": key 'train.batch_tokens' = " +
                   std::to_string(config.train.batch_tokens) + " gives " +
                   std::to_string(g.batch_rows) + " sequences per step, not divisible by the " +
                   "world size " + std::to_string(world));
  g.rows_per_rank = g.batch_rows / world;
  g.grad_accum = (g.rows_per_rank + config.train.micro_batch - 1) / config.train.micro_batch;
  // A plan this far beyond any real batch is a typo (a step would run for hours with no line
  // printed): refused at once with its numbers.
  ENGINE_CHECK(g.grad_accum <= kMaxMicroSteps,
               "config error: " + batch_origin +
                   ": key 'train.batch_tokens' = " + std::to_string(config.train.batch_tokens) +
                   " gives " + std::to_string(g.rows_per_rank) + " sequences per rank per step, " +
                   std::to_string(g.grad_accum) + " micro-steps of train.micro_batch = " +
                   std::to_string(config.train.micro_batch) + " (at most " +
                   std::to_string(kMaxMicroSteps) +
                   "): lower train.batch_tokens or raise train.micro_batch");
  while (g.rows_per_rank % g.grad_accum != 0)
    ++g.grad_accum;
  g.micro_rows = g.rows_per_rank / g.grad_accum;

  g.val_seqs = config.train.val_tokens / g.seq_len;
  ENGINE_CHECK(g.val_seqs % world == 0,
               "config error: " + config_origin(config, "train.val_tokens") +
                   ": key 'train.val_tokens' = " + std::to_string(config.train.val_tokens) +
                   " gives " + std::to_string(g.val_seqs) +
                   " sequences, not divisible by the world size " + std::to_string(world));
  g.val_rows = largest_divisor_at_most(g.val_seqs / world, g.micro_rows);
  return g;
}

std::unique_ptr<data::TrainLoader> make_train_loader(const Config& config,
                                                     const BatchGeometry& geometry, int rank,
                                                     int world) {
  const StageSchedule stages = StageSchedule::of(config);
  if (stages.enabled()) {
    ENGINE_CHECK(stages.rows() % world == 0,
                 "config error: " + config_origin(config, "train.stages.rows") +
                     ": key 'train.stages.rows' = " + std::to_string(stages.rows()) +
                     " rows per step do not divide over the world size " + std::to_string(world));
    data::DocumentLoaderOptions o;
    o.pattern = config.data.train;
    for (const TrainingStage& s : stages.stages())
      o.stages.push_back({s.begin_step, s.row_tokens, stages.rows(), s.max_doc_tokens, s.max_docs});
    o.rank = rank;
    o.world = world;
    o.seed = static_cast<uint64_t>(config.train.seed);
    o.vocab_size = config.model.vocab_size;
    o.bos = static_cast<int32_t>(config.data.bos);
    return std::make_unique<data::DocumentLoader>(o);
  }
  data::LoaderOptions lo;
  lo.pattern = config.data.train;
  lo.seq_len = geometry.seq_len;
  lo.batch_rows = geometry.batch_rows;
  lo.grad_accum = geometry.grad_accum;
  lo.rank = rank;
  lo.world = world;
  lo.seed = static_cast<uint64_t>(config.train.seed);
  lo.shuffle = config.data.shuffle;
  lo.shard_whole_batches = config.data.shard_whole_batches;
  lo.vocab_size = config.model.vocab_size;
  auto loader = std::make_unique<data::DataLoader>(lo);
  // Fewer sequences than one batch: every step would repeat the same data.
  ENGINE_CHECK(loader->sequences_per_epoch() >= geometry.batch_rows,
               "config error: " + config_origin(config, "data.train") + ": key 'data.train' = " +
                   config.data.train + " holds " + std::to_string(loader->sequences_per_epoch()) +
                   " sequences of " + std::to_string(geometry.seq_len) +
                   " tokens, fewer than one batch of " + std::to_string(geometry.batch_rows) +
                   " (train.batch_tokens = " + std::to_string(config.train.batch_tokens) + ")");
  return loader;
}

std::unique_ptr<data::ValLoader> make_val_loader(const Config& config,
                                                 const BatchGeometry& geometry, int rank,
                                                 int world) {
  data::ValOptions vo;
  vo.pattern = config.data.val;
  vo.seq_len = geometry.seq_len;
  vo.batch_rows = geometry.val_rows * world;
  vo.val_tokens = geometry.val_seqs * geometry.seq_len;
  vo.rank = rank;
  vo.world = world;
  vo.vocab_size = config.model.vocab_size;
  return std::make_unique<data::ValLoader>(vo);
}

}  // namespace engine
