#include "data/data_loader.h"

#include <limits>
#include <numeric>

#include "core/check.h"
#include "core/rng.h"

namespace data {

DataLoader::DataLoader(const LoaderOptions& options) : options_(options) {
  const LoaderOptions& o = options_;
  ENGINE_CHECK(o.world >= 1 && o.rank >= 0 && o.rank < o.world,
               "data loader: rank " + std::to_string(o.rank) + " is not in a world of " +
                   std::to_string(o.world));
  ENGINE_CHECK(o.batch_rows > 0 && o.grad_accum > 0,
               "data loader: batch_rows and grad_accum must be positive");
  ENGINE_CHECK(o.batch_rows % (o.world * o.grad_accum) == 0,
               "data loader: batch_rows " + std::to_string(o.batch_rows) +
                   " must be divisible by world size " + std::to_string(o.world) +
                   " x grad_accum " + std::to_string(o.grad_accum));
  micro_rows_ = o.batch_rows / (o.world * o.grad_accum);
  shards_ = std::make_unique<ShardSet>(o.pattern, o.seq_len, o.vocab_size,
                                       o.shard_whole_batches ? o.batch_rows : 0);
  ENGINE_CHECK(shards_->num_sequences() <= std::numeric_limits<uint32_t>::max(),
               "data loader: more than 2^32 sequences in '" + o.pattern + "'");
  // Chain every input of the order through the RNG's mixer; never 0, which means "unchecked".
  uint64_t f = core::rng_hash(0x5eed, static_cast<uint64_t>(o.seq_len));
  f = core::rng_hash(f, static_cast<uint64_t>(o.batch_rows));
  f = core::rng_hash(f, o.shuffle ? 1 : 0);
  // Hashed only when on: the fingerprints of checkpoints written before the option stay valid.
  if (o.shard_whole_batches) f = core::rng_hash(f, 2);
  for (int64_t i = 0; i < shards_->num_shards(); ++i) {
    f = core::rng_hash(f, static_cast<uint64_t>(shards_->shard(i).num_tokens));
  }
  fingerprint_ = f == 0 ? 1 : f;
}

std::vector<OrderKey> DataLoader::order_keys() const {
  return {{"seq_len", std::to_string(options_.seq_len), "seq_len ", ""},
          {"batch_rows", std::to_string(options_.batch_rows), "", " sequences per step"},
          {"shuffle", options_.shuffle ? "on" : "off", "shuffle ", ""}};
}

int64_t DataLoader::epoch_of(int64_t step) const {
  return step * options_.batch_rows / sequences_per_epoch();
}

const std::vector<uint32_t>& DataLoader::permutation(int64_t epoch) const {
  const size_t slot = static_cast<size_t>(epoch % 2);
  if (cached_epoch_[slot] != epoch) {
    std::vector<uint32_t>& perm = cached_perm_[slot];
    perm.resize(static_cast<size_t>(sequences_per_epoch()));
    std::iota(perm.begin(), perm.end(), 0u);
    core::Rng rng(core::rng_hash(options_.seed, static_cast<uint64_t>(epoch)));
    for (size_t i = perm.size(); i > 1; --i) {
      std::swap(perm[i - 1], perm[rng.next_below(i)]);
    }
    cached_epoch_[slot] = epoch;
  }
  return cached_perm_[slot];
}

int64_t DataLoader::sequence_at(int64_t step, int64_t row) const {
  ENGINE_CHECK(
      step >= 0 && row >= 0 && row < options_.batch_rows,
      "data loader: bad (step " + std::to_string(step) + ", row " + std::to_string(row) + ")");
  const int64_t s = sequences_per_epoch();
  const int64_t counter = step * options_.batch_rows + row;
  const int64_t epoch = counter / s;
  const int64_t i = counter % s;
  return options_.shuffle ? permutation(epoch)[static_cast<size_t>(i)] : i;
}

void DataLoader::load(int64_t step, int64_t micro_step, Batch& out) const {
  ENGINE_CHECK(micro_step >= 0 && micro_step < options_.grad_accum,
               "data loader: micro_step " + std::to_string(micro_step) + " not in [0, " +
                   std::to_string(options_.grad_accum) + ")");
  const int64_t t = options_.seq_len;
  out.resize(micro_rows_, t);
  const int64_t first =
      options_.rank * (options_.batch_rows / options_.world) + micro_step * micro_rows_;
  for (int64_t r = 0; r < micro_rows_; ++r) {
    const int64_t seq = sequence_at(step, first + r);
    out.sequences[r] = seq;
    shards_->read_sequence(seq, out.inputs.data() + r * t, out.targets.data() + r * t);
  }
}

void DataLoader::next(Batch& out) {
  load(step_, micro_step_, out);
  if (++micro_step_ == options_.grad_accum) {
    micro_step_ = 0;
    ++step_;
  }
}

void DataLoader::restore(const LoaderState& state) {
  ENGINE_CHECK(state.seed == options_.seed,
               "data loader: checkpoint seed " + std::to_string(state.seed) +
                   " differs from the configured seed " + std::to_string(options_.seed));
  ENGINE_CHECK(state.fingerprint == 0 || state.fingerprint == fingerprint_,
               "data loader: the checkpoint was taken over different data or batch shape (shard "
               "token counts of '" +
                   options_.pattern +
                   "', seq_len, batch_rows or shuffle differ): resuming would not see the same "
                   "batches");
  ENGINE_CHECK(state.step >= 0 && state.micro_step >= 0 && state.micro_step < options_.grad_accum,
               "data loader: bad checkpoint position step " + std::to_string(state.step) +
                   " micro_step " + std::to_string(state.micro_step));
  step_ = state.step;
  micro_step_ = state.micro_step;
}

}  // namespace data
