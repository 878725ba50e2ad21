// Rounding f32 values to bf16 on the CPU, the rounding of kmath::bf16_from_float bit for bit:
// with AVX512_BF16's vcvtne2ps2bf16 where the CPU has it, in software elsewhere. The instruction
// rounds like kmath (nearest, ties to even; infinities kept; NaN quieted with its sign) except that
// it flushes subnormal inputs to zero, so a group of 32 that holds a subnormal is rounded in
// software. The kernels that store bf16 activations (RowStore, elementwise_store) round through
// round_to_bf16; RowLoad widens a stored bf16 row for the kernels that read one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/cpu/parallel_loops.h"
#include "core/device.h"
#include "core/kernel_math.h"

namespace core::cpu {

// out[i] = kmath::bf16_from_float(in[i]) for i < n, on this thread.
void round_to_bf16(bf16* out, const float* in, int64_t n);
// The two paths, for tests: software always; avx512 only where round_to_bf16_has_avx512().
void round_to_bf16_software(bf16* out, const float* in, int64_t n);
void round_to_bf16_avx512(bf16* out, const float* in, int64_t n);
// Whether this CPU runs vcvtne2ps2bf16 (cpuid and XCR0) and ENGINE_CPU_NO_BF16 is not 1: the
// path round_to_bf16 takes, decided at its first call.
bool round_to_bf16_has_avx512();

// A stored value as the kernels compute with it: bf16 widened exactly (to float), T as it is.
template <typename T, typename G>
T widen(G x) {
  if constexpr (std::is_same_v<G, bf16>) {
    return T(kmath::float_from_bf16(x));
  } else {
    return T(x);
  }
}

// One output row of a kernel that computes in T and stores Out: row() is where the kernel writes
// the row's C values; commit() stores them. For Out = T that is the output row itself; for
// Out = bf16 (T = float) a per-thread float row that commit() rounds into the output, so the
// values are computed by the same code in both cases and the bf16 row is the f32 row rounded.
template <typename T, typename Out>
class RowStore {
 public:
  RowStore(Out* out, int64_t C) : out_(out), C_(C) {
    if constexpr (!std::is_same_v<Out, T>) {
      static_assert(std::is_same_v<Out, bf16> && std::is_same_v<T, float>,
                    "rows are stored as computed, or rounded from float to bf16");
      thread_local std::vector<float> buffer;
      if (static_cast<int64_t>(buffer.size()) < C) buffer.resize(static_cast<size_t>(C));
      row_ = buffer.data();
    } else {
      row_ = out;
    }
  }
  T* row() const { return row_; }
  void commit() const {
    if constexpr (!std::is_same_v<Out, T>) round_to_bf16(out_, row_, C_);
  }

 private:
  Out* out_;
  int64_t C_;
  T* row_;
};

// One input row of a kernel that computes in T from rows stored as In: row() is the row's C
// values as T. For In = T the row itself; for In = bf16 (T = float) the row widened exactly into a
// per-thread float row (one live RowLoad per thread: bf16 precision's residual stream, read by
// the norms).
template <typename T, typename In>
class RowLoad {
 public:
  RowLoad(const In* in, int64_t C) {
    if constexpr (!std::is_same_v<In, T>) {
      static_assert(std::is_same_v<In, bf16> && std::is_same_v<T, float>,
                    "rows are read as stored, or widened from bf16 to float");
      thread_local std::vector<float> buffer;
      if (static_cast<int64_t>(buffer.size()) < C) buffer.resize(static_cast<size_t>(C));
      for (int64_t c = 0; c < C; ++c)
        buffer[c] = kmath::float_from_bf16(in[c]);
      row_ = buffer.data();
    } else {
      row_ = in;
    }
  }
  const T* row() const { return row_; }

 private:
  const T* row_;
};

// out[i] = value(i) for i < n in parallel: elementwise() when Out is T; in blocks of kStoreBlock
// computed into a float buffer and rounded to bf16 when Out is bf16.
inline constexpr int64_t kStoreBlock = 512;
template <typename T, typename Out, typename ValueFn>
void elementwise_store(Out* out, int64_t n, ValueFn value) {
  if constexpr (std::is_same_v<Out, T>) {
    elementwise<T>(n, [=](int64_t i) { out[i] = value(i); });
  } else {
    static_assert(std::is_same_v<Out, bf16> && std::is_same_v<T, float>,
                  "values are stored as computed, or rounded from float to bf16");
    const int64_t blocks = (n + kStoreBlock - 1) / kStoreBlock;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      float buffer[kStoreBlock];
      const int64_t i0 = blk * kStoreBlock, m = std::min(kStoreBlock, n - i0);
#pragma omp simd
      for (int64_t i = 0; i < m; ++i)
        buffer[i] = value(i0 + i);
      round_to_bf16(out + i0, buffer, m);
    }
  }
}

}  // namespace core::cpu
