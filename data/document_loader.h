// The BOS-aligned packing loader of modded-nanogpt's record #89 (train_gpt.py at f411b3d3,
// Shard.next_batch and distributed_data_generator with align_to_bos): every rank's micro-batch is
// one row of T tokens packed from whole documents, each starting with its BOS token.
//
// Documents: the stretches of a shard from one BOS token to the next (the last to the shard's
// end), in file order; tokens before a shard's first BOS are never read. A row of T inputs takes
// T+1 tokens: documents in order, each truncated to the stage's max_doc_tokens, the last one cut
// where the row is full; what a truncation or the cut leaves of a document is skipped (the next
// row starts at the next document). Inputs are buf[0, T), targets buf[1, T+1): the target of a
// document's last input is the next document's BOS.
//
// Rows: a step of a stage has `rows` rows (its tokens / T), one per rank per micro-step: row
// g = micro_step * world + rank (the record's order: each micro-step, ranks 0..W-1 take
// consecutive documents), so the global batch of a step is the same at every world size. All the
// rows of a step come from one shard: a step that would run past a shard's last document starts
// over at the next shard's first, and what was left of the shard is skipped. (The record does so
// per call of its generator, W rows; on its 8 GPUs a call is a step. On one GPU the record
// re-reads at a shard's end per micro-step; the engine keeps the 8-GPU order at every world
// size.) After the last shard the first comes again (the record stops there).
//
// Document boundaries: cu_seqlens[0] = 0, cu_seqlens[i] = the end of document i within the
// inputs (the cut document ends at T; it is a document of 0 inputs when only its BOS was the
// last target), then T to max_docs entries. A row of more than max_docs - 1 documents is an
// error, as in the record (its tensor copy fails there), naming the step, row and counts.
//
// Bigram hash (table_rows > 0): data::bigram_hash over each row's inputs, into Batch::bigram.
//
// Positions are a pure function of the step: the loader replays the document walk from step 0
// (document boundaries only, no token reads) and caches where each step starts, so a run resumed
// at step s reads exactly what the uninterrupted run read. The BOS index of a shard is read once,
// when the walk first enters it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/batch.h"
#include "data/data_loader.h"
#include "data/shard_set.h"
#include "data/train_loader.h"

namespace data {

// The record's BOS token (<|endoftext|>).
inline constexpr int32_t kDocumentBos = 50256;

// One batch stage of the loader, from begin_step to the next stage's begin_step.
struct DocumentStage {
  int64_t begin_step = 0;
  int64_t row_tokens = 0;      // T: inputs of one row (one rank, one micro-step)
  int64_t rows = 0;            // rows per step, all ranks and micro-steps
  int64_t max_doc_tokens = 0;  // a document is truncated to this many tokens
  int64_t max_docs = 0;        // cu_seqlens entries per row (at most max_docs - 1 documents)
};

// The record's TRAIN_MAX_NUM_DOCS: 64 / 96 / 128 for its rows of 16384 / 32768 / 49152 tokens,
// else the next multiple of 128 of T / 300.
int64_t record_max_docs(int64_t row_tokens);

struct DocumentLoaderOptions {
  std::string pattern;                // glob of token shards
  std::vector<DocumentStage> stages;  // by begin_step; the first begins at 0
  int rank = 0;
  int world = 1;
  uint64_t seed = 0;  // checked on restore; the order does not depend on it (the record's has none)
  int64_t vocab_size = 50257;
  int32_t bos = kDocumentBos;
  int64_t bigram_table_rows = 0;  // > 0: fill Batch::bigram (the record: 377280)
};

class DocumentLoader : public TrainLoader {
 public:
  explicit DocumentLoader(const DocumentLoaderOptions& options);
  ~DocumentLoader() override;

  const DocumentLoaderOptions& options() const { return options_; }
  const ShardSet& shards() const override { return *shards_; }
  const std::string& pattern() const override { return options_.pattern; }
  uint64_t fingerprint() const override { return fingerprint_; }
  std::vector<OrderKey> order_keys() const override;
  // The stage of `step` and the micro-steps of its steps on each rank (rows / world).
  const DocumentStage& stage_of(int64_t step) const;
  int64_t micro_steps(int64_t step) const override;

  // Fills `out` with this rank's row of (step, micro_step): rows 1, seq_len T, inputs, targets,
  // cu_seqlens (max_docs entries), bigram (when on), and sequences[0] = the position of the
  // row's first token in the shards laid end to end. Pure in its arguments; not thread-safe (it
  // extends the cache of step starts).
  void load(int64_t step, int64_t micro_step, Batch& out) const override;

  // Sequential use and checkpoints, as DataLoader.
  void next(Batch& out);
  LoaderState state() const { return {options_.seed, step_, micro_step_, fingerprint_}; }
  void restore(const LoaderState& state);

 private:
  struct Cursor {
    int64_t shard = 0;
    int64_t doc = 0;  // index into the shard's BOS index
  };
  // One row's documents: [start, end) token ranges in the cursor's shard.
  struct Piece {
    int64_t start = 0;
    int64_t end = 0;
  };

  const std::vector<int64_t>& bos_index(int64_t shard) const;
  // Walks one row of `stage` from `at` (in one shard): its pieces; false when the shard's
  // documents run out first.
  bool walk_row(const DocumentStage& stage, Cursor& at, std::vector<Piece>* pieces) const;
  // Where step `step` starts: its shard (moved on past shards too short for the step) and
  // document.
  Cursor step_start(int64_t step) const;

  DocumentLoaderOptions options_;
  std::unique_ptr<ShardSet> shards_;
  int64_t step_ = 0;
  int64_t micro_step_ = 0;
  uint64_t fingerprint_ = 0;
  mutable std::vector<std::unique_ptr<std::vector<int64_t>>> bos_;  // per shard, read lazily
  mutable std::vector<Cursor> starts_;  // starts_[s]: where step s starts (cached walk)
};

}  // namespace data
