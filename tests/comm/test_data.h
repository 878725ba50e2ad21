// Seeded test data every rank can recompute for every other rank: small integers stored as
// floats, so sums in any order are exact and a serial reference must match bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace comm_test {

// Element i of stream (seed, stream): an integer in [-16, 16].
inline float value(uint64_t seed, uint64_t stream, int64_t i) {
  return static_cast<float>(core::rng_hash(seed * 1000003u + stream, static_cast<uint64_t>(i)) %
                            33) -
         16.0f;
}

inline std::vector<float> values(uint64_t seed, uint64_t stream, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[i] = value(seed, stream, i);
  return out;
}

// A size in [0, max] from (seed, stream), zero about one time in five.
inline int64_t random_count(uint64_t seed, uint64_t stream, int64_t max) {
  uint64_t h = core::rng_hash(seed, 7777 + stream);
  if (h % 5 == 0) return 0;
  return static_cast<int64_t>((h >> 8) % static_cast<uint64_t>(max + 1));
}

}  // namespace comm_test
