#include "data/val_loader.h"

#include "core/check.h"

namespace data {

ValLoader::ValLoader(const ValOptions& options) : options_(options) {
  const ValOptions& o = options_;
  ENGINE_CHECK(o.world >= 1 && o.rank >= 0 && o.rank < o.world,
               "val loader: rank " + std::to_string(o.rank) + " is not in a world of " +
                   std::to_string(o.world));
  ENGINE_CHECK(o.batch_rows > 0 && o.batch_rows % o.world == 0,
               "val loader: batch_rows " + std::to_string(o.batch_rows) +
                   " must be a positive multiple of world size " + std::to_string(o.world));
  ENGINE_CHECK(o.val_tokens >= 0, "val loader: val_tokens must not be negative");
  shards_ = std::make_unique<ShardSet>(o.pattern, o.seq_len, o.vocab_size);
  const int64_t step_tokens = o.batch_rows * o.seq_len;
  if (o.val_tokens == 0) {
    num_steps_ = shards_->num_sequences() / o.batch_rows;
    ENGINE_CHECK(num_steps_ > 0, "val loader: '" + o.pattern + "' holds " +
                                     std::to_string(shards_->num_sequences()) +
                                     " sequences, fewer than one batch of " +
                                     std::to_string(o.batch_rows));
  } else {
    ENGINE_CHECK(o.val_tokens % step_tokens == 0,
                 "val loader: val_tokens " + std::to_string(o.val_tokens) +
                     " is not a multiple of batch_rows x seq_len = " + std::to_string(step_tokens));
    num_steps_ = o.val_tokens / step_tokens;
    ENGINE_CHECK(num_steps_ * o.batch_rows <= shards_->num_sequences(),
                 "val loader: val_tokens " + std::to_string(o.val_tokens) + " needs " +
                     std::to_string(num_steps_ * o.batch_rows) + " sequences but '" + o.pattern +
                     "' holds only " + std::to_string(shards_->num_sequences()));
  }
}

void ValLoader::load(int64_t step, Batch& out) const {
  ENGINE_CHECK(step >= 0 && step < num_steps_, "val loader: step " + std::to_string(step) +
                                                   " not in [0, " + std::to_string(num_steps_) +
                                                   ")");
  const int64_t t = options_.seq_len;
  const int64_t rows = local_rows();
  out.resize(rows, t);
  const int64_t first = step * options_.batch_rows + options_.rank * rows;
  for (int64_t r = 0; r < rows; ++r) {
    out.sequences[r] = first + r;
    shards_->read_sequence(first + r, out.inputs.data() + r * t, out.targets.data() + r * t);
  }
}

}  // namespace data
