// Seeded random inputs shared by the backend op tests (CPU ops, CUDA against the CPU).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace test_data {

// n normal draws of the counter-based generator (seed, index), times scale.
inline std::vector<float> random_vector(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[static_cast<size_t>(i)] =
        scale * static_cast<float>(core::rng_normal(seed, static_cast<uint64_t>(i)));
  return v;
}

// Random OSFT factors of a target [n, m] with k frozen and r = min(n, m) - k trained directions.
struct OsftFactors {
  int64_t n, m, k, r;
  std::vector<float> u_high, s_high, v_high, u_low, s_low, v_low;
  OsftFactors(int64_t n_, int64_t m_, int64_t k_, uint64_t seed) : n(n_), m(m_), k(k_) {
    r = std::min(n, m) - k;
    u_high = random_vector(n * k, seed, 0.3f);
    s_high = random_vector(k, seed + 1);
    v_high = random_vector(k * m, seed + 2, 0.3f);
    u_low = random_vector(n * r, seed + 3, 0.3f);
    s_low = random_vector(r, seed + 4);
    v_low = random_vector(r * m, seed + 5, 0.3f);
  }
};

}  // namespace test_data
