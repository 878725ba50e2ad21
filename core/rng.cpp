#include "core/rng.h"

#include <cmath>
#include <numbers>

#include "core/check.h"

namespace core {

uint64_t rng_hash(uint64_t seed, uint64_t counter) {
  uint64_t z = seed * 0xD1B54A32D192ED03ull + (counter + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double rng_uniform(uint64_t seed, uint64_t counter) {
  return static_cast<double>(rng_hash(seed, counter) >> 11) * 0x1.0p-53;
}

double rng_normal(uint64_t seed, uint64_t counter) {
  // Box-Muller: u1 in (0, 1] so the log is finite; the pair's cosine branch only.
  double u1 = 1.0 - rng_uniform(seed, 2 * counter);
  double u2 = rng_uniform(seed, 2 * counter + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

void fill_normal(const Tensor& t, uint64_t seed, float mean, float stddev, uint64_t first) {
  ENGINE_CHECK(t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous(),
               "fill_normal needs a contiguous host f32 tensor, got " + t.str());
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    p[i] = static_cast<float>(mean + stddev * rng_normal(seed, first + i));
  }
}

void fill_uniform(const Tensor& t, uint64_t seed, float low, float high, uint64_t first) {
  ENGINE_CHECK(t.device().is_cpu() && t.dtype() == DType::F32 && t.is_contiguous(),
               "fill_uniform needs a contiguous host f32 tensor, got " + t.str());
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    p[i] = static_cast<float>(low + (high - low) * rng_uniform(seed, first + i));
  }
}

uint64_t Rng::next_below(uint64_t n) {
  ENGINE_CHECK(n > 0, "Rng::next_below(0)");
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = next_u64();
  } while (x >= limit);
  return x % n;
}

}  // namespace core
