#include "core/cpu/bf16_rounding.h"

#include <cstdlib>
#include <string>

#include "core/check.h"
#include "core/cpu/cpu_isa.h"
#include "core/kernel_math.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace core::cpu {

void round_to_bf16_software(bf16* out, const float* in, int64_t n) {
  bf16* __restrict o = out;
  const float* __restrict x = in;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i)
    o[i] = kmath::bf16_from_float(x[i]);
}

bool round_to_bf16_has_avx512() {
  static const bool has = [] {
    return detect_cpu_bf16_isa().avx512_bf16 && !cpu_no_bf16_requested();
  }();
  return has;
}

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void round_to_bf16_avx512(bf16* out,
                                                                                 const float* in,
                                                                                 int64_t n) {
  const __m512i exponent = _mm512_set1_epi32(0x7F800000);
  const __m512i mantissa = _mm512_set1_epi32(0x007FFFFF);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 lo = _mm512_loadu_ps(in + i), hi = _mm512_loadu_ps(in + i + 16);
    // Subnormals (exponent bits zero, mantissa not): the instruction flushes them to zero.
    const __m512i lo_bits = _mm512_castps_si512(lo), hi_bits = _mm512_castps_si512(hi);
    const __mmask16 sub_lo =
        _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(lo_bits, exponent), lo_bits, mantissa);
    const __mmask16 sub_hi =
        _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(hi_bits, exponent), hi_bits, mantissa);
    if ((sub_lo | sub_hi) != 0) {
      round_to_bf16_software(out + i, in + i, 32);
      continue;
    }
    const __m512bh rounded = _mm512_cvtne2ps_pbh(hi, lo);  // lo in the lower half
    _mm512_storeu_si512(out + i, reinterpret_cast<const __m512i&>(rounded));
  }
  round_to_bf16_software(out + i, in + i, n - i);
}
#else
void round_to_bf16_avx512(bf16*, const float*, int64_t) {
  ENGINE_CHECK(false, "round_to_bf16_avx512: not an x86-64 build");
}
#endif

void round_to_bf16(bf16* out, const float* in, int64_t n) {
  if (round_to_bf16_has_avx512()) {
    round_to_bf16_avx512(out, in, n);
  } else {
    round_to_bf16_software(out, in, n);
  }
}

}  // namespace core::cpu
