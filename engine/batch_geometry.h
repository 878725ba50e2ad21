// Batch geometry: how a step's global batch of train.batch_tokens splits over the ranks and
// micro-steps, and how many validation sequences a rank takes per forward; and the loaders that
// serve them. The global batch is train.batch_tokens whatever the world size, so np 1, 2, 4 take
// the same steps up to floating-point summation order.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/config.h"

namespace data {
class TrainLoader;
class ValLoader;
}  // namespace data

namespace engine {

// Micro-steps per optimizer step beyond which a batch plan is refused as absurd.
inline constexpr int64_t kMaxMicroSteps = 4096;

struct BatchGeometry {
  int64_t seq_len = 0;
  int64_t batch_rows = 0;     // sequences per step, all ranks
  int64_t rows_per_rank = 0;  // batch_rows / world
  int64_t grad_accum = 1;     // micro-steps per step: the fewest of at most train.micro_batch rows
  int64_t micro_rows = 0;     // sequences per micro-step on a rank (rows_per_rank / grad_accum)
  int64_t val_seqs = 0;       // validation sequences per evaluation, all ranks
  int64_t val_rows = 0;       // validation sequences per rank per forward (at most micro_rows)

  // The geometry of `config` over `world` ranks; a batch or validation size that does not
  // divide over the ranks, or a plan of more than kMaxMicroSteps micro-steps, is refused naming
  // the key and the numbers.
  static BatchGeometry of(const Config& config, int world);
};

// The training loader of rank `rank` of `world` (each rank's rows of every step's global batch,
// a pure function of the seed and the step): with train.stages the BOS-aligned document loader
// in the stages' rows (one a rank a micro-step; train.stages.rows must divide over the ranks),
// else fixed-length sequences; a training set smaller than one batch is refused naming
// data.train.
std::unique_ptr<data::TrainLoader> make_train_loader(const Config& config,
                                                     const BatchGeometry& geometry, int rank,
                                                     int world);
// The validation loader of rank `rank` of `world`: val_seqs sequences in forwards of val_rows.
std::unique_ptr<data::ValLoader> make_val_loader(const Config& config,
                                                 const BatchGeometry& geometry, int rank,
                                                 int world);

}  // namespace engine
