// Counter-based random numbers: element i of a stream is a pure function of (seed, i).
//
// The same seed gives the same numbers on every machine and however a tensor is split: a rank
// that owns rows [r0, r1) of a parameter fills exactly the values one rank would put there,
// which is what makes sharded initialisation equal to single-rank initialisation.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace core {

// 64-bit mix of (seed, counter) (splitmix64 finaliser over a Weyl step); statistically strong
// enough for initialisation and shuffles, and exactly reproducible.
uint64_t rng_hash(uint64_t seed, uint64_t counter);
// Uniform in [0, 1) with 53 random bits.
double rng_uniform(uint64_t seed, uint64_t counter);
// Standard normal via Box-Muller on the counters 2i and 2i+1.
double rng_normal(uint64_t seed, uint64_t counter);

// Host f32 fills. `first` is the stream index of the tensor's first element, so a shard can be
// filled as part of a larger tensor.
void fill_normal(const Tensor& t, uint64_t seed, float mean, float stddev, uint64_t first = 0);
void fill_uniform(const Tensor& t, uint64_t seed, float low, float high, uint64_t first = 0);

// A sequential generator for shuffles and sampling; its whole state is (seed, position) so it
// checkpoints as two integers.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0, uint64_t position = 0) : seed_(seed), position_(position) {}
  uint64_t next_u64() { return rng_hash(seed_, position_++); }
  double next_uniform() { return rng_uniform(seed_, position_++); }
  // Uniform integer in [0, n), unbiased (rejection sampling).
  uint64_t next_below(uint64_t n);
  uint64_t seed() const { return seed_; }
  uint64_t position() const { return position_; }

 private:
  uint64_t seed_;
  uint64_t position_;
};

}  // namespace core
